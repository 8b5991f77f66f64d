"""Worker process entry: ``python -m loadtest.locust.worker --master-host H --master-port P [--local]``."""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from loadtest.locust.worker_session import worker_main  # noqa: E402
from loadtest.log_setup import configure_logging  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.locust.worker")
    ap.add_argument("--master-host", default="127.0.0.1")
    ap.add_argument("--master-port", required=True, type=int)
    ap.add_argument("--out", help="folder for this worker's own copy of its records")
    ap.add_argument(
        "--local",
        action="store_true",
        help="started by a master on this host: no local record copy, stop with the master, ignore Ctrl-C",
    )
    args = ap.parse_args()
    configure_logging()
    if args.local:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master decides when a run stops
        return worker_main(
            args.master_host,
            args.master_port,
            keep_local=False,
            parent_pid=os.getppid(),
            copy_in_run_dir=True,
        )
    return worker_main(args.master_host, args.master_port, out=args.out)


if __name__ == "__main__":
    sys.exit(main())
