"""Where a whole `loadtest run` spends its CPU on real framing: py-spy samples of the run process against
tests/bench/sse_server.py, printed as the top frames by own time and by total time.

    .venv/bin/python tests/bench/profile_run.py [batched|paced] [--framing chunked] [--seconds 10] [--top 25]
        [--tokens N] [--concurrency N]

py-spy (PyPI, in the project's ``bench`` extra) samples the process from outside at 250 Hz
(``--nonblocking``: the run is never paused). Each line is ``own% total% function (file:line)`` over
the samples taken while the run was under load.
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
