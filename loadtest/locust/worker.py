"""Worker process entry: ``python -m loadtest.locust.worker --settings FILE --master-port P``."""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from loadtest.locust.runtime import worker_main  # noqa: E402
from loadtest.locust.settings import RunSettings  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.locust.worker")
    ap.add_argument("--settings", required=True, type=Path)
    ap.add_argument("--master-port", required=True, type=int)
    args = ap.parse_args()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master decides when a run stops
    return worker_main(RunSettings.read(args.settings), args.master_port)


if __name__ == "__main__":
    sys.exit(main())
