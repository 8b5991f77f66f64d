"""Measurement distortion: client-measured TTFT and inter-token gaps vs the paced server's write-time truth."""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from harness import (  # noqa: E402
    LoadResult,
    ServerProcess,
    check_complete,
    line,
    prepare_process,
    print_cores,
    run_closed_loop,
)

TOKENS = 49
RESPONSE_S = 0.1 + TOKENS * 0.02  # TTFT + one gap per token: the ramp that spreads the streams' phases
TARGET_TTFT_P50_MS = 0.5
TARGET_P99_MS = 2.0


def run_level(
    srv: ServerProcess, concurrency: int, duration: float, warmup: float, tag: str
) -> tuple[LoadResult, dict]:
    srv.get_json("/truth")  # drop what earlier runs left on the server
    res = run_closed_loop(
        srv.base_url, concurrency, duration, warmup_s=warmup, ramp_s=RESPONSE_S, max_tokens=TOKENS, tag=tag
    )
    truth = srv.get_json("/truth")
    return res, truth


def calibrate(srv: ServerProcess, start: int, max_c: int, measure: float) -> tuple[list[int], list[float]]:
    """Client CPU utilisation at doubling concurrencies, until it passes 85% (or ``max_c``)."""
    cs: list[int] = []
    utils: list[float] = []
    c = start
    while c <= max_c:
        res, _ = run_level(srv, c, measure, 0.3, f"cal{c}")
        check_complete(res, TOKENS, f"calibration at {c}")
        cs.append(c)
        utils.append(res.cpu_util)
        line(f"distortion_calibration_c{c}_client_cpu", res.cpu_util * 100, "%", "{:.1f}")
        if res.cpu_util >= 0.85:
            break
        c *= 2
    return cs, utils


