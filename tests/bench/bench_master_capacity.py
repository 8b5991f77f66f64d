"""How many workers one master keeps up with on one core: N simulated workers' real reports at R records/s.

Each worker's report (every 3 s, as Locust sends them) is built the way a worker builds it: Locust's own
request statistics (its report_to_master listener over RequestStats the records were logged into), then
loadtest's Report (the Recorder's histogram delta and the ShippedLog's zlib-compressed record lines of
the 3·R records finished in the interval), serialized as Locust's rpc Message. The master side is the
real path: a MasterSession over a real Locust MasterRunner, each report unserialized and fired as
Locust's ``worker_report`` event (Locust's stats merge and MasterSession.on_worker_report: merge_wire,
decompression, records-w<i>.jsonl written). The CPU time of that, per report, gives the master's CPU
per 1,000 records/s and the largest N × R one core keeps up with; ``--histograms-only`` measures the
design in which the records stay on the workers and only the histograms travel.

    .venv/bin/python tests/bench/bench_master_capacity.py [--workers 100] [--rate 500] [--intervals 3]
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path

from bench_merge import make_records
from harness import line
from locust.env import Environment
from locust.rpc import Message
from locust.stats import RequestStats, setup_distributed_stats_event_listeners

from loadtest.contracts.messages import Report, to_data
from loadtest.locust.master import MasterSession
from loadtest.locust.settings import RunSettings
from loadtest.locust.shipping import ShippedLog
from loadtest.locust.users import ClosedLoopUser
from loadtest.metrics.recorder import Recorder

REPORT_INTERVAL_S = 3.0  # Locust's worker report interval (locust.runners.WORKER_REPORT_INTERVAL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_report(index: int, records: int, tokens: int, seed: int, with_lines: bool) -> bytes:
    """One worker's serialized report of ``records`` finished requests, built as a worker builds it."""
    recs = make_records(records, tokens, seed)
    env = Environment()
    stats = RequestStats()
    setup_distributed_stats_event_listeners(env.events, stats)
    recorder, shipped = Recorder(per_scenario=True), ShippedLog(None)
    for r in recs:
        recorder.add(r)
        shipped.write(r)
        stats.log_request("CHAT", r.scenario, (r.done_ns - r.scheduled_ns) / 1e6, r.output_tokens)
    data: dict = {}
    env.events.report_to_master.fire(client_id=f"w{index}", data=data)
    lines = shipped.take() if with_lines else b""
    data.update(to_data(Report(index=index, delta=recorder.take_delta(), lines=lines, in_flight=8)))
    data["user_count"], data["user_classes_count"] = 8, {"ClosedLoopUser": 8}
    return Message("stats", data, f"w{index}").serialize()


def master_session(tmp: Path, n: int) -> MasterSession:
    profile = tmp / "p.yaml"
    profile.write_text(
        json.dumps(
            {
                "name": "bench",
                "api": "chat",
                "load": {"concurrency": 8},
                "input_tokens": {"dist": "fixed", "value": 64},
                "output_tokens": {"dist": "fixed", "value": 64},
            }
        )
    )
    settings = RunSettings(
        run_id="bench",
        profile_ref=str(profile),
        host="http://127.0.0.1:1",
        out_dir=str(tmp),
        duration_s=60,
        seed=1,
    )
    env = Environment(user_classes=[ClosedLoopUser], host=settings.host)
    runner = env.create_master_runner("127.0.0.1", _free_port())
    session = MasterSession(settings, runner, env, n)
    session.listen()
    for i in range(n):  # as Locust's worker_connect event announces each worker
        session.on_connect(f"w{i}")
    assert sorted(session.workers) == list(range(n))
    return session


def cpu_per_report(session: MasterSession, blobs: list[bytes], n: int, intervals: int) -> float:
    """Mean master CPU seconds per report over ``intervals`` rounds of ``n`` workers' reports."""
    fire = session.env.events.worker_report.fire
    cpu0 = time.process_time()
    for k in range(intervals):
        for i in range(n):
            msg = Message.unserialize(blobs[(i + k) % len(blobs)])
            fire(client_id=f"w{i}", data=msg.data)
    return (time.process_time() - cpu0) / (intervals * n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=100, help="simulated workers (N)")
    ap.add_argument("--rate", type=float, default=500.0, help="records/s each worker finishes (R)")
    ap.add_argument(
        "--tokens", type=int, default=250, help="output tokens per request (chunk times per line)"
    )
    ap.add_argument("--intervals", type=int, default=3, help="report rounds of every worker measured")
    ap.add_argument("--variants", type=int, default=3, help="distinct reports built (round-robin)")
    args = ap.parse_args()
    n, rate = args.workers, args.rate
    per_report = max(1, round(rate * REPORT_INTERVAL_S))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        results: dict[str, float] = {}
        for mode, with_lines in (("shipped", True), ("histograms_only", False)):
            blobs = [worker_report(v, per_report, args.tokens, v, with_lines) for v in range(args.variants)]
            (tmp / mode).mkdir()
            session = master_session(tmp / mode, n)
            try:
                cpu = cpu_per_report(session, blobs, n, args.intervals)
                merged = session.total.all.completed
                expected = n * args.intervals * per_report
                assert merged == expected, (merged, expected)  # every record merged, none twice
                if with_lines:
                    written = sum(session.sink.counts.values())
                    assert written == expected, (written, expected)
            finally:
                session.sink.close()
                session.runner.quit()
            results[mode] = cpu
            line(f"{mode}_report_bytes", sum(len(b) for b in blobs) / len(blobs), "bytes")
            line(f"{mode}_master_cpu_per_report_ms", cpu * 1e3, "ms", "{:.2f}")
            # one core is busy cpu/interval per worker: per 1,000 records/s of the whole fleet
            core_per_krps = cpu / REPORT_INTERVAL_S / (rate / 1000)
            line(
                f"{mode}_master_core_share_per_1k_records_per_s", core_per_krps * 100, "% of a core", "{:.2f}"
            )
            max_workers = REPORT_INTERVAL_S / cpu
            line(f"{mode}_max_workers_one_core_at_{rate:g}_rps", max_workers, "workers", "{:.0f}")
            line(f"{mode}_max_records_per_s_one_core", max_workers * rate, "records/s", "{:.0f}")
            load = n * cpu / REPORT_INTERVAL_S
            line(f"{mode}_core_load_at_{n}x{rate:g}", load * 100, "% of a core", "{:.1f}")
            line(f"{mode}_keeps_up_at_{n}x{rate:g}", "yes" if load < 1.0 else "no")
        for mode, cpu in results.items():  # 1,000 workers at R each: the cores one master needs
            line(f"{mode}_master_cores_for_1000x{rate:g}", 1000 * cpu / REPORT_INTERVAL_S, "cores", "{:.2f}")


if __name__ == "__main__":
    main()
