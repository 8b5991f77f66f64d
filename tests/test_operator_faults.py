"""What an operator or a crash does to a run: signals mid-run, a killed worker, a log cut mid-line, no disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from loadtest.results import record_log
from loadtest.sim import SimProcess
from tests.conftest import child_pids, ended_lines, read_lines, run_cli, write_profile
from tests.test_fault_matrix import _stop, start_run

MARGIN_NS = 1_500_000_000  # a response the engine finished this long before the signal has surely arrived


def _wait_records(out: Path, n: int, workers: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = ended_lines(out, "records*.jsonl")
        if len(counts) >= workers and all(c >= n for c in counts):
            return
        time.sleep(0.2)
    raise AssertionError(f"no records in {out}")


@pytest.mark.parametrize(
    ("what", "mode"),
    [
        ("sigkill_worker", "processes2"),
        ("sigkill_worker", "master+2"),
        ("sigterm", "master+2"),
        ("sigint", "single"),
    ],
)
def test_signal_mid_run_keeps_every_finished_request(tmp_path: Path, what: str, mode: str) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        load={"concurrency": 4},
        output_tokens={"dist": "uniform", "min": 20, "max": 120},
        duration_s=9,
    )
    out = tmp_path / "out"
    with SimProcess(speedup=4) as sim:
        master, workers = start_run(mode, ["--profile", str(prof), "--host", sim.base_url], out, tmp_path)
        try:
            _wait_records(out, 2, 1 if mode == "single" else 2)
            time.sleep(2.0)  # well into the run: requests finished before the signal, others in flight
            if what == "sigkill_worker":
                victim = workers[0].pid if workers else child_pids(master.pid, b"loadtest.locust.worker")[0]
                t_signal = time.perf_counter_ns()
                os.kill(victim, signal.SIGKILL)
            else:
                t_signal = time.perf_counter_ns()
                master.send_signal(signal.SIGTERM if what == "sigterm" else signal.SIGINT)
            code = master.wait(timeout=90)
            for w in workers:
                w.wait(timeout=30)
        finally:
            _stop([master, *workers])
        truth = sim.truth()
    log = "".join(p.read_text(errors="replace") for p in sorted(tmp_path.rglob("*.log")))
    assert "Traceback" not in log, log[-3000:]
    assert code == {"sigkill_worker": 1, "sigterm": 143, "sigint": 130}[what], log[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted"
    assert "INTERRUPTED" in (out / "report.html").read_text()
    records = read_lines(sorted(out.glob("records*.jsonl")))
    ids = {r["id"] for r in records}
    assert len(ids) == len(records) == run["metrics"]["requests"]["completed"]
    ok = sum(r["outcome"] == "ok" for r in records)
    assert run["metrics"]["requests"]["ok"] == ok == run["metrics"]["latency_ms"]["e2e"]["count"]
    # Every request the engine finished well before the signal is in the run folder and its counts.
    finished = {
        t["request_id"] for t in truth if t["outcome"] == "ok" and t["done_ns"] < t_signal - MARGIN_NS
    }
    wire_ids = {r["wire_id"] for r in records}  # the engine knows a request by its X-Request-Id
    assert finished and finished <= wire_ids, sorted(finished - wire_ids)[:5]
    if what == "sigkill_worker":
        assert "every request it finished is included" in run["interrupted_reason"]
        # Its streams always have a request out: those, never finished, are counted and said, not lost.
        assert "in flight at its last report (their outcome is unknown)" in run["interrupted_reason"]
        assert not list(out.glob("worker-*.records.jsonl"))  # the insurance copies are folded in


def test_record_log_cut_mid_line_still_loads_and_report_rebuilds(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", duration_s=1.5)
    out = tmp_path / "o"
    with SimProcess(speedup=8) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(out)])
    assert res.returncode == 0, res.stderr
    log = out / "records.jsonl"
    n = len(list(record_log.read_lines([log])))
    data = log.read_bytes()
    log.write_bytes(data[: len(data) - 25])  # a crash cut the last line
    assert len(list(record_log.read_lines([log]))) == n - 1 >= 1
    (out / "report.html").unlink()
    res = run_cli(["report", str(out)])
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert (out / "report.html").stat().st_size > 10_000


def test_unwritable_output_folder_is_one_line_before_the_run(tmp_path: Path, small_profile: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = run_cli(["run", "--profile", str(small_profile), "--out", str(blocker / "run")])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert (
        res.stderr.strip().count("\n") == 0 and "is not writable" in res.stderr and str(blocker) in res.stderr
    )
    assert "running" not in res.stdout and "embedded engine" not in res.stdout  # nothing was started


def test_full_disk_is_one_line_before_the_run(tmp_path: Path, small_profile: Path) -> None:
    """A 1 MiB tmpfs stands for a full disk (CI runs this as root, which may mount one)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True, timeout=10)
    try:
        res = run_cli(["run", "--profile", str(small_profile), "--out", str(mnt / "run")])
    finally:
        subprocess.run(["umount", str(mnt)], check=True, timeout=10)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "MiB free" in res.stderr
    assert "running" not in res.stdout


