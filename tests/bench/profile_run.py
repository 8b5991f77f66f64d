"""Where a whole `loadtest run` spends its CPU on real framing: py-spy samples of the run process against
tests/bench/sse_server.py, printed as the top frames by own time and by total time.

    .venv/bin/python tests/bench/profile_run.py [batched|paced] [--framing chunked] [--seconds 10] [--top 25]
        [--tokens N] [--concurrency N] [--syscalls]

py-spy (PyPI, in the project's ``bench`` extra) samples the process from outside at 250 Hz
(``--nonblocking``: the run is never paused). Each line is ``own% total% function (file:line)`` over
the samples taken while the run was under load.

``--syscalls`` counts the run's system calls instead, with Linux perf's syscall tracepoints (``perf stat
-e syscalls:sys_enter_…`` for the calls a request's path can make: counted in the kernel, the run is not
slowed), and prints them per request finished in the window (``syscalls_<name>: x per request``) and
the requests each event-loop pass finished (per ``epoll_wait``). perf must be installed and allowed to
read tracepoints (root, or ``kernel.perf_event_paranoid`` at -1).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
CLIENT_CPU = "0"


def _profile(mode: str, tokens: int, streams: int | None) -> dict[str, object]:
    if streams is None:
        streams = 16 if mode == "batched" else 800  # paced: about half a core, as bench_run_capacity
    return {
        "name": "profile",
        "input_tokens": {"dist": "fixed", "value": 12},
        "output_tokens": {"dist": "fixed", "value": tokens},
        "system_prompt_tokens": 0,
        "load": {"concurrency": streams},
        "duration_s": 600,
    }


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` with the path cut to the package or library."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("/site-packages/", "/loadtest/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{name} ({where})"


def top_frames(raw: str, n: int) -> list[str]:
    """The ``n`` frames with the most own samples, and the ``n`` with the most total samples."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for row in raw.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        samples += k
        frames = [_frame_name(f) for f in stack.split(";") if f and not f.startswith("process ")]
        if not frames:
            continue
        own[frames[-1]] += k
        for f in set(frames):
            total[f] += k
    out = [f"samples: {samples}", "-- own time --"]
    out += [
        f"{own[f] / samples * 100:5.1f}% {total[f] / samples * 100:5.1f}% {f}" for f, _ in own.most_common(n)
    ]
    out.append("-- total time --")
    out += [f"{own[f] / samples * 100:5.1f}% {c / samples * 100:5.1f}% {f}" for f, c in total.most_common(n)]
    return out


# What a request's path can call: its send, its reads, the event loop's waits, the record's write, the
# stale-connection check, locks and clock reads (a few events: perf attaches at once; with every
# syscall tracepoint it takes seconds while requests finish uncounted)
SYSCALLS = (
    "sendto",
    "sendmsg",
    "write",
    "writev",
    "recvfrom",
    "recvmsg",
    "read",
    "poll",
    "ppoll",
    "select",
    "epoll_wait",
    "epoll_pwait",
    "epoll_ctl",
    "futex",
    "getpid",
    "clock_gettime",
    "fsync",
)
INTERVAL_S = 0.5  # perf's counting interval


