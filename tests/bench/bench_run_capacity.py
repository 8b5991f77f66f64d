"""Generator capacity in a whole `loadtest run`, side by side with a plain gevent client, on real framing.

The server (tests/bench/sse_server.py, pinned to CPU 1) frames like vLLM: chunked transfer encoding, one
chunk per SSE event (``--framing coalesced``: 16 events a chunk, as a buffering proxy sends them). The
client side is pinned to CPU 0 and is, in turn:

- ``run``: the whole `loadtest run` process (Locust, the record log, the histograms, the telemetry poller),
  closed loop; its CPU time (psutil) and the content events of the ok requests that completed inside the
  window (from its record log) give events per CPU-second;
- ``gevent``: tests/bench/gevent_baseline.py, a plain gevent client (one readline and one json.loads per
  event), the same streams against the same server in the same invocation.

Both parts run against the ``batched`` server (each response, 250 one-token events, in one write) and the
``paced`` one (TTFT 100 ms, then one event every 20 ms, each its own write); paced, each client runs
the streams that take about half of its core (``loadtest run`` 800, the baseline 400), so the two are
compared at the same CPU share, as load generators are run. Every figure is printed as
``name: value unit``; the ratios are what to compare across machines. The ``open`` part runs the whole
`loadtest run` open loop (Poisson arrivals, 500 req/s, 50-token batched answers) and prints the arrival
rate the schedule asked for and the rate the requests were sent at in the window, and the schedule lag.
The ``short`` part is the batched one with 2-token answers at 32 streams: requests per CPU-second and
microseconds a request, where the per-request cost is the whole cost.

    .venv/bin/python tests/bench/bench_run_capacity.py [--duration 10] [--warmup 3] [--rounds 3] [--concurrency 16] \
        [--paced-concurrency 400] [--paced-run-concurrency 800] [--open-rate 500] [--framing chunked|coalesced|content-length] \
        [--only batched|short|paced|open] [--short-concurrency 32] [--mlperf-endpoints PATH [--mlperf-root DIR] [--mlperf-tokenizer PATH]]

With ``--mlperf-endpoints`` each round also measures the MLPerf Endpoints client (tests/bench/mlperf_peer.py):
its whole benchmark command and its HTTP client alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from harness import CoreHog, ServerProcess, line
from mlperf_peer import Peer, measure_benchmark, measure_client
from sse_server import WORDS

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CLIENT_CPU = "0"
PACED_TTFT_MS, PACED_ITL_MS, PACED_TOKENS = 100.0, 20.0, 49
SHORT_TOKENS = 2  # the short part: 2-token answers, where the per-request cost is all there is
PEERS = ("gevent", "mlperf_benchmark", "mlperf_client")  # each round's baselines, in the order they run
OPEN_TOKENS = 50  # tokens per response of the open-loop part (its subject is the per-request cost)


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _window_lines(log: Path, t0: float, t1: float) -> list[dict[str, Any]]:
    """Record-log lines of requests that completed inside [t0, t1) (epoch seconds)."""
    out = []
    for raw in log.read_text().splitlines():
        if not raw:
            continue
        rec = json.loads(raw)
        if rec.get("e2e_us") is None:
            continue
        done = rec["t"] + rec["e2e_us"] / 1e6
        if t0 <= done < t1:
            out.append(rec)
    return out


def measure_run(
    url: str, concurrency: int, duration: float, warmup: float, tokens: int, tmp: Path, ramp: float = 0.0
) -> dict[str, Any]:
    """A whole `loadtest run`: events and CPU inside the window that opens ``warmup`` s after the first
    request finished, and the TTFT and token-gap p99 of the requests that completed in it (record log).
    ``ramp``: the streams start evenly over that many seconds (a closed-loop stage with a ramp), as the
    baseline's do, so that neither client gets its streams' events in step."""
    hold = warmup + duration + 30  # past the window: the bench stops the run itself
    load: dict[str, Any] = {"concurrency": concurrency}
    if ramp:
        stages = [{"concurrency": concurrency, "duration_s": ramp, "ramp": True}]
        load = {"stages": [*stages, {"concurrency": concurrency, "duration_s": hold}]}
    prof = tmp / f"bench-{concurrency}.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "bench",
                "input_tokens": {"dist": "fixed", "value": 12},
                "output_tokens": {"dist": "fixed", "value": tokens},
                "system_prompt_tokens": 0,
                "load": load,
                "duration_s": hold,
            }
        )
    )
    out = tmp / f"run-{concurrency}-{time.time_ns()}"
    cmd = [
        "taskset",
        "-c",
        CLIENT_CPU,
        sys.executable,
        "-m",
        "loadtest.cli.main",
        "run",
        "--profile",
        str(prof),
    ]
    cmd += ["--host", url, "--endpoint-check", "none", "--model", "m-bench", "--out", str(out)]
    cmd += ["--generator-health", "warn", "--warmup", "0"]
    gen = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        proc = psutil.Process(gen.pid)
        log = out / "records.jsonl"
        deadline = time.monotonic() + 60
        while not (log.exists() and log.stat().st_size):
            if gen.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"the run did not start: {gen.stderr.read().decode()[-2000:] if gen.stderr else ''}"
                )
            time.sleep(0.05)
        time.sleep(warmup)
        t0, cpu0 = time.time(), _cpu_s(proc)
        time.sleep(duration)
        t1, cpu1 = time.time(), _cpu_s(proc)
        gen.send_signal(2)  # SIGINT: the run stops and writes its results
        gen.wait(timeout=120)
    finally:
        if gen.poll() is None:
            gen.kill()
            gen.wait()
    lines = _window_lines(out / "records.jsonl", t0, t1)
    bad = {r["outcome"] for r in lines} - {"ok"}
    if bad or not lines:
        raise SystemExit(f"run: outcomes {bad or 'none'} in the window (expected only ok)")
    events = sum(len(r["chunks_us"]) for r in lines)
    ttft = [(r["ttft_us"] - (r.get("sent_us") or 0)) / 1e3 for r in lines if r.get("ttft_us") is not None]
    gaps = [(b - a) / 1e3 for r in lines for a, b in zip(r["chunks_us"], r["chunks_us"][1:], strict=False)]
    return {
        "events": events,
        "responses": len(lines),
        "streams": concurrency,
        "cpu_s": cpu1 - cpu0,
        "wall_s": t1 - t0,
        "ttft_p99_ms": float(np.percentile(ttft, 99)) if ttft else None,
        "itl_p99_ms": float(np.percentile(gaps, 99)) if gaps else None,
        "lines": lines,
    }


def over_server(
    lines: list[dict[str, Any]], truth: dict[str, list[int]], heads: dict[str, int]
) -> tuple[float, float, float, int]:
    """How much later than the server the run saw each token (ms, p99): client TTFT (from its send)
    minus the server's (its first token's write minus the request's arrival, the kernel's receive time
    of the request: so only the request's transit counts against the client, not the server's own delay
    in reading it); the first token's read after the response headers' minus the server's interval
    between writing the two (the read side alone); each client gap between tokens minus the server's
    gap between those writes; and the requests matched by wire id."""
    ttft_over: list[float] = []
    read_over: list[float] = []
    gap_over: list[float] = []
    matched = 0
    for r in lines:
        wire_id = r.get("wire_id") or ""
        times = truth.get(wire_id)
        chunks = r["chunks_us"]
        if not times or len(times) - 1 != len(chunks) or r.get("ttft_us") is None:
            continue
        matched += 1
        ttft = (r["ttft_us"] - (r.get("sent_us") or 0)) / 1e3  # from the request's send
        ttft_over.append(ttft - (times[1] - times[0]) / 1e6)
        head = heads.get(wire_id)
        if r.get("headers_us") is not None and head is not None:
            read_over.append((r["ttft_us"] - r["headers_us"]) / 1e3 - (times[1] - head) / 1e6)
        for k in range(1, len(chunks)):
            gap_over.append((chunks[k] - chunks[k - 1]) / 1e3 - (times[k + 1] - times[k]) / 1e6)
    if not matched:
        raise SystemExit("no record of the run matched the server's truth by X-Request-Id")
    read = float(np.percentile(read_over, 99)) if read_over else float("nan")
    return float(np.percentile(ttft_over, 99)), read, float(np.percentile(gap_over, 99)), matched


def measure_open(
    url: str, rate: float, duration: float, warmup: float, tokens: int, tmp: Path
) -> dict[str, Any]:
    """A whole open-loop `loadtest run` (Poisson arrivals at ``rate``): the arrivals scheduled inside the
    window and those sent inside it (record log), and the schedule lag p99 of the window's requests."""
    prof = tmp / "bench-open.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "bench-open",
                "input_tokens": {"dist": "fixed", "value": 12},
                "output_tokens": {"dist": "fixed", "value": tokens},
                "system_prompt_tokens": 0,
                "load": {"rate": rate, "arrival": "poisson"},
                "duration_s": warmup + duration + 5,
                "seed": 7,
            }
        )
    )
    out = tmp / f"run-open-{time.time_ns()}"
    cmd = [
        "taskset",
        "-c",
        CLIENT_CPU,
        sys.executable,
        "-m",
        "loadtest.cli.main",
        "run",
        "--profile",
        str(prof),
    ]
    cmd += ["--host", url, "--endpoint-check", "none", "--model", "m-bench", "--out", str(out)]
    cmd += ["--generator-health", "warn", "--warmup", "0"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=warmup + duration + 120)
    if not (out / "run.json").is_file():
        raise SystemExit(f"the open-loop run wrote no run.json: {res.stderr[-2000:]}")
    first = None
    scheduled = sent = 0
    lags: list[float] = []
    for raw in (out / "records.jsonl").read_text().splitlines():
        rec = json.loads(raw)
        first = rec["t"] if first is None else min(first, rec["t"])
    t0 = (first or 0.0) + warmup
    t1 = t0 + duration
    for raw in (out / "records.jsonl").read_text().splitlines():
        rec = json.loads(raw)
        if t0 <= rec["t"] < t1:
            scheduled += 1
            if rec["sent_us"] is not None:
                lags.append(rec["sent_us"] / 1e3)
        if rec["sent_us"] is not None and t0 <= rec["t"] + rec["sent_us"] / 1e6 < t1:
            sent += 1
    return {
        "scheduled_per_s": scheduled / duration,
        "sent_per_s": sent / duration,
        "lag_p99_ms": float(np.percentile(lags, 99)) if lags else None,
        "ok": json.loads((out / "run.json").read_text())["metrics"]["requests"]["ok"],
    }


