"""One host at MLPerf Offline size: a whole `loadtest run` holding thousands of open streams on one core.

The paced server (tests/bench/sse_server.py, pinned to CPU 1) answers every request in about
``--answer-s`` seconds (TTFT, then 49 tokens evenly spaced); the run (pinned to CPU 0, with
``--processes`` worker processes sharing that core) holds ``--streams`` closed-loop streams for
``--duration`` seconds. Printed per process count:

- ``streams_asked`` and ``streams_held_mean`` (run.json ``generator_health.mean_in_flight``: requests in
  flight, time-averaged over the steady state) and the ``streams_held`` check's verdict;
- ``peak_rss_mb`` (the run's process tree, sampled each second) and ``rss_per_stream_kb``;
- ``errors`` (requests that did not end ok or cancelled) and whether any was a descriptor error;
- ``cpu_p90_percent`` and ``host_cpu_p90_percent`` (the generator's own figures), ``start_ramp`` (what
  starting every stream took: the default ramp, docs/profiles.md "Start ramp"), ``start_ramp_held_for_cpu``
  (how long of it batches waited for the host's CPU) and the verdict.

    .venv/bin/python tests/bench/bench_host_scale.py [--streams 13368] [--processes 1,2] [--duration 60]
        [--answer-s 25]

MLPerf Endpoints' Offline point for Llama 3.1 8B issues 13,368 samples at once (docs/sources.md §2).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from harness import ServerProcess, line

ROOT = Path(__file__).resolve().parents[2]
CLIENT_CPU = "0"
TOKENS = 49


def _tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of a process and its children (the workers)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def measure(
    url: str, streams: int, processes: int, duration: float, answer_s: float, tmp: Path
) -> dict[str, Any]:
    """One whole run: its run.json figures and the peak RSS of its process tree."""
    prof = tmp / f"scale-{streams}-{processes}.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "host-scale",
                "input_tokens": {"dist": "fixed", "value": 12},
                "output_tokens": {"dist": "fixed", "value": TOKENS},
                "system_prompt_tokens": 0,
                "load": {"concurrency": streams},
                "duration_s": duration,
                "client": {"drain_timeout_s": answer_s + 30},  # the last answers finish
            }
        )
    )
    out = tmp / f"run-{processes}"
    cmd = ["taskset", "-c", CLIENT_CPU, sys.executable, "-m", "loadtest.cli.main", "run"]
    cmd += ["--profile", str(prof), "--host", url, "--endpoint-check", "none", "--model", "m-bench"]
    cmd += ["--out", str(out), "--processes", str(processes)]
    gen = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    try:
        proc = psutil.Process(gen.pid)
        while gen.poll() is None:
            peak = max(peak, _tree_rss(proc))
            time.sleep(1.0)
        gen.wait(timeout=300)
    finally:
        if gen.poll() is None:
            gen.kill()
            gen.wait()
    run_json = out / "run.json"
    if not run_json.exists():
        err = gen.stderr.read().decode()[-2000:] if gen.stderr else ""
        raise SystemExit(f"the run wrote no run.json: {err}")
    doc = json.loads(run_json.read_text())
    outcomes = doc["metrics"]["requests"]["by_outcome"]
    errors = sum(n for k, n in outcomes.items() if k not in ("ok", "cancelled"))
    failures = json.dumps(doc["metrics"].get("error_samples", []))
    return {
        "doc": doc,
        "peak_rss": peak,
        "errors": errors,
        "fd_errors": "Too many open files" in failures or "EMFILE" in failures,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--streams", type=int, default=13_368)
    ap.add_argument("--processes", default="1,2", help="comma-separated worker process counts, each a run")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--answer-s", type=float, default=25.0, help="how long the server takes per answer")
    args = ap.parse_args()
    gap_ms = args.answer_s * 1e3 / (TOKENS + 1)
    extra = ["--tokens", str(TOKENS), "--ttft-ms", f"{gap_ms:.1f}", "--itl-ms", f"{gap_ms:.1f}"]
    line("streams_asked", args.streams, "streams")
    for processes in (int(p) for p in args.processes.split(",")):
        with (
            tempfile.TemporaryDirectory(prefix="bench-host-scale-") as d,
            ServerProcess("paced", *extra) as srv,
        ):
            url = srv.base_url.removesuffix("/v1")
            r = measure(url, args.streams, processes, args.duration, args.answer_s, Path(d))
        doc, name = r["doc"], f"p{processes}"
        health, gen = doc["generator_health"], doc["metrics"]["generator"]
        held = health.get("mean_in_flight")
        line(f"{name}_streams_held_mean", held if held is not None else "n/a", "streams")
        check = next((c for c in doc["verdict"]["checks"] if c["name"] == "streams_held"), None)
        line(
            f"{name}_streams_held_check", "n/a" if check is None else ("pass" if check["passed"] else "fail")
        )
        line(f"{name}_peak_rss_mb", r["peak_rss"] / 2**20, "MB")
        line(f"{name}_rss_per_stream_kb", r["peak_rss"] / 1024 / args.streams, "kB", "{:.1f}")
        line(f"{name}_errors", r["errors"], "requests")
        line(f"{name}_fd_errors", "yes" if r["fd_errors"] else "no")
        line(f"{name}_cpu_p90_percent", gen.get("cpu_p90_percent") or 0.0, "%", "{:.1f}")
        line(f"{name}_host_cpu_p90_percent", gen.get("host_cpu_p90_percent") or 0.0, "%", "{:.1f}")
        ramp = doc["config"]["judging"].get("ramp") or {}
        line(f"{name}_start_ramp", ramp.get("took_s") or 0.0, "s", "{:.1f}")
        line(f"{name}_start_ramp_held_for_cpu", ramp.get("held_s") or 0.0, "s", "{:.1f}")
        line(f"{name}_ttft_p99", doc["metrics"]["latency_ms"]["ttft"]["p99"] or 0.0, "ms", "{:.1f}")
        line(f"{name}_verdict", doc["verdict"]["status"])


if __name__ == "__main__":
    main()
