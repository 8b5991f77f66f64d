"""Cost of one worker report: take_delta + msgpack on the worker, decode + merge_wire on the master, and shipped lines."""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
from harness import line

from loadtest.client.record import RequestRecord
from loadtest.locust.shipping import RecordSink, ShippedLog
from loadtest.metrics.recorder import Recorder, RunAggregates

SCENARIOS = ("chat", "agent", "summarize")


def make_records(n: int, tokens: int, seed: int = 0) -> list[RequestRecord]:
    """``n`` finished streamed requests of ``tokens`` output tokens, spread over 3 s and 3 scenarios."""
    rng = random.Random(seed)
    t0_ns, t0_epoch = time.perf_counter_ns(), time.time()
    out = []
    for i in range(n):
        start = int(i * 3e9 / n)
        sent = start + rng.randint(50_000, 2_000_000)
        first = sent + rng.randint(20_000_000, 400_000_000)
        chunks = [first]
        for _ in range(tokens - 1):
            chunks.append(chunks[-1] + rng.randint(8_000_000, 40_000_000))
        out.append(
            RequestRecord(
                request_id=f"req-{i}",
                scenario=SCENARIOS[i % 3],
                scheduled_epoch=t0_epoch + start / 1e9,
                scheduled_ns=t0_ns + start,
                sent_ns=t0_ns + sent,
                headers_ns=t0_ns + sent + 10_000_000,
                first_token_ns=t0_ns + first,
                first_answer_ns=t0_ns + first,
                done_ns=t0_ns + chunks[-1] + 100_000,
                chunk_ns=[t0_ns + c for c in chunks],
                http_status=200,
                outcome="ok",
                finish_reason="length",
                requested_output_tokens=tokens,
                prompt_tokens_client=1000,
                completion_tokens_client=tokens,
                prompt_tokens_server=1000,
                completion_tokens_server=tokens,
                cached_tokens_server=0,
            )
        )
    return out


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter_ns()
        fn()
        best = min(best, (time.perf_counter_ns() - t) / 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=1000, help="requests finished in one report interval")
    ap.add_argument("--tokens", type=int, default=250, help="output tokens per request")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    records = make_records(args.requests, args.tokens)

    # Worker: account the records (not timed here: that is per request), then the report step.
    take_ms, encode_ms, decode_ms, merge_ms = [], [], [], []
    blob = b""
    for _ in range(args.repeat):
        rec = Recorder(per_scenario=True)
        for r in records:
            rec.add(r)
        t = time.perf_counter_ns()
        delta = rec.take_delta()
        take_ms.append((time.perf_counter_ns() - t) / 1e6)
        encode_ms.append(best_ms(lambda d=delta: msgpack.packb(d), 1))
        blob = msgpack.packb(delta)
        decode_ms.append(best_ms(lambda b=blob: msgpack.unpackb(b, raw=False, strict_map_key=False), 1))
        wire = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        total = RunAggregates()
        merge_ms.append(best_ms(lambda w=wire, agg=total: agg.merge_wire(w), 1))
    line("delta_take_ms", min(take_ms), "ms", "{:.2f}")
    line("delta_msgpack_encode_ms", min(encode_ms), "ms", "{:.2f}")
    line("delta_bytes", len(blob), "bytes")
    line("master_msgpack_decode_ms", min(decode_ms), "ms", "{:.2f}")
    line("master_merge_wire_ms", min(merge_ms), "ms", "{:.2f}")

    # Record lines: encode each line as it finishes (per request), then compress and ship them.
    log = ShippedLog(None)
    t = time.perf_counter_ns()
    for r in records:
        log.write(r)
    per_line_us = (time.perf_counter_ns() - t) / 1e3 / len(records)
    raw_bytes = sum(len(x) for x in log._pending)
    t = time.perf_counter_ns()
    lines_blob = log.take()
    take_lines_ms = (time.perf_counter_ns() - t) / 1e6
    with tempfile.TemporaryDirectory() as d:
        sink = RecordSink(Path(d))
        add_ms = best_ms(lambda: sink.add(0, lines_blob), args.repeat)
        sink.close()
    line("line_encode_per_request_us", per_line_us, "us", "{:.1f}")
    line("lines_take_compress_ms", take_lines_ms, "ms", "{:.2f}")
    line("lines_raw_bytes", raw_bytes, "bytes")
    line("lines_compressed_bytes", len(lines_blob), "bytes")
    line("master_lines_decompress_write_ms", add_ms, "ms", "{:.2f}")
    report = msgpack.packb(
        {"loadtest": msgpack.unpackb(blob, strict_map_key=False), "loadtest_lines": lines_blob}
    )
    line("report_bytes_total", len(report), "bytes")


if __name__ == "__main__":
    main()
