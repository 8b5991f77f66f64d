"""A closed loop on the MLPerf Endpoints client (``inference_endpoint.endpoint_client``), the peer baseline.

Not imported by the project: bench_run_capacity.py feeds this file on stdin to a Python (3.12 or newer)
that has the MLPerf Endpoints client installed (``--mlperf-python``), so both clients are measured in
the same invocation against the same servers.

    PYTHON - URL CONCURRENCY SECONDS --warmup S --expect CHARS [--workers N] < mlperf_client_driver.py

It runs ``CONCURRENCY`` streams back to back through ``HTTPEndpointClient`` (its own worker
processes, ZMQ between them), each a streamed chat completion. A response counts when its text has
the ``--expect`` characters the server sends (the bench servers' answers are fixed); the window opens
``--warmup`` s after the client is up. Prints one JSON line: responses finished inside the window, the
CPU time of the whole process tree in it (the main process and its workers, psutil), TTFT (first
chunk at the main process, from the issue) and errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

import psutil
from inference_endpoint.core.types import Query, QueryResult, StreamChunk
from inference_endpoint.endpoint_client.config import HTTPClientConfig
from inference_endpoint.endpoint_client.http_client import HTTPEndpointClient


def _tree_cpu_s(root: psutil.Process) -> float:
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


async def _run(args: argparse.Namespace) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    config = HTTPClientConfig(
        endpoint_urls=[args.url],
        num_workers=args.workers,
        warmup_connections=0,
        max_connections=args.concurrency,
        min_required_connections=0,
    )
    client = await HTTPEndpointClient.create(config, loop)
    me = psutil.Process()
    issued: dict[str, float] = {}
    first: dict[str, float] = {}
    ttft: list[float] = []
    done = {"responses": 0, "errors": 0, "short": 0}

    def issue() -> None:
        qid = uuid.uuid4().hex
        issued[qid] = time.perf_counter()
        client.issue(
            Query(
                id=qid,
                data={
                    "prompt": "Tell me a long story.",
                    "model": "m-bench",
                    "stream": True,
                    "max_completion_tokens": 250,
                },
                headers={"Content-Type": "application/json"},
            )
        )

    for _ in range(args.concurrency):
        issue()
    t_open = time.perf_counter() + args.warmup
    t_close = t_open + args.seconds
    cpu0 = cpu1 = None
    while True:
        now = time.perf_counter()
        if cpu0 is None and now >= t_open:
            cpu0 = _tree_cpu_s(me)
        if now >= t_close:
            cpu1 = _tree_cpu_s(me)
            break
        try:
            r = await asyncio.wait_for(client.recv(), timeout=max(0.01, t_close - now))
        except TimeoutError:
            continue
        if r is None:
            break
        if isinstance(r, StreamChunk):
            first.setdefault(r.id, time.perf_counter())
            continue
        if not isinstance(r, QueryResult):
            continue
        end = time.perf_counter()
        start = issued.pop(r.id, end)
        got = first.pop(r.id, None)
        if r.error is not None:
            done["errors"] += 1
        elif len(r.get_response_output_string()) != args.expect:
            done["short"] += 1
        elif t_open <= end < t_close:
            done["responses"] += 1
            if got is not None:
                ttft.append((got - start) * 1e3)
        issue()
    await client.shutdown_async()
    ttft.sort()
    return {
        **done,
        "cpu_s": (cpu1 or 0.0) - (cpu0 or 0.0),
        "window_s": args.seconds,
        "ttft_p99_ms": ttft[int(0.99 * (len(ttft) - 1))] if ttft else None,
        "python": ".".join(map(str, __import__("sys").version_info[:3])),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url", help="the chat completions URL, e.g. http://127.0.0.1:8000/v1/chat/completions")
    ap.add_argument("concurrency", type=int)
    ap.add_argument("seconds", type=float)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--expect", type=int, required=True, help="characters of each answer's text")
    ap.add_argument("--workers", type=int, default=1, help="the client's worker processes")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(_run(args))), flush=True)


if __name__ == "__main__":
    main()
