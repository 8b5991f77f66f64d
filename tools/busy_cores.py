#!/usr/bin/env python3
"""Run a command while one busy loop per core (each pinned to its core) keeps the machine loaded.

`python3 tools/busy_cores.py -- python3 dev.py test` runs the test suite the way a shared CI runner
sees it: every core already busy with another process. The loops run at the default priority, are
stopped by their process ids when the command ends (or is interrupted), and the command's exit code is
returned. `--cores 0,1` picks the cores (default: every core this process may use).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def _spin(core: int, parent: int) -> None:
    """The child's work: pin to ``core`` and spin until killed, or until its parent is gone."""
    os.sched_setaffinity(0, {core})
    while os.getppid() == parent:
        for _ in range(1_000_000):
            pass


def start_loops(cores: list[int]) -> list[int]:
    """One forked busy loop per core; their process ids."""
    pids, parent = [], os.getpid()
    for core in cores:
        pid = os.fork()
        if pid == 0:  # the child never returns
            try:
                _spin(core, parent)
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def stop_loops(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", help="comma-separated core numbers (default: every usable core)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    cores = [int(c) for c in args.cores.split(",")] if args.cores else sorted(os.sched_getaffinity(0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the loops are stopped on the way out
    pids = start_loops(cores)
    print(f"busy_cores: a busy loop on each of cores {cores} (pids {pids})", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        stop_loops(pids)
        print(f"busy_cores: loops stopped after {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