STORM = r"""
from gevent import monkey; monkey.patch_all()
import gc, json, os, sys, time
import gevent
from loadtest.client.openai import OpenAIClient, PreparedRequest, Timeouts
from loadtest.tokens.tokenizer import get_tokenizer

from loadtest.client.http import Connection
def fds(): return len(os.listdir("/proc/self/fd"))
def conns(): return sum(1 for o in gc.get_objects() if isinstance(o, Connection))
def live(): return sum(1 for o in gc.get_objects() if isinstance(o, gevent.Greenlet) and not o.dead)
tok = get_tokenizer("llama3")
body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
outcomes = {}
def storm(host, i, seconds):
    c = OpenAIClient(host, None, tok, api_key="k", timeouts=Timeouts(connect=2, read=1))
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        rec = c.send(PreparedRequest(f"s{i}-{n}", "chat", body, 1), time.perf_counter_ns(), time.time())
        outcomes[rec.outcome] = outcomes.get(rec.outcome, 0) + 1
        n += 1
    c.close()
hosts = sys.argv[1:]
# A first short storm warms up what stays for the life of the process (the resolver's threads).
gevent.joinall([gevent.spawn(storm, h, i, 0.3) for i in range(30) for h in hosts[:2]])
gc.collect()
gevent.sleep(2.5)
gc.collect()
before = (fds(), live())
outcomes.clear()
gevent.joinall([gevent.spawn(storm, h, i, 3) for i in range(30) for h in hosts])
gc.collect()
gevent.sleep(2.5)  # the timeout watchdog ends once no connection is left to watch
gc.collect()
print(json.dumps({"before": before, "after": (fds(), live()), "conns": conns(), "outcomes": outcomes}))
"""


def test_error_storm_releases_descriptors_and_greenlets(tmp_path: Path) -> None:
    """Refused connections, resets and 503s as fast as they come: afterwards no socket or greenlet is left."""
    import sys

    from tests.fault_servers import FaultServer

    script = tmp_path / "storm.py"
    script.write_text(STORM)
    with (
        SimProcess(speedup=20, faults="reset_before_headers=50%,http_503=50%") as sim,
        FaultServer(["never_answer"]) as hang,
    ):
        refused = FaultServer(["ok"])
        refused.close()  # its port now refuses connections
        res = subprocess.run(
            [sys.executable, str(script), sim.base_url, refused.base_url, hang.base_url],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).parents[1],
        )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["outcomes"]["connect_error"] > 100 and got["outcomes"]["http_5xx"] > 10
    assert got["outcomes"]["timeout"] >= 30
    assert got["after"][0] <= got["before"][0]  # every socket closed
    assert got["after"][1] <= got["before"][1]  # every greenlet ended
    assert got["conns"] == 0  # and no connection object outlives its client
