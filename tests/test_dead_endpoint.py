"""A failing endpoint never passes: the default error-rate limit, no successful requests, the closed-loop
backoff, the early stop (single process and --processes), and a sweep that never calls a dead point best."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import msgspec

from loadtest.client.failures import commonest_failure, stopped_early_text
from loadtest.client.record import RequestRecord
from loadtest.contracts.sweep_document import SweepPoint
from loadtest.locust.context import FailingStreak
from loadtest.locust.sending import FAILURE_BACKOFF_FIRST_S, failure_backoff_s
from loadtest.sim import SimProcess
from loadtest.sweep import load_sweep
from loadtest.sweep.analysis import best_search_point, best_under_slo, endpoint_failed, knee
from tests.conftest import read_lines, run_cli, write_profile
from tests.fault_servers import FaultServer

# Low thresholds so that the early stop comes within seconds: 20 failures in a row, none ok for 1 s.
FAST_STOP = {"stop_after_failed": 20, "stop_after_failing_s": 1.0}


def _run(tmp: Path, prof: Path, host: str, *extra: str) -> tuple[Any, dict[str, Any]]:
    out = tmp / "o"
    res = run_cli(["run", "--profile", str(prof), "--host", host, "--out", str(out), *extra])
    assert (out / "run.json").is_file(), res.stdout + res.stderr
    return res, json.loads((out / "run.json").read_text())


# ---------------------------------------------------------------- the parts on their own
def test_backoff_doubles_to_its_cap_and_resets() -> None:
    waits = [failure_backoff_s(n, 1.0) for n in range(8)]
    assert waits[0] == 0.0 and waits[1] == FAILURE_BACKOFF_FIRST_S
    assert all(b == min(1.0, 2 * a) for a, b in zip(waits[1:], waits[2:], strict=False))
    assert waits[-1] == 1.0 and failure_backoff_s(10_000, 1.0) == 1.0
    assert failure_backoff_s(5, 0.0) == 0.0  # client.failure_backoff_max_s: 0 = resend at once


def _rec(outcome: str, error: str = "", sched_ns: int = 1) -> RequestRecord:
    rec = RequestRecord(request_id="r", outcome=outcome, error=error)
    rec.scheduled_ns = sched_ns
    return rec


def test_failing_streak_needs_both_the_count_and_the_time() -> None:
    streak = FailingStreak(min_failed=3, min_seconds=0.0)
    assert not streak.add(_rec("http_5xx", "HTTP 503: busy"))
    assert not streak.add(_rec("cancelled"))  # neither extends nor ends a streak
    assert not streak.add(_rec("http_5xx", "HTTP 503: busy"))
    assert not streak.add(_rec("ok"))  # a success resets it
    assert streak.any_ok and streak.failed == 0
    for _ in range(2):
        assert not streak.add(_rec("http_4xx", "HTTP 400:  bad\nmodel"))
    assert streak.add(_rec("http_4xx", "HTTP 400:  bad\nmodel"))
    info = streak.info(worker=2)
    assert info["failed_in_a_row"] == 3 and info["any_ok"] and info["worker"] == 2
    assert info["commonest"] == "http_4xx: HTTP 400: bad model"
    # The time condition: a streak whose first failure was scheduled just now is not yet long enough.
    import time

    slow = FailingStreak(min_failed=1, min_seconds=3600.0)
    assert not slow.add(_rec("timeout", "no data", sched_ns=time.perf_counter_ns()))
    assert not FailingStreak(min_failed=0, min_seconds=0.0).add(_rec("timeout"))  # 0 = never stop early


def test_stopped_early_text() -> None:
    dead = {"ok": 0, "failed": 57, "cancelled": 0}
    lines = [{"outcome": "http_4xx", "error": "HTTP 400: bad"}] * 3 + [{"outcome": "timeout", "error": "x"}]
    assert commonest_failure(lines) == "http_4xx: HTTP 400: bad"
    text = stopped_early_text({"failed_in_a_row": 57}, dead, commonest_failure(lines))
    assert text == "endpoint failing: 100 % of 57 requests failed (http_4xx: HTTP 400: bad)"
    some = {"ok": 1000, "failed": 40, "cancelled": 0}
    info = {"failed_in_a_row": 40, "seconds": 10.2, "commonest": "connect_error: refused"}
    text = stopped_early_text(info, some, "http_5xx: HTTP 503")
    assert text.startswith("endpoint failing: the last 40 requests failed and none succeeded for 10 s")
    assert "(connect_error: refused)" in text and "3.85 % of 1040 requests failed in all" in text


def _pt(i: int, c: int, tps: float, **kw: Any) -> SweepPoint:
    base: dict[str, Any] = {
        "index": i,
        "label": f"c{c}",
        "concurrency": c,
        "rate": None,
        "status": "completed",
    }
    return SweepPoint(**(base | {"output_tps": tps, "requests_per_s": tps / 10, "error_rate": 0.0} | kw))


def test_sweep_never_picks_a_failed_point_as_best_or_knee() -> None:
    flat = [_pt(i, 2**i, min(2**i, 8) * 100.0, verdict="pass", exit_code=0) for i in range(7)]
    assert knee(flat, "concurrency") == 3 and best_under_slo(flat) in (3, 4, 5, 6)
    # The knee point and every point after it: the endpoint failed there (stopped early, or over its
    # error-rate limit). Neither choice may land on them; the knee's curve leaves them out too.
    failed = [
        *flat[:3],
        _pt(3, 8, 800.0, verdict="error_rate", exit_code=12, error_rate=0.3),
        *[_pt(i, 2**i, 800.0, verdict="error_rate", exit_code=12, error_rate=0.5) for i in range(4, 7)],
    ]
    assert all(endpoint_failed(p) for p in failed[3:])
    assert best_under_slo(failed) == 2 and knee(failed, "concurrency") in (None, 0, 1, 2)
    # A dead point (no ok requests) is never best, even when its verdict says pass (an old run.json).
    dead = [
        _pt(0, 1, 100.0, verdict="pass", exit_code=0),
        _pt(1, 2, 900.0, verdict="pass", exit_code=0, requests_per_s=0.0),
        _pt(2, 4, 950.0, verdict="pass", exit_code=0, error_rate=1.0),
    ]
    assert best_under_slo(dead) == 0
    rates = [
        msgspec.structs.replace(_pt(0, 1, 100.0, verdict="pass", exit_code=0), rate=5.0, concurrency=None),
        msgspec.structs.replace(
            _pt(1, 1, 0.0, verdict="pass", exit_code=0, requests_per_s=0.0), rate=9.0, concurrency=None
        ),
    ]
    assert best_search_point(rates) == 0


# ---------------------------------------------------------------- real runs
def test_fast_4xx_endpoint_backs_off_stops_early_and_fails(tmp_path: Path) -> None:
    """The issue's run: every request answered 4xx at once, closed loop, no SLOs (the default profile)."""
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 2}, duration_s=60, judging=FAST_STOP)
    junit = tmp_path / "junit.xml"
    with FaultServer(["auth_echo"]) as srv:
        res, run = _run(tmp_path, prof, srv.base_url, "--junit", str(junit))
    assert res.returncode == 12, res.stdout + res.stderr
    verdict = run["verdict"]
    assert verdict["status"] == "error_rate" and verdict["exit_code"] == 12
    first = verdict["reasons"][0]
    assert first.startswith("stopped early: endpoint failing: 100 % of "), verdict["reasons"]
    assert "requests failed (http_4xx: HTTP 401" in first
    assert run["notes"][0] == first and run["stopped_early"]["reason"] == first
    assert run["stopped_early"]["failed_in_a_row"] >= 20 and run["stopped_early"]["any_ok"] is False
    assert run["status"] == "completed" and run["interrupted_reason"] is None
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("verdict: ") and "exit 12" in last and "stopped early: endpoint failing" in last
    # Backoff: two streams that resend at once make thousands of requests in seconds; backing off
    # (0.05 s doubling to 1 s) they make a few dozen before the stop.
    records = read_lines([tmp_path / "o" / "records.jsonl"])
    assert 20 <= len(records) < 200 and all(r["outcome"] == "http_4xx" for r in records)
    # The generator is not blamed for the endpoint's failure.
    assert "the load generator, not the endpoint" not in " ".join(verdict["reasons"])
    cases = ET.parse(junit).getroot().find("testsuite").findall("testcase")
    stop = next(c for c in cases if c.get("name") == "stopped_early")
    assert stop.find("failure").get("message") == first


