"""What each finished request pays after its response is read: the recorder (HDR histograms, series,
totals), the record-log line, Locust's request event (its statistics, the UI's tables) and the whole
``RunContext.finish``, per request, for a streamed answer of ``--tokens`` token events.

    .venv/bin/python tests/bench/bench_request_cost.py [--requests 20000] [--tokens 250]

Each figure is the mean over ``--requests`` records (µs per request), with the time to parse the same
answer's SSE body (``parse_stream``) printed alongside as the baseline the accounting is compared to.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from harness import line
from locust import HttpUser, task
from locust.env import Environment

from loadtest.client.record import RequestRecord, count_merged_gaps
from loadtest.client.sse import parse_stream
from loadtest.metrics.recorder import Recorder
from loadtest.results.record_log import RecordLog

B = 10**12
_enc = msgspec.json.Encoder()


class _Idle(HttpUser):
    host = "http://127.0.0.1:9"

    @task
    def nothing(self) -> None:
        """Never run: the environment only needs a user class."""


def _record(i: int, tokens: int) -> RequestRecord:
    base = B + i * 10**9
    return RequestRecord(
        request_id=f"chat-{i}",
        wire_id="5f0c2a4e-0000-4000-8000-000000000007",
        scenario="chat",
        scheduled_epoch=1_700_000_000.0 + i,
        scheduled_ns=base,
        sent_ns=base + 50_000,
        headers_ns=base + 2_000_000,
        first_token_ns=base + 3_000_000,
        first_answer_ns=base + 3_000_000,
        done_ns=base + 3_000_000 + tokens * 1_000_000,
        chunk_ns=[base + 3_000_000 + k * 1_000_000 for k in range(tokens)],
        http_status=200,
        outcome="ok",
        finish_reason="stop",
        requested_output_tokens=tokens,
        prompt_tokens_client=12,
        completion_tokens_client=tokens,
        prompt_tokens_server=12,
        completion_tokens_server=tokens,
    )


def _body(tokens: int) -> list[bytes]:
    def ev(obj: object) -> bytes:
        return b"data: " + _enc.encode(obj) + b"\n\n"

    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [ev({**head, "choices": [{"index": 0, "delta": {"content": " the"}, "finish_reason": None}]})]
    events *= tokens
    events.append(ev({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    events.append(b"data: [DONE]\n\n")
    return [b"".join(events[i : i + 32]) for i in range(0, len(events), 32)]  # reads of 32 events


def _per_request_us(fn: Callable[[RequestRecord], object], recs: list[RequestRecord]) -> float:
    t = time.perf_counter()
    for r in recs:
        fn(r)
    return (time.perf_counter() - t) / len(recs) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--tokens", type=int, default=250)
    args = ap.parse_args()
    recs = [_record(i, args.tokens) for i in range(args.requests)]
    reads = _body(args.tokens)
    times = list(range(len(reads)))
    with tempfile.TemporaryDirectory(prefix="bench-request-cost-") as d:
        log = RecordLog(Path(d) / "records.jsonl")
        recorder = Recorder()
        env = Environment(user_classes=[_Idle])
        env.create_local_runner()

        def fire(r: RequestRecord) -> None:
            env.events.request.fire(
                request_type="CHAT",
                name=r.scenario,
                response_time=(r.done_ns - r.scheduled_ns) / 1e6,
                response_length=r.output_tokens,
                exception=None,
                context={},
            )

        parse = _per_request_us(lambda _r: parse_stream(reads, times), recs[:2000])
        merged = _per_request_us(lambda r: count_merged_gaps(r.chunk_ns), recs)
        add = _per_request_us(recorder.add, recs)
        recorder.flush()
        write = _per_request_us(log.write, recs)
        event = _per_request_us(fire, recs)
        log.close()
        size = os.path.getsize(Path(d) / "records.jsonl") / len(recs)
    line("request_cost_tokens", args.tokens, "token events")
    line("parse_stream_us", parse, "us/request", "{:.1f}")
    line("merged_gaps_us", merged, "us/request", "{:.1f}")
    line("recorder_add_us", add, "us/request", "{:.1f}")
    line("record_log_write_us", write, "us/request", "{:.1f}")
    line("locust_request_event_us", event, "us/request", "{:.1f}")
    line("accounting_vs_parse", (merged + add + write + event) / parse, "x", "{:.2f}")
    line("record_line_bytes", size, "bytes/request")


if __name__ == "__main__":
    main()
