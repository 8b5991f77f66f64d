"""Time and peak memory of `loadtest report` (and `loadtest export`) for a run of one million requests."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np
from harness import line

from loadtest.client.record import RequestRecord
from loadtest.contracts.run_document import from_data, write_run_document
from loadtest.metrics.recorder import Recorder, RunAggregates
from loadtest.metrics.slo import parse_slos
from loadtest.metrics.verdict import judge
from loadtest.results.run_json import build_run_document

TEMPLATES = 4000
RATE = 500.0  # requests/s: one million requests span 2,000 s
T0 = 1_796_000_000.0
SCENARIOS = (
    ("chat", 0.7, 1020, 130),
    ("summarize", 0.3, 3000, 60),
)  # name, share, input median, output median
ERRORS = (
    ("http_5xx", 503, "HTTP 503: upstream overloaded (request id {})"),
    ("stream_error", 200, "connection closed before the response body ended"),
    ("timeout", 0, "read timeout after 300 s"),
)
MARK_T = 111111.111111


def templates(seed: int) -> list[RequestRecord]:
    """Realistic finished requests: lognormal lengths, queueing TTFT, jittered ITL, 3 % failures."""
    rng = np.random.default_rng(seed)
    out = []
    base_ns = 10**12
    for _ in range(TEMPLATES):
        name, _, in_med, out_med = SCENARIOS[0] if rng.random() < SCENARIOS[0][1] else SCENARIOS[1]
        n_in = int(np.clip(rng.lognormal(math.log(in_med), 0.8), 16, 8192))
        n_out = int(np.clip(rng.lognormal(math.log(out_med), 0.8), 2, 1024))
        sent = base_ns + int(rng.integers(30_000, 3_000_000))
        first = sent + int(rng.lognormal(math.log(180e6), 0.6))
        gaps = rng.lognormal(math.log(22e6), 0.35, n_out - 1).astype(np.int64)
        chunks = [first, *(first + np.cumsum(gaps)).tolist()]
        rec = RequestRecord(
            request_id="",
            scenario=name,
            scheduled_epoch=0.0,
            scheduled_ns=base_ns,
            sent_ns=sent,
            headers_ns=sent + 2_000_000,
            prompt_tokens_client=n_in,
            requested_output_tokens=n_out,
            http_status=200,
        )
        fail = rng.random()
        if fail < 0.03:
            outcome, status, msg = ERRORS[int(rng.integers(len(ERRORS)))]
            rec.outcome, rec.http_status, rec.error = outcome, status, msg.format(rng.integers(10**8, 10**9))
            if outcome == "stream_error":
                rec.chunk_ns = chunks[: len(chunks) // 2]
                rec.first_token_ns = chunks[0]
                rec.completion_tokens_client = len(rec.chunk_ns)
        else:
            rec.outcome, rec.finish_reason = "ok", "length"
            rec.first_token_ns = rec.first_answer_ns = first
            rec.chunk_ns = chunks
            rec.done_ns = chunks[-1] + 500_000
            rec.completion_tokens_client = n_out
            rec.completion_tokens_server = n_out + (1 if rng.random() < 0.002 else 0)
            rec.prompt_tokens_server = n_in
            rec.cached_tokens_server = 0
        out.append(rec)
    return out


def _scale(agg_all: RunAggregates, k: int) -> None:
    """Multiply every count by k: the aggregates of the templates repeated k times."""
    for agg in [agg_all.all, *agg_all.scenarios.values()]:
        for h in agg.hists.values():
            counts = np.ctypeslib.as_array(h.counts)
            counts *= k
            h.total_count *= k
        for c in (agg.outcomes, agg.totals):
            for key in c:
                c[key] *= k


def write_run(run_dir: Path, n: int, seed: int) -> tuple[int, int]:
    """run.json and records.jsonl for ``n`` requests; returns (log bytes, chunks per run)."""
    recs = templates(seed)
    rec = Recorder(per_scenario=True)
    for r in recs:
        rec.add(r)
    aggs = rec.result()
    k = n // TEMPLATES
    _scale(aggs, k)
    duration = n / RATE
    for agg in [aggs.all, *aggs.scenarios.values()]:
        agg.first_scheduled, agg.last_done = T0, T0 + duration + 5.0
        agg.series.clear()
    doc = build_run_document(
        run_id=run_dir.name,
        status="completed",
        interrupted_reason=None,
        config={
            "profile": "bench-1m",
            "profile_resolved": {
                "name": "bench-1m",
                "scenarios": [
                    {
                        "name": s,
                        "kind": "chat",
                        "weight": w,
                        "input_tokens": {
                            "dist": "lognormal",
                            "median": im,
                            "sigma": 0.8,
                            "min": 16,
                            "max": 8192,
                        },
                    }
                    for s, w, im, _ in SCENARIOS
                ],
            },
            "scenarios": [{"name": s, "kind": "chat", "weight": w} for s, w, _, _ in SCENARIOS],
            "load": {"mode": "open", "rate": RATE, "arrival": "poisson", "concurrency": None},
            "duration_s": duration,
            "seed": seed,
            "model": "bench-model",
            "slos": {"ttft_p99": 2000.0, "tpot_p99": 100.0},
        },
        endpoint={
            "url": "http://127.0.0.1:8000",
            "embedded": False,
            "models": ["bench-model"],
            "engine": None,
        },
        fingerprint="f" * 64,
        aggregates=aggs,
        record_files=["records.jsonl"],
    )
    slos = parse_slos({"ttft_p99": "2s", "tpot_p99": "100ms"})
    doc["verdict"] = judge(doc["metrics"], aggs.all.hists, slos).to_dict()
    steps = int(duration / 5)
    doc["telemetry"] = {
        "url": "http://127.0.0.1:8000/metrics",
        "engine": "vllm",
        "interval_s": 5.0,
        "t": [i * 5.0 for i in range(steps)],
        "series": {
            "requests_running": [100 + (i % 7) for i in range(steps)],
            "requests_waiting": [i % 3 for i in range(steps)],
            "kv_cache_usage": [0.6 + 0.01 * (i % 10) for i in range(steps)],
            "generation_tokens_per_s": [RATE * 120.0 for _ in range(steps)],
        },
    }
    write_run_document(run_dir, from_data(doc))
    # Template lines with the id and scheduled time cut out; each line gets its own.
    enc = msgspec.json.Encoder()
    parts = []
    for r in recs:
        d = msgspec.structs.replace(r.to_log(), id="@ID@", t=MARK_T)
        head, rest = enc.encode(d).split(b'"@ID@"')
        mid, tail = rest.split(repr(MARK_T).encode())
        parts.append((head, mid, tail))
    written = 0
    rng = np.random.default_rng(seed + 1)
    ts = T0 + np.cumsum(rng.exponential(1.0 / RATE, n))
    with open(run_dir / "records.jsonl", "wb") as f:
        buf = []
        for i in range(n):
            head, mid, tail = parts[i % TEMPLATES]
            buf.append(b'%s"%x-%d"%s%.6f%s\n' % (head, seed, i, mid, ts[i], tail))
            if len(buf) == 20000:
                data = b"".join(buf)
                written += f.write(data)
                buf.clear()
        written += f.write(b"".join(buf))
    chunks = sum(len(r.chunk_ns) for r in recs) * k
    return written, chunks


def measure(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of a child process."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        err = proc.stderr.read().decode() if proc.stderr else ""
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", help="write the run here and keep it (default: a temporary folder)")
    ap.add_argument("--no-export", action="store_true", help="time the report only")
    args = ap.parse_args()
    n = (args.requests // TEMPLATES) * TEMPLATES
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(args.keep) if args.keep else Path(tmp) / "bench-1m"
        run_dir.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        size, chunks = write_run(run_dir, n, args.seed)
        line("report_1m_requests", n, "requests")
        line("report_1m_log_bytes", size, "bytes")
        line("report_1m_chunks", chunks, "chunks")
        line("report_1m_synth_seconds", time.perf_counter() - t, "s", "{:.1f}")
        cli = [sys.executable, "-m", "loadtest.cli.main"]
        seconds, rss = measure([*cli, "report", str(run_dir)])
        line("report_1m_seconds", seconds, "s", "{:.1f}")
        line("report_1m_peak_rss", rss, "MiB")
        line("report_1m_html_bytes", (run_dir / "report.html").stat().st_size, "bytes")
        summary = (run_dir / "mlperf_log_summary.txt").read_text()
        assert "Result is :" in summary
        if not args.no_export:
            seconds, rss = measure([*cli, "export", str(run_dir), "--out", str(run_dir / "export")])
            line("export_1m_seconds", seconds, "s", "{:.1f}")
            line("export_1m_peak_rss", rss, "MiB")
            for f in sorted((run_dir / "export").iterdir()):
                line(f"export_1m_{f.name.replace('.', '_')}_bytes", f.stat().st_size, "bytes")
        run = json.loads((run_dir / "run.json").read_text())
        assert run["metrics"]["requests"]["completed"] == n


if __name__ == "__main__":
    main()
