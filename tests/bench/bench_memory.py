"""Generator memory over a long run: resident memory of `loadtest run` at 1k, 100k and 1M requests.

Runs the real CLI (one process, closed loop) against the embedded engine in speed-up mode with tiny
requests (8 prompt tokens, 1-2 output tokens), counts finished requests by following the record log
as it grows, and samples the generator's RSS (psutil) when each mark is passed. Then stops the run
with SIGINT (results are still written). Flat memory means histograms, not lists, and a streamed log.

    .venv/bin/python tests/bench/bench_memory.py [--marks 1000,100000,1000000] [--concurrency 32]

``--minutes M --rate R`` instead runs open loop at R requests/s for M minutes and prints the RSS, open
file descriptors and requests finished every ``--sample-min`` minutes, then the growth since the first
sample: the long-run check that nothing accumulates.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def _start_run(tmp: str, load: dict[str, float], duration_s: float, speedup: float) -> subprocess.Popen:
    """`loadtest run` of tiny requests (8 prompt tokens, 1-2 output tokens) against the engine at ``speedup``."""
    prof = Path(tmp) / "tiny.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "tiny",
                "input_tokens": {"dist": "fixed", "value": 8},
                "output_tokens": {"dist": "uniform", "min": 1, "max": 2},
                "system_prompt_tokens": 0,
                "load": load,
                "duration_s": duration_s,
            }
        )
    )
    out = Path(tmp) / "run"
    cmd = [sys.executable, "-m", "loadtest.cli.main", "run", "--profile", str(prof), "--out", str(out)]
    cmd += ["--engine-speedup", str(speedup)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT (the run still writes its results), then SIGKILL if it does not end in 2 minutes."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--marks", default="1000,100000,1000000")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--speedup", type=float, default=1000.0)
    ap.add_argument("--minutes", type=float, default=0.0, help="timed open-loop mode: run this long")
    ap.add_argument("--rate", type=float, default=300.0, help="timed mode: requests/s (Poisson)")
    ap.add_argument("--sample-min", type=float, default=5.0, help="timed mode: minutes between samples")
    args = ap.parse_args()
    if args.minutes > 0:
        return timed(args)
    marks = [int(m) for m in args.marks.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        proc = _start_run(tmp, {"concurrency": args.concurrency}, 86400, args.speedup)
        out = Path(tmp) / "run"
        try:
            gen = psutil.Process(proc.pid)
            log = out / "records.jsonl"
            while not log.exists():
                if proc.poll() is not None:
                    print(proc.stderr.read().decode() if proc.stderr else "", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            count, pos, t0 = 0, 0, time.monotonic()
            with log.open("rb") as f:
                for mark in marks:
                    while count < mark:
                        n, pos = _count_lines(f, pos)
                        count += n
                        if not n:
                            time.sleep(0.05)
                            if proc.poll() is not None:
                                return 1
                    rss = gen.memory_info().rss / 2**20
                    elapsed = time.monotonic() - t0
                    label = f"{mark // 1_000_000}m" if mark >= 1_000_000 else f"{mark // 1000}k"
                    print(f"rss_mib_at_{label}: {rss:.1f} MiB", flush=True)
                    print(f"requests_per_s_to_{label}: {count / elapsed:.0f} req/s", flush=True)
            print(f"record_log_mib: {pos / 2**20:.0f} MiB", flush=True)
        finally:
            _stop(proc)
    return 0


def _count_lines(f: object, pos: int) -> tuple[int, int]:
    """Complete lines appended to the log since ``pos``: (count, new position)."""
    count = 0
    while True:
        f.seek(pos)  # type: ignore[attr-defined]
        chunk = f.read(1 << 22)  # type: ignore[attr-defined]
        if not chunk:
            return count, pos
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            return count, pos
        count += chunk.count(b"\n", 0, cut)
        pos += cut


def timed(args: argparse.Namespace) -> int:
    """Open loop at ``--rate`` for ``--minutes``; RSS, descriptors and progress every ``--sample-min``."""
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        proc = _start_run(tmp, {"rate": args.rate}, args.minutes * 60, args.speedup)
        out = Path(tmp) / "run"
        samples: list[tuple[float, float, int]] = []
        try:
            gen = psutil.Process(proc.pid)
            log = out / "records.jsonl"
            while not log.exists():
                if proc.poll() is not None:
                    print(proc.stderr.read().decode() if proc.stderr else "", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            t0, count, pos = time.monotonic(), 0, 0
            with log.open("rb") as f:
                k = 1
                while proc.poll() is None and k * args.sample_min < args.minutes:  # during the load only
                    due = t0 + k * args.sample_min * 60
                    while time.monotonic() < due and proc.poll() is None:
                        time.sleep(1.0)
                    if proc.poll() is not None:
                        break
                    n, pos = _count_lines(f, pos)
                    count += n
                    rss, fds = gen.memory_info().rss / 2**20, gen.num_fds()
                    minute = k * args.sample_min
                    samples.append((minute, rss, fds))
                    print(f"rss_mib_at_min_{minute:g}: {rss:.1f} MiB", flush=True)
                    print(f"open_fds_at_min_{minute:g}: {fds} fds", flush=True)
                    print(f"requests_done_at_min_{minute:g}: {count} requests", flush=True)
                    k += 1
            proc.wait(timeout=600)
            with log.open("rb") as whole:
                n, _ = _count_lines(whole, 0)
            print(f"requests_total: {n} requests", flush=True)
            print(f"generator_exit_code: {proc.returncode} code", flush=True)
        finally:
            _stop(proc)
        if len(samples) >= 2:
            print(f"rss_growth_mib_after_min_{samples[0][0]:g}: {samples[-1][1] - samples[0][1]:.1f} MiB")
            print(f"fd_growth_after_min_{samples[0][0]:g}: {samples[-1][2] - samples[0][2]} fds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
