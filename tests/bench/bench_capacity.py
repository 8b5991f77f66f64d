"""Client capacity: SSE content events handled per client CPU-second, against batched and paced servers."""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402

from harness import ServerProcess, check_complete, line, prepare_process, print_cores, run_closed_loop  # noqa: E402

BATCHED_TOKENS = 250
PACED_TOKENS = 49
PACED_RESPONSE_S = 0.1 + PACED_TOKENS * 0.02  # TTFT + one gap per token (the tail rides the last gap)
TARGET_BATCHED = 700_000
TARGET_PACED = 70_000


def bench_batched(concurrency: int, duration: float, warmup: float) -> None:
    with ServerProcess("batched", "--tokens", str(BATCHED_TOKENS)) as srv:
        res = run_closed_loop(srv.base_url, concurrency, duration, warmup_s=warmup, tag="batched")
    check_complete(res, BATCHED_TOKENS, "batched")
    line("capacity_batched_concurrency", res.concurrency, "streams")
    line("capacity_batched_events_per_cpu_s", res.events / res.cpu_s, "events/s")
    line("capacity_batched_events_per_s", res.events / res.wall_s, "events/s")
    line("capacity_batched_responses_per_s", res.ok / res.wall_s, "responses/s")
    line("capacity_batched_cpu_us_per_event", res.cpu_s / res.events * 1e6, "us", "{:.2f}")
    line("capacity_batched_client_cpu_util", res.cpu_util * 100, "%", "{:.1f}")
    line("capacity_batched_responses", res.ok, "responses")
    print_cores("capacity_batched", res)
    line("target_capacity_batched_events_per_cpu_s", TARGET_BATCHED, "events/s")


def bench_paced(concurrency: int, duration: float, warmup: float) -> None:
    with ServerProcess("paced", "--tokens", str(PACED_TOKENS)) as srv:
        res = run_closed_loop(
            srv.base_url,
            concurrency,
            duration,
            warmup_s=warmup,
            ramp_s=PACED_RESPONSE_S,
            max_tokens=PACED_TOKENS,
            tag="paced",
        )
        server = srv.get_json("/truth")
    check_complete(res, PACED_TOKENS, "paced")
    line("capacity_paced_concurrency", res.concurrency, "streams")
    line("capacity_paced_events_per_cpu_s", res.events / res.cpu_s, "events/s")
    line("capacity_paced_events_per_s", res.events / res.wall_s, "events/s")
    line("capacity_paced_responses_per_s", res.ok / res.wall_s, "responses/s", "{:.1f}")
    line("capacity_paced_cpu_us_per_event", res.cpu_s / res.events * 1e6, "us", "{:.2f}")
    line("capacity_paced_client_cpu_util", res.cpu_util * 100, "%", "{:.1f}")
    line(
        "capacity_paced_server_cpu_util_run",
        server["server_cpu_s"] / server["server_wall_s"] * 100,
        "%",
        "{:.1f}",
    )
    print_cores("capacity_paced", res)
    line("client_cpu_util", res.cpu_util * 100, "%", "{:.1f}")
    line("target_capacity_paced_events_per_cpu_s", TARGET_PACED, "events/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--duration", type=float, default=10.0, help="measurement window per part, s")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before the window opens")
    p.add_argument("--concurrency", type=int, default=16, help="streams against the batched server")
    p.add_argument("--paced-concurrency", type=int, default=800, help="streams against the paced server")
    p.add_argument("--only", choices=("batched", "paced"), help="run one part only")
    args = p.parse_args()
    prepare_process()
    if args.only in (None, "batched"):
        bench_batched(args.concurrency, args.duration, args.warmup)
    if args.only in (None, "paced"):
        bench_paced(args.paced_concurrency, args.duration, args.warmup)


if __name__ == "__main__":
    main()