def test_early_stop_with_worker_processes(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 4}, duration_s=60, judging=FAST_STOP)
    with SimProcess(speedup=20, faults="http_503=100%") as sim:
        res, run = _run(tmp_path, prof, sim.base_url, "--processes", "2")
    assert res.returncode == 12, res.stdout + res.stderr
    assert run["stopped_early"]["worker"] in (0, 1) and run["status"] == "completed"
    assert run["verdict"]["reasons"][0].startswith("stopped early: endpoint failing: 100 % of ")
    assert "(http_5xx: HTTP 503" in run["verdict"]["reasons"][0]
    records = read_lines(sorted((tmp_path / "o").glob("records*.jsonl")))
    assert len(records) == run["metrics"]["requests"]["completed"] >= 20  # every worker's requests


def test_default_error_rate_limit_fails_a_run_without_slos(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", duration_s=2)
    with SimProcess(speedup=20, faults="http_503=30%", seed=5) as sim:
        res, run = _run(tmp_path, prof, sim.base_url)
        assert res.returncode == 12, res.stdout + res.stderr
        first = run["verdict"]["reasons"][0]
        assert first.startswith("error rate over limit: error rate ") and "> 1 % (the default limit" in first
        assert "most often http_5xx: HTTP 503" in first and "stopped_early" not in run
        # An explicit error_rate replaces the default.
        res, run = _run(tmp_path / "again", prof, sim.base_url, "--slo", "error_rate=90%")
    assert res.returncode == 0, res.stdout + res.stderr
    assert run["verdict"]["status"] == "pass"


def test_sweep_against_a_dead_endpoint_halts_and_has_no_best_point(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", name="dead-sweep")
    out = tmp_path / "sweep"
    res = run_cli(
        ["sweep", "--profile", str(prof), "--points", "1,2,4", "--point-duration", "1.5"]
        + ["--engine-faults", "http_503=100%", "--engine-speedup", "20", "--out", str(out)],
        timeout=180,
    )
    doc = load_sweep(out)
    assert res.returncode != 0, res.stdout + res.stderr
    assert doc.best_under_slo is None and doc.knee is None
    first, *rest = doc.points
    assert first.verdict == "error_rate" and first.exit_code == 12 and first.error_rate == 1.0
    assert rest and all(p.status == "skipped" for p in rest)  # the offline point too
    assert "the endpoint failed every request" in (doc.stopped_because or "")
    assert "best point under the SLOs: none" in res.stdout