def concurrency_for(util: float, cs: list[int], utils: list[float]) -> int:
    """Interpolate the concurrency giving ``util`` (linear extrapolation outside the measured range)."""
    u = np.maximum.accumulate(np.asarray(utils))  # utilisation rises with concurrency; ignore noise dips
    c = np.asarray(cs, dtype=float)
    if len(c) == 1:
        est = c[0] * util / max(u[0], 1e-3)
    elif u[0] <= util <= u[-1] and u[-1] > u[0]:
        est = float(np.interp(util, u, c))
    else:
        i, j = (0, 1) if util < u[0] else (len(c) - 2, len(c) - 1)
        slope = (c[j] - c[i]) / max(u[j] - u[i], 1e-3)
        est = c[i] + (util - u[i]) * slope
    return max(10, int(round(est / 10) * 10))


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def report(label: str, res: LoadResult, truth: dict) -> None:
    """Compare each request in the window with the server's write times and print the distributions."""
    check_complete(res, TOKENS, label)
    requests = truth["requests"]
    ttft_added: list[int] = []
    ttft_send_added: list[int] = []
    path_ns: list[int] = []
    itl_added: list[np.ndarray] = []
    srv_ttft: list[int] = []
    srv_gaps: list[np.ndarray] = []
    missing = 0
    for rec in res.records:
        t = requests.get(rec.wire_id)
        if t is None or len(t) != TOKENS + 1:
            missing += 1
            continue
        arrival, writes = t[0], np.asarray(t[1:], dtype=np.int64)
        client = np.asarray(rec.chunk_ns, dtype=np.int64)
        ttft_added.append(rec.first_token_ns - int(writes[0]))
        ttft_send_added.append((rec.first_token_ns - rec.sent_ns) - (int(writes[0]) - arrival))
        path_ns.append(arrival - rec.sent_ns)
        sg = np.diff(writes)
        itl_added.append(np.diff(client) - sg)
        srv_ttft.append(int(writes[0]) - arrival)
        srv_gaps.append(sg)
    if missing:
        raise SystemExit(f"{label}: {missing} requests have no server truth")
    ms = 1e-6
    tta = np.asarray(ttft_added) * ms
    tsa = np.asarray(ttft_send_added) * ms
    itl = np.concatenate(itl_added) * ms
    late = np.asarray(truth["lateness_ns"]) * ms
    p = f"distortion_{label}"
    line(f"{p}_concurrency", res.concurrency, "streams")
    line(f"{p}_client_cpu", res.cpu_util * 100, "%", "{:.1f}")
    line(f"{p}_requests", len(tta), "requests")
    line(f"{p}_chunks", itl.size, "gaps")
    line(f"{p}_ttft_added_p50", pct(tta, 50), "ms", "{:.3f}")
    line(f"{p}_ttft_added_p99", pct(tta, 99), "ms", "{:.3f}")
    line(f"{p}_ttft_added_max", float(tta.max()), "ms", "{:.3f}")
    line(f"{p}_itl_added_p50", pct(itl, 50), "ms", "{:.3f}")
    line(f"{p}_itl_added_p99", pct(itl, 99), "ms", "{:.3f}")
    line(f"{p}_itl_added_p01", pct(itl, 1), "ms", "{:.3f}")
    line(f"{p}_ttft_send_added_p50", pct(tsa, 50), "ms", "{:.3f}")
    line(f"{p}_ttft_send_added_p99", pct(tsa, 99), "ms", "{:.3f}")
    line(f"{p}_request_path_p50", pct(np.asarray(path_ns) * ms, 50), "ms", "{:.3f}")
    line(f"{p}_request_path_p99", pct(np.asarray(path_ns) * ms, 99), "ms", "{:.3f}")
    line(f"{p}_server_ttft_p50", pct(np.asarray(srv_ttft) * ms, 50), "ms", "{:.2f}")
    line(f"{p}_server_ttft_p99", pct(np.asarray(srv_ttft) * ms, 99), "ms", "{:.2f}")
    gaps = np.concatenate(srv_gaps) * ms
    line(f"{p}_server_gap_p50", pct(gaps, 50), "ms", "{:.2f}")
    line(f"{p}_server_gap_p99", pct(gaps, 99), "ms", "{:.2f}")
    line(f"{p}_server_timer_late_p50", pct(late, 50), "ms", "{:.3f}")
    line(f"{p}_server_timer_late_p99", pct(late, 99), "ms", "{:.3f}")
    line(f"{p}_server_cpu_run", truth["server_cpu_s"] / truth["server_wall_s"] * 100, "%", "{:.1f}")
    print_cores(p, res)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--duration", type=float, default=6.0, help="measurement window per level, s")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds after the ramp before the window opens")
    p.add_argument(
        "--c50", type=int, help="concurrency for ~50%% client CPU (skips calibration if both given)"
    )
    p.add_argument("--c80", type=int, help="concurrency for ~80%% client CPU")
    p.add_argument("--concurrency", type=int, default=50, help="calibration: first concurrency (doubles)")
    p.add_argument("--max-concurrency", type=int, default=3200, help="calibration: highest concurrency")
    p.add_argument("--calibration-s", type=float, default=2.0, help="calibration: window per level, s")
    args = p.parse_args()
    prepare_process()
    with ServerProcess("paced", "--tokens", str(TOKENS)) as srv:
        c50, c80 = args.c50, args.c80
        if c50 is None or c80 is None:
            cs, utils = calibrate(srv, args.concurrency, args.max_concurrency, args.calibration_s)
            c50 = c50 or concurrency_for(0.5, cs, utils)
            c80 = c80 or concurrency_for(0.8, cs, utils)
        for label, c in (("c50", c50), ("c80", c80)):
            res, truth = run_level(srv, c, args.duration, args.warmup, label)
            report(label, res, truth)
    line("target_distortion_c50_ttft_added_p50", f"< {TARGET_TTFT_P50_MS}", "ms")
    line("target_distortion_c50_ttft_added_p99", f"< {TARGET_P99_MS}", "ms")
    line("target_distortion_c50_itl_added_p99", f"< {TARGET_P99_MS}", "ms")


if __name__ == "__main__":
    main()
