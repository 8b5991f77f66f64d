"""Generator memory over a long run: resident memory of `loadtest run` at 1k, 100k and 1M requests.

Runs the real CLI (one process, closed loop) against the embedded engine in speed-up mode with tiny
requests (8 prompt tokens, 1-2 output tokens), counts finished requests by following the record log
as it grows, and samples the generator's RSS (psutil) when each mark is passed. Then stops the run
with SIGINT (results are still written). Flat memory means histograms, not lists, and a streamed log.

    .venv/bin/python tests/bench/bench_memory.py [--marks 1000,100000,1000000] [--concurrency 32]
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--marks", default="1000,100000,1000000")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--speedup", type=float, default=1000.0)
    args = ap.parse_args()
    marks = [int(m) for m in args.marks.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        prof = Path(tmp) / "tiny.yaml"
        prof.write_text(
            json.dumps(
                {
                    "name": "tiny",
                    "input_tokens": {"dist": "fixed", "value": 8},
                    "output_tokens": {"dist": "uniform", "min": 1, "max": 2},
                    "system_prompt_tokens": 0,
                    "load": {"concurrency": args.concurrency},
                    "duration_s": 86400,
                }
            )
        )
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "loadtest.cli.main", "run", "--profile", str(prof), "--out", str(out)]
        cmd += ["--engine-speedup", str(args.speedup)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
                        f.seek(pos)
                        chunk = f.read(1 << 22)
                        if not chunk:
                            time.sleep(0.05)
                            if proc.poll() is not None:
                                return 1
                            continue
                        cut = chunk.rfind(b"\n") + 1
                        count += chunk.count(b"\n", 0, cut)
                        pos += cut
                    rss = gen.memory_info().rss / 2**20
                    elapsed = time.monotonic() - t0
                    label = f"{mark // 1_000_000}m" if mark >= 1_000_000 else f"{mark // 1000}k"
                    print(f"rss_mib_at_{label}: {rss:.1f} MiB", flush=True)
                    print(f"requests_per_s_to_{label}: {count / elapsed:.0f} req/s", flush=True)
            print(f"record_log_mib: {pos / 2**20:.0f} MiB", flush=True)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