def open_part(args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="bench-run-capacity-") as d,
        ServerProcess("batched", "--framing", "chunked", "--tokens", str(OPEN_TOKENS)) as srv,
    ):
        res = measure_open(
            srv.base_url.removesuffix("/v1"), args.open_rate, args.duration, args.warmup, OPEN_TOKENS, Path(d)
        )
    line("open_rate_target", args.open_rate, "req/s", "{:.0f}")
    line("open_rate_scheduled", res["scheduled_per_s"], "req/s", "{:.1f}")
    line("open_rate_sent", res["sent_per_s"], "req/s", "{:.1f}")
    # Poisson: the count in the window has a relative standard deviation of 1/sqrt(rate x duration).
    line("open_rate_poisson_sd", 100 / (args.open_rate * args.duration) ** 0.5, "%", "{:.2f}")
    line("open_sent_vs_scheduled", res["sent_per_s"] / res["scheduled_per_s"] * 100 - 100, "%", "{:+.2f}")
    line("open_schedule_lag_p99", res["lag_p99_ms"] or 0.0, "ms", "{:.2f}")


def measure_gevent(url: str, concurrency: int, duration: float, warmup: float, ramp: float) -> dict[str, Any]:
    cmd = ["taskset", "-c", CLIENT_CPU, sys.executable, str(HERE / "gevent_baseline.py")]
    cmd += [f"{url}/v1/chat/completions", str(concurrency), str(duration), "--warmup", str(warmup)]
    cmd += ["--ramp", str(ramp)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + warmup + ramp + 120)
    if res.returncode:
        raise SystemExit(f"gevent baseline failed: {res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    if out["errors"] or not out["responses"]:
        raise SystemExit(f"gevent baseline: {out}")
    return out


def mlperf_round(
    args: argparse.Namespace, mode: str, extra: list[str], streams: int, tokens: int, run: dict[str, Any]
) -> dict[str, float]:
    """The MLPerf Endpoints client's round (tests/bench/mlperf_peer.py), each against a fresh server:
    its whole benchmark command with the baseline's ``streams`` (paced, that already takes more than
    half a core), as many requests as the run finished in a window's time; and its HTTP client alone
    with the run's streams (paced: the same share of a core as the run), for the window."""
    peer = Peer(args.mlperf_endpoints, Path(args.mlperf_root), args.mlperf_tokenizer)
    samples = max(200, int(run["responses"] / run["wall_s"] * args.duration * streams / run["streams"]))
    with ServerProcess(mode, *extra) as srv:
        bench = measure_benchmark(peer, srv.base_url.removesuffix("/v1"), streams, samples, tokens)
    chars = sum(len(WORDS[i % len(WORDS)]) for i in range(tokens))
    with ServerProcess(mode, *extra) as srv:
        client = measure_client(
            peer, f"{srv.base_url}/chat/completions", run["streams"], args.duration, args.warmup, chars
        )
    return {
        "mlperf_benchmark_rate": bench["events"] / bench["cpu_s"],
        "mlperf_benchmark_util": bench["cpu_s"] / bench["wall_s"] * 100,
        "mlperf_client_rate": client["responses"] * tokens / client["cpu_s"],
        "mlperf_client_util": client["cpu_s"] / client["window_s"] * 100,
    }


PILOT_S = 4.0  # the calibration's window per client


def calibrate(
    args: argparse.Namespace, extra: list[str], tokens: int, ramp: float, guess: tuple[int, int], tmp: Path
) -> tuple[int, int]:
    """The paced streams that put each client at ``--paced-cpu-share`` of its core: one short pilot of
    each at ``guess`` (against a fresh server), its streams scaled by the share it was off. The machine's
    speed drifts between minutes, so each round calibrates again, just before it measures."""
    target = args.paced_cpu_share / 100
    with ServerProcess("paced", *extra) as srv:
        run = measure_run(srv.base_url.removesuffix("/v1"), guess[0], PILOT_S, args.warmup, tokens, tmp, ramp)
    with ServerProcess("paced", *extra) as srv:
        base = measure_gevent(srv.base_url.removesuffix("/v1"), guess[1], PILOT_S, args.warmup, ramp)
    run_share, base_share = run["cpu_s"] / run["wall_s"], base["cpu_s"] / base["window_s"]

    def scaled(streams: int, share: float) -> int:
        return max(50, min(4000, round(streams * target / share)))

    return scaled(guess[0], run_share), scaled(guess[1], base_share)


def part(
    name: str,
    mode: str,
    framing: str,
    streams: tuple[int, int],
    args: argparse.Namespace,
    tokens: int,
) -> None:
    """One part, ``args.rounds`` times: a whole ``loadtest run`` with ``streams[0]`` streams, then the
    baseline with ``streams[1]``, each against a fresh server. The machine's speed drifts between
    minutes, so the figures are the medians of the rounds and the ratio the median of each round's own
    ratio (its spread printed too)."""
    extra = ["--framing", framing] if mode == "batched" else []
    extra += ["--tokens", str(tokens)]
    ramp = PACED_TTFT_MS / 1e3 + PACED_TOKENS * PACED_ITL_MS / 1e3 if mode == "paced" else 0.0
    run_streams, base_streams = streams
    rounds: list[dict[str, float]] = []
    # --shared-core: another process spins on the clients' core all along (pilots, runs, baselines)
    hog = CoreHog(int(CLIENT_CPU)) if args.shared_core else contextlib.nullcontext()
    with hog:
        for _ in range(max(1, args.rounds)):
            r = _round(mode, extra, tokens, ramp, (run_streams, base_streams), args)
            run_streams, base_streams = (
                int(r["run_streams"]),
                int(r["base_streams"]),
            )  # the next pilot's guess
            rounds.append(r)
    _print_part(name, mode, tokens, rounds)


def _round(
    mode: str, extra: list[str], tokens: int, ramp: float, streams: tuple[int, int], args: argparse.Namespace
) -> dict[str, float]:
    """One round of a part: the run, then the baseline (and the MLPerf client), each on a fresh server."""
    run_streams, base_streams = streams
    with tempfile.TemporaryDirectory(prefix="bench-run-capacity-") as d:
        if mode == "paced" and args.paced_cpu_share:  # each client at the same share of its core
            run_streams, base_streams = calibrate(
                args, extra, tokens, ramp, (run_streams, base_streams), Path(d)
            )
        with ServerProcess(mode, *extra) as srv:
            run = measure_run(
                srv.base_url.removesuffix("/v1"),
                run_streams,
                args.duration,
                args.warmup,
                tokens,
                Path(d),
                ramp,
            )
            told = srv.get_json("/truth") if mode == "paced" else {}
            truth, heads = told.get("requests", {}), told.get("heads", {})
        with ServerProcess(mode, *extra) as srv:
            base = measure_gevent(
                srv.base_url.removesuffix("/v1"), base_streams, args.duration, args.warmup, ramp
            )
        peer = mlperf_round(args, mode, extra, base_streams, tokens, run) if args.mlperf_endpoints else {}
    r = {
        "run_streams": run_streams,
        "base_streams": base_streams,
        "run_rate": run["events"] / run["cpu_s"],
        "run_util": run["cpu_s"] / run["wall_s"] * 100,
        "gevent_rate": base["events"] / base["cpu_s"],
        "gevent_util": base["cpu_s"] / base["window_s"] * 100,
        **peer,
    }
    for label in PEERS:
        if f"{label}_rate" in r:
            r[f"{label}_vs"] = r["run_rate"] / r[f"{label}_rate"]  # the run's events/CPU-s over the peer's
    if mode == "paced":
        r["ttft_added"] = (run["ttft_p99_ms"] or 0) - PACED_TTFT_MS
        r["base_ttft_added"] = (base["ttft_p99_ms"] or 0) - PACED_TTFT_MS
        r["itl"] = run["itl_p99_ms"] or 0.0
        r["ttft_over"], r["read_over"], r["gap_over"], r["matched"] = over_server(run["lines"], truth, heads)
        r["base_gap"] = base["gap_p99_ms"] or 0.0
        late = told.get("lateness_ns") or [0]
        r["server_late"] = float(np.percentile(late, 99)) / 1e6  # its own loop's delay, in every figure
    return r


def _print_part(name: str, mode: str, tokens: int, rounds: list[dict[str, float]]) -> None:
    """A part's figures: medians over its rounds, each ratio with its spread."""

    def med(key: str) -> float:
        return float(np.median([r[key] for r in rounds]))

    line(f"{name}_rounds", len(rounds), "rounds")
    line(f"{name}_run_streams", med("run_streams"), "streams", "{:.0f}")
    line(f"{name}_run_events_per_cpu_s", med("run_rate"), "events/s")
    line(f"{name}_run_cpu_util", med("run_util"), "%", "{:.1f}")
    peer_streams = {
        "gevent": "base_streams",
        "mlperf_benchmark": "base_streams",
        "mlperf_client": "run_streams",
    }
    for label in PEERS:
        if f"{label}_vs" not in rounds[0]:
            continue  # the MLPerf client was not given
        line(f"{name}_{label}_streams", med(peer_streams[label]), "streams", "{:.0f}")
        line(f"{name}_{label}_events_per_cpu_s", med(f"{label}_rate"), "events/s")
        line(f"{name}_{label}_cpu_util", med(f"{label}_util"), "%", "{:.1f}")
        line(f"{name}_run_vs_{label}", med(f"{label}_vs"), "x", "{:.2f}")
        spread = [r[f"{label}_vs"] for r in rounds]
        line(f"{name}_run_vs_{label}_range", f"{min(spread):.2f}-{max(spread):.2f}", "x")
    if mode == "batched":  # per request: what short answers, tool-call turns and high-rate runs cost
        for label in ("run", *(peer for peer in PEERS if f"{peer}_vs" in rounds[0])):
            per_s = med(f"{label}_rate") / tokens
            line(f"{name}_{label}_requests_per_cpu_s", per_s, "requests/s", "{:.0f}")
            line(f"{name}_{label}_us_per_request", 1e6 / per_s, "us", "{:.1f}")
    if mode == "paced":
        line(f"{name}_run_ttft_p99_added", med("ttft_added"), "ms", "{:.2f}")
        line(f"{name}_gevent_ttft_p99_added", med("base_ttft_added"), "ms", "{:.2f}")
        line(f"{name}_run_itl_p99", med("itl"), "ms", "{:.2f}")
        line(f"{name}_run_ttft_p99_over_server", med("ttft_over"), "ms", "{:.2f}")
        line(f"{name}_run_first_token_read_p99_over_server", med("read_over"), "ms", "{:.2f}")
        line(f"{name}_run_gap_p99_over_server", med("gap_over"), "ms", "{:.2f}")
        line(f"{name}_run_requests_matched_to_truth", int(sum(r["matched"] for r in rounds)), "requests")
        line(f"{name}_gevent_gap_p99", med("base_gap"), "ms", "{:.2f}")
        line(f"{name}_server_write_lateness_p99", med("server_late"), "ms", "{:.2f}")


def compiled_modules() -> int:
    """How many of the compiled build's modules a run imports compiled (loadtest/compiled.py)."""
    code = "from loadtest.compiled import compiled_count; print(compiled_count())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--duration", type=float, default=10.0, help="measurement window per part, s")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before the window opens")
    ap.add_argument(
        "--rounds", type=int, default=3, help="run and baseline alternate this many times per part (medians)"
    )
    ap.add_argument("--concurrency", type=int, default=16, help="streams against the batched server")
    ap.add_argument(
        "--paced-concurrency",
        type=int,
        default=400,
        help="the baseline's streams against the paced server (about half its core)",
    )
    ap.add_argument(
        "--paced-run-concurrency",
        type=int,
        default=800,
        help="loadtest run's streams against the paced server (about half its core: the clients are "
        "compared at the same share of a core, where each is a realistic load generator)",
    )
    ap.add_argument(
        "--paced-cpu-share",
        type=float,
        default=50.0,
        help="percent of its core each client runs at against the paced server: before each round a short "
        "pilot of each scales its streams to it (the two counts above are the first guesses); 0: as given",
    )
    ap.add_argument("--framing", choices=("chunked", "coalesced", "content-length"), default="chunked")
    ap.add_argument(
        "--open-rate", type=float, default=500.0, help="arrivals per second of the open-loop part"
    )
    ap.add_argument(
        "--short-concurrency", type=int, default=32, help="streams of the short part (2-token answers)"
    )
    ap.add_argument("--only", choices=("batched", "short", "paced", "open"))
    ap.add_argument(
        "--shared-core",
        action="store_true",
        help="a process spinning on the clients' core throughout, as another job on a CI runner's core: "
        "each client then gets about half of it (give --paced-cpu-share below 50)",
    )
    ap.add_argument(
        "--mlperf-endpoints",
        metavar="PATH",
        help="the MLPerf Endpoints client's inference-endpoint command (Python 3.12+): also measure its "
        "whole benchmark (the baseline's streams) and its HTTP client alone (the run's), tests/bench/mlperf_peer.py",
    )
    ap.add_argument(
        "--mlperf-root", metavar="DIR", default="/", help="a system image to chroot into for that command"
    )
    ap.add_argument(
        "--mlperf-tokenizer",
        metavar="PATH",
        help="a tokenizer folder for its token metrics (inside the image)",
    )
    ap.add_argument(
        "--pure-python",
        action="store_true",
        help="the run's compiled modules as Python (LOADTEST_PURE_PYTHON=1): the compiled build's gain",
    )
    args = ap.parse_args()
    if args.pure_python:
        os.environ["LOADTEST_PURE_PYTHON"] = "1"  # the runs inherit it
    line("run_compiled_modules", compiled_modules(), "modules")
    if args.only in (None, "batched"):
        part(
            f"batched_{args.framing.replace('-', '_')}",
            "batched",
            args.framing,
            (args.concurrency, args.concurrency),
            args,
            250,
        )
    if args.only in (None, "short"):
        streams = (args.short_concurrency, args.short_concurrency)
        part("short", "batched", args.framing, streams, args, SHORT_TOKENS)
    if args.only in (None, "paced"):
        streams = (args.paced_run_concurrency, args.paced_concurrency)
        part("paced", "paced", "chunked", streams, args, PACED_TOKENS)
    if args.only in (None, "open"):
        open_part(args)


if __name__ == "__main__":
    main()