def count_syscalls(pid: int, seconds: float, records: Path) -> list[str]:
    """``name: value unit`` lines: the system calls of process ``pid`` over about ``seconds``, per record
    line the run appended to ``records`` in the same time. perf prints its counts every ``INTERVAL_S``;
    the lines are counted as each interval is printed, and the first interval (perf attaching to the
    run's threads) is left out of both."""
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("--syscalls needs Linux perf (the linux-perf or linux-tools package) on PATH")
    events = ",".join(f"syscalls:sys_enter_{n}" for n in SYSCALLS)
    cmd = [perf, "stat", "-I", str(int(INTERVAL_S * 1000)), "-x,", "-e", events, "-p", str(pid)]
    proc = subprocess.Popen(
        [*cmd, "--", "sleep", str(seconds + INTERVAL_S)], stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    lines = _LineCount(records)
    stamps: list[tuple[str, int]] = []  # (interval's time, record lines when it was printed)
    counts: collections.Counter[str] = collections.Counter()
    errors = []
    for row in proc.stderr:
        fields = row.strip().split(",")
        if len(fields) < 4 or not fields[3].startswith("syscalls:sys_enter_"):
            errors.append(row.strip())
            continue
        if not stamps or stamps[-1][0] != fields[0]:
            stamps.append((fields[0], lines.now()))
        if len(stamps) > 1 and fields[1].isdigit():  # the first interval is left out
            counts[fields[3].removeprefix("syscalls:sys_enter_")] += int(fields[1])
    proc.wait()
    if not counts:
        raise SystemExit(
            f"perf counted no system calls ({' '.join(errors)[-300:]}): tracepoints need root or "
            "kernel.perf_event_paranoid at -1"
        )
    requests = stamps[-1][1] - stamps[0][1]
    if requests <= 0:
        raise SystemExit("no request finished in the window: is the server up?")
    window = float(stamps[-1][0]) - float(stamps[0][0])
    out = [f"requests_in_window: {requests} requests", f"window: {window:.2f} s"]
    out += [f"syscalls_{name}: {n / requests:.3f} per request" for name, n in counts.most_common() if n]
    out.append(f"syscalls_total: {sum(counts.values()) / requests:.3f} per request")
    if counts["epoll_wait"]:
        out.append(f"requests_per_epoll_wait: {requests / counts['epoll_wait']:.1f} requests")
    return out


class _LineCount:
    """The lines of a growing file, read on from where the last count stopped (each count reads only
    what was appended since: the bench stays light beside the server's core)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.lines = path, 0, 0

    def now(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    self.lines += chunk.count(b"\n")
                    self.offset += len(chunk)
        except FileNotFoundError:
            pass
        return self.lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("mode", choices=("batched", "paced"), nargs="?", default="batched")
    ap.add_argument("--framing", choices=("chunked", "coalesced", "content-length"), default="chunked")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--raw", type=Path, help="also keep py-spy's raw stacks in this file")
    ap.add_argument("--native", action="store_true", help="with the C frames (py-spy --native)")
    ap.add_argument("--tokens", type=int, help="content events per answer (batched 250, paced 49)")
    ap.add_argument("--concurrency", type=int, help="streams (batched 16, paced 800)")
    ap.add_argument("--syscalls", action="store_true", help="count system calls per request (Linux perf)")
    args = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    tokens = args.tokens or (250 if args.mode == "batched" else 49)
    extra = ["--tokens", str(tokens)] + (["--framing", args.framing] if args.mode == "batched" else [])
    with tempfile.TemporaryDirectory(prefix="profile-run-") as d, ServerProcess(args.mode, *extra) as srv:
        prof = Path(d) / "p.yaml"
        prof.write_text(json.dumps(_profile(args.mode, tokens, args.concurrency)))
        cmd = ["taskset", "-c", CLIENT_CPU, sys.executable, "-m", "loadtest.cli.main", "run"]
        cmd += [
            "--profile",
            str(prof),
            "--host",
            srv.base_url.removesuffix("/v1"),
            "--endpoint-check",
            "none",
        ]
        cmd += [
            "--model",
            "m-bench",
            "--out",
            str(Path(d) / "out"),
            "--generator-health",
            "warn",
            "--warmup",
            "0",
        ]
        gen = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(args.warmup)
            if args.syscalls:
                records = Path(d) / "out" / "records.jsonl"
                print("\n".join(count_syscalls(gen.pid, args.seconds, records)))
                return
            raw_file = Path(d) / "raw.txt"
            subprocess.run(
                [spy, "record", "-r", "250", "-d", str(int(args.seconds)), "-f", "raw"]
                + ["-o", str(raw_file), "-p", str(gen.pid)]
                # C frames need the process paused at each sample (py-spy refuses --nonblocking with them)
                + (["--native"] if args.native else ["--nonblocking"]),
                check=True,
                capture_output=True,
            )
            print("\n".join(top_frames(raw_file.read_text(), args.top)))
            if args.raw:
                args.raw.write_text(raw_file.read_text())
        finally:
            gen.send_signal(2)
            try:
                gen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                gen.kill()
                gen.wait()


if __name__ == "__main__":
    main()
