"""A plain gevent streaming client, the in-run baseline: geventhttpclient (Locust's FastHttpSession client),
one ``readline`` and one ``json.loads`` per SSE event, N greenlets sending back to back.

    python tests/bench/gevent_baseline.py URL CONCURRENCY SECONDS [--warmup S] [--ramp S]

Prints one JSON line: responses and content events finished inside the window (after the warm-up), the
process CPU time spent in it, TTFT and inter-event gaps (ms) of those responses, and errors.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
import numpy as np  # noqa: E402
from geventhttpclient import HTTPClient  # noqa: E402
from geventhttpclient.url import URL  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url", help="the chat completions URL, e.g. http://127.0.0.1:8000/v1/chat/completions")
    ap.add_argument("concurrency", type=int)
    ap.add_argument("seconds", type=float, help="measurement window")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--ramp", type=float, default=0.0, help="spread the streams' starts over this long")
    args = ap.parse_args()
    url = URL(args.url)
    body = json.dumps(
        {
            "model": "m-bench",
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "stream": True,
            "max_tokens": 250,
        }
    ).encode()
    headers = {"Content-Type": "application/json"}
    t_open = time.perf_counter() + args.ramp + args.warmup
    t_close = t_open + args.seconds
    done = {"responses": 0, "events": 0, "errors": 0}
    ttft: list[float] = []
    gaps: list[float] = []
    cpu = [0.0, 0.0]

    def stream(i: int) -> None:
        if args.ramp:
            gevent.sleep(i * args.ramp / args.concurrency)
        client = HTTPClient(url.host, url.port, concurrency=1, connection_timeout=30, network_timeout=60)
        while time.perf_counter() < t_close:
            t0 = time.perf_counter()
            times: list[float] = []
            try:
                resp = client.post(url.request_uri, body=body, headers=headers)
                while line := resp.readline(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    choices = event.get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        times.append(time.perf_counter())
            except Exception:  # noqa: BLE001 - a baseline counts errors, it does not classify them
                done["errors"] += 1
                client = HTTPClient(
                    url.host, url.port, concurrency=1, connection_timeout=30, network_timeout=60
                )
                continue
            end = time.perf_counter()
            if t_open <= end < t_close and times:
                done["responses"] += 1
                done["events"] += len(times)
                ttft.append((times[0] - t0) * 1e3)
                gaps.extend(np.diff(times) * 1e3)

    def window() -> None:
        gevent.sleep(max(0.0, t_open - time.perf_counter()))
        cpu[0] = time.process_time()
        gevent.sleep(max(0.0, t_close - time.perf_counter()))
        cpu[1] = time.process_time()

    streams = [gevent.spawn(stream, i) for i in range(args.concurrency)]
    gevent.spawn(window).join()
    gevent.joinall(streams, timeout=60)

    def pct(values: list[float], q: float) -> float | None:
        return round(float(np.percentile(values, q)), 3) if values else None

    print(
        json.dumps(
            {
                **done,
                "window_s": args.seconds,
                "cpu_s": round(cpu[1] - cpu[0], 4),
                "ttft_p50_ms": pct(ttft, 50),
                "ttft_p99_ms": pct(ttft, 99),
                "gap_p50_ms": pct(gaps, 50),
                "gap_p99_ms": pct(gaps, 99),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
