"""Embedded engine capacity: concurrent streams and tokens/s one engine process sustains on one core on schedule."""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from time import perf_counter_ns  # noqa: E402

import gevent  # noqa: E402
import psutil  # noqa: E402
from harness import CLIENT_CPU, SERVER_CPU, line, prepare_process  # noqa: E402

from loadtest.client.openai import OpenAIClient, PreparedRequest  # noqa: E402
from loadtest.sim import SimProcess  # noqa: E402
from loadtest.tokens.tokenizer import get_tokenizer  # noqa: E402
from loadtest.workload.text import synth_text  # noqa: E402

TARGET_STREAMS = 2000
TARGET_TOKENS_PER_S = 50_000
LATENESS_LIMIT_US = 1000.0


def run_level(args: argparse.Namespace, streams: int) -> dict:
    """One engine process under ``streams`` closed-loop streams; engine-side rates and step lateness."""
    tok = get_tokenizer("llama3")
    import random

    prompt = synth_text(args.prompt, random.Random(streams))
    with SimProcess(
        gpu=args.gpu, model=args.model, speedup=args.speedup, max_num_seqs=max(8192, 2 * streams)
    ) as sim:
        os.sched_setaffinity(sim.pid, {SERVER_CPU})
        proc = psutil.Process(sim.pid)
        stop = False
        body = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": args.output,
            "ignore_eos": True,
        }

        def user(i: int) -> None:
            gevent.sleep(i * args.ramp / streams)
            client = OpenAIClient(sim.base_url, None, tok, worker=i)
            k = 0
            try:
                while not stop:
                    req = PreparedRequest(f"s{i}-{k}", "chat", body, args.prompt, args.output)
                    client.send(req, perf_counter_ns(), time.time())
                    k += 1
            finally:
                client.close()

        users = [gevent.spawn(user, i) for i in range(streams)]
        gevent.sleep(args.ramp + args.warmup)
        s0 = sim.stats()  # also resets the engine's step-lateness window
        c0, t0 = proc.cpu_times(), time.monotonic()
        gevent.sleep(args.duration)
        s1 = sim.stats()
        c1, t1 = proc.cpu_times(), time.monotonic()
        stop = True
        gevent.killall(users, block=True, timeout=10)
    wall = t1 - t0
    e0, e1 = s0["engine"], s1["engine"]
    return {
        "streams": streams,
        "running": e1.get("num_requests_running", 0),
        "tokens_per_s": (e1["generated_tokens"] - e0["generated_tokens"]) / wall,
        "steps_per_s": (e1["steps"] - e0["steps"]) / wall,
        "engine_cpu": ((c1.user + c1.system) - (c0.user + c0.system)) / wall,
        "lateness": e1.get("step_lateness", {}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--streams", default="500,1000,2000,3000", help="comma-separated concurrency levels")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    ap.add_argument("--output", type=int, default=256, help="output tokens (ignore_eos)")
    ap.add_argument("--ramp", type=float, default=2.0, help="seconds over which streams start")
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--duration", type=float, default=8.0)
    args = ap.parse_args()
    prepare_process(CLIENT_CPU)
    best: dict | None = None
    for streams in (int(x) for x in args.streams.split(",")):
        r = run_level(args, streams)
        lat = r["lateness"]
        p = f"engine_s{streams}"
        line(f"{p}_running_requests", r["running"], "requests", "{:d}")
        line(f"{p}_tokens_per_s", r["tokens_per_s"], "tokens/s", "{:.0f}")
        line(f"{p}_steps_per_s", r["steps_per_s"], "steps/s", "{:.1f}")
        line(f"{p}_engine_cpu", r["engine_cpu"] * 100, "%", "{:.1f}")
        line(f"{p}_step_lateness_p50", lat.get("p50_us", float("nan")), "us", "{:.0f}")
        line(f"{p}_step_lateness_p99", lat.get("p99_us", float("nan")), "us", "{:.0f}")
        line(f"{p}_step_lateness_max", lat.get("max_us", float("nan")), "us", "{:.0f}")
        line(f"{p}_steps_over_1ms", lat.get("over_1ms", 0), "steps", "{:d}")
        if lat.get("p99_us", float("inf")) <= LATENESS_LIMIT_US:
            best = r
    if best is not None:
        line("engine_sustained_streams", best["streams"], "streams", "{:d}")
        line("engine_sustained_tokens_per_s", best["tokens_per_s"], "tokens/s", "{:.0f}")
    line("target_engine_streams", TARGET_STREAMS, "streams", "{:d}")
    line("target_engine_tokens_per_s", TARGET_TOKENS_PER_S, "tokens/s", "{:d}")


if __name__ == "__main__":
    main()
