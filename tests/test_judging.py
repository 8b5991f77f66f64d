"""The judged window (warm-up, cool-down, steady state), metrics rebuilt from the record log, goodput."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from loadtest.contracts.record_line import LineLike, RecordLine, as_line
from loadtest.metrics.judged import default_warmup_s, steady_state
from loadtest.metrics.judged_scan import JudgedWindow, JudgingScan, LineAggregator
from loadtest.metrics.recorder import RunAggregates
from loadtest.metrics.samples import LatencySamples
from loadtest.metrics.slo import parse_slos
from loadtest.metrics.summary import build_metrics
from loadtest.sim import SimProcess
from tests.conftest import read_lines, run_cli, write_profile


def test_steady_state_finds_the_ramp_and_the_tail() -> None:
    rates = [0, 10, 40, 80] + [100] * 20 + [60, 20, 0]
    first, last = steady_state(rates)
    assert first == 3  # the rolling mean reaches 90 % of the steady level once the ramp is done
    assert 23 <= last <= 25  # and holds until the tail starts falling


def test_steady_state_needs_a_long_enough_run() -> None:
    assert steady_state([5, 5, 5]) == (0, 3)


def _line(i: int, ttft_ms: float, tpot_ms: float, outcome: str = "ok", scenario: str = "a") -> dict:
    return {
        "id": str(i),
        "scenario": scenario,
        "t": 1000.0 + i,
        "outcome": outcome,
        "sent_us": 10,
        "ttft_us": int(ttft_ms * 1000),
        "e2e_us": int(ttft_ms * 1000 + tpot_ms * 1000 * 9),
        "tpot_us": tpot_ms * 1000,
        "chunks_us": [int(ttft_ms * 1000 + k * tpot_ms * 1000) for k in range(10)],
        "output_tokens": 10,
        "prompt_tokens": 5,
    }


def _scan(
    lines: Sequence[LineLike],
    warmup: float | str | None,
    cooldown: float | str,
    slos: str = "error_rate=1%",
    per_scenario: bool = False,
) -> tuple[JudgingScan, JudgedWindow, list[RecordLine]]:
    """The record log's pass one, as run/results.py runs it: the scan, its window, the lines inside it."""
    recs = [as_line(ln) for ln in lines]
    scan = JudgingScan(warmup, cooldown, parse_slos(slos), per_scenario)
    scan.add(recs)
    judged = scan.window()
    return scan, judged, [ln for ln in recs if judged.contains(ln)]


def _aggregate(lines: Sequence[RecordLine], per_scenario: bool = False) -> RunAggregates:
    """Pass two: metrics rebuilt from lines through the recorder a live run uses."""
    agg = LineAggregator(per_scenario)
    agg.add(lines)
    return agg.result()


def test_goodput_counts_requests_meeting_ttft_and_tpot() -> None:
    lines = [_line(0, 100, 10), _line(1, 3000, 10), _line(2, 100, 90), _line(3, 50, 5, scenario="b")]
    lines.append(_line(4, 10, 1, outcome="http_5xx"))
    lines.append(_line(5, 10, 1, outcome="cancelled"))
    scan, judged, _ = _scan(lines, 0.0, 0.0, "ttft_p99=2s,tpot_p99=80ms", per_scenario=True)
    gp = scan.goodput(judged)
    assert gp is not None
    assert (gp["judged"], gp["good"]) == (5, 2)  # cancelled is not judged; the 5xx is not good
    assert gp["attainment"] == 0.4
    assert gp["scenarios"]["b"]["good"] == 1 and gp["scenarios"]["a"]["judged"] == 4
    assert sum(gp["series"]["good"]) == 2
    scan, judged, _ = _scan(lines, 0.0, 0.0, "error_rate=1%")
    assert scan.goodput(judged) is None


def test_fixed_window_cuts_requests_by_schedule_time() -> None:
    lines = [_line(i, 100, 10) for i in range(20)]
    w = _scan(lines, 5.0, 3.0)[1].window
    assert w is not None and (w.start, round(w.end)) == (1005.0, 1016)
    nothing = _scan(lines, 15.0, 10.0)[1]  # nothing left to judge: the whole run is, with a note
    assert nothing.window is None and nothing.note is not None and "leave nothing" in nothing.note


def test_metrics_rebuilt_from_the_record_log_match_the_live_ones(tmp_path: Path, small_profile: Path) -> None:
    with SimProcess(speedup=4) as sim:
        res = run_cli(
            ["run", "--profile", str(small_profile), "--host", sim.base_url, "--out", str(tmp_path / "o")]
        )
    assert res.returncode == 0, res.stderr
    live = json.loads((tmp_path / "o" / "run.json").read_text())["metrics"]
    rebuilt = build_metrics(
        _aggregate([as_line(x) for x in read_lines([tmp_path / "o" / "records.jsonl"])]).all
    )
    assert rebuilt["requests"] == live["requests"]
    assert rebuilt["tokens"] == live["tokens"]
    # schedule_lag: offsets from the scheduled time, in µs both ways: identical histograms
    assert rebuilt["latency_ms"]["schedule_lag"] == live["latency_ms"]["schedule_lag"]
    # TTFT, TPOT and E2E in run.json are the record log's exact samples (LoadGen's rank)
    exact = LatencySamples()
    exact.add([as_line(x) for x in read_lines([tmp_path / "o" / "records.jsonl"])])
    for name in ("ttft", "tpot", "e2e"):
        assert live["latency_ms"][name]["count"] == rebuilt["latency_ms"][name]["count"] == exact.count(name)
        for p in (50.0, 90.0, 99.0):
            key = f"p{p:g}"
            assert live["latency_ms"][name][key] == round((exact.percentile(name, p) or 0) / 1000, 3), (
                name,
                p,
            )
    for name in (
        "ttft",
        "e2e",
        "ttft_send",
        "itl",
        "tpot",
    ):  # the histogram's value of the same rank: within one HDR bucket (µs offsets instead of ns: ±1 µs)
        for p in ("p50", "p90", "p99"):
            live_v = live["latency_ms"][name][p]
            assert abs(rebuilt["latency_ms"][name][p] - live_v) <= 0.002 + 0.002 * live_v, (name, p)


def test_warmup_and_cooldown_shape_the_judged_window(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"rate": 10.0}, duration_s=4)
    with SimProcess(speedup=4) as sim:
        res = run_cli(
            [
                "run",
                "--profile",
                str(prof),
                "--host",
                sim.base_url,
                "--warmup",
                "1s",
                "--cooldown",
                "1",
                "--slo",
                "ttft_p50=10s",
                "--out",
                str(tmp_path / "o"),
            ]
        )
    assert res.returncode in (0, 11), res.stderr  # a p50 needs few requests; 11 only if too few arrived
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    window = run["judged"]["window"]
    assert (window["warmup_s"], window["cooldown_s"]) == (1.0, 1.0)
    recs = read_lines([tmp_path / "o" / "records.jsonl"])
    inside = [r for r in recs if window["start"] <= r["t"] < window["end"]]
    assert run["judged"]["metrics"]["requests"]["completed"] == len(inside) < len(recs)
    assert run["goodput"]["judged"] == len(inside)


def test_live_goodput_counts_agree_with_the_record_log(tmp_path: Path, small_profile: Path) -> None:
    from loadtest.locust.settings import RunSettings
    from loadtest.metrics.slo import RequestSlo, merge_slos

    with SimProcess(speedup=4) as sim:
        res = run_cli(
            [
                "run",
                "--profile",
                str(small_profile),
                "--host",
                sim.base_url,
                "--slo",
                "ttft_p99=40ms,tpot_p99=1s",
                "--processes",
                "2",
                "--warmup",
                "0",  # the whole run: the live counters count every request, like the record log
                "--out",
                str(tmp_path / "o"),
            ]
        )
    assert res.returncode in (0, 10, 11), res.stderr
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    recs = read_lines(sorted((tmp_path / "o").glob("records*.jsonl")))
    rule = RequestSlo.from_slos(merge_slos({}, "ttft_p99=40ms,tpot_p99=1s"))
    good = sum(1 for r in recs if r["outcome"] != "cancelled" and rule.is_good(r))
    assert run["goodput"]["good"] == good
    live = run["metrics"]["slo_live"]  # counted by the workers as requests finished, merged on the master
    assert (live["judged"], live["good"]) == (run["goodput"]["judged"], good)
    assert RunSettings.__dataclass_fields__["slo"].default is None


def test_default_warmup_is_a_tenth_of_the_schedule_capped() -> None:
    assert default_warmup_s(30.0) == 3.0 and default_warmup_s(600.0) == 30.0 and default_warmup_s(0.0) == 0.0
    lines = [_line(i, 100, 10) for i in range(40)]  # scheduled at 1000 ... 1039
    _, jr, inside = _scan(lines, None, 0.0)
    assert jr.window is not None and jr.window.warmup_s == 3.9 and jr.config["warmup_source"] == "default"
    assert [r.t for r in inside][0] == 1004.0
    assert _aggregate(inside).all.completed == 36
    # Set explicitly: 0 judges everything (the old behaviour); a number is used as it is.
    _, jr0, inside0 = _scan(lines, 0.0, 0.0)
    assert jr0.window is None and len(inside0) == 40 and jr0.config["warmup_source"] == "set"
    w10 = _scan(lines, 10.0, 0.0)[1].window
    assert w10 is not None and w10.warmup_s == 10.0


def test_generator_health_is_judged_over_the_steady_state() -> None:
    """The issue's run: the first requests pay the connection set-up (90 ms), every later one < 2.4 ms."""
    lines = [
        {**_line(i, 100, 10), "t": 1000.0 + i * 0.1, "sent_us": 90_000 if i < 3 else 2_000}
        for i in range(100)
    ]
    h = _scan(lines, None, 0.0)[1].health  # the default warm-up of a 9.9 s schedule: 0.99 s
    assert h["whole_run_schedule_lag_p99_ms"] >= 89.0  # judged over the whole run: invalid
    assert h["schedule_lag_p99_ms"] <= 2.1 and h["startup_s"] == 0.99 and h["requests"] == 90
    # Even with --warmup 0 the health check leaves out the start-up.
    jr = _scan(lines, 0.0, 0.0)[1]
    assert jr.window is None and jr.health["schedule_lag_p99_ms"] <= 2.1
    # Nothing after the start-up (every later request was never sent): every request is judged
    # rather than none.
    unsent = [{**ln, "sent_us": None} for ln in lines[3:]]
    h = _scan(lines[:3] + unsent, None, 0.0)[1].health
    assert h["schedule_lag_p99_ms"] >= 89.0 and (h["startup_s"], h["requests"]) == (0.0, 3)


def test_default_warmup_in_a_real_run_and_warmup_0(tmp_path: Path, small_profile: Path) -> None:
    with SimProcess(speedup=4) as sim:
        res = run_cli(
            ["run", "--profile", str(small_profile), "--host", sim.base_url, "--out", str(tmp_path / "d")]
        )
        zero = run_cli(
            ["run", "--profile", str(small_profile), "--host", sim.base_url, "--warmup", "0"]
            + ["--out", str(tmp_path / "z")]
        )
    assert res.returncode == 0 and zero.returncode == 0, res.stderr + zero.stderr
    assert "judged after a 0.3 s warm-up (the default" in res.stdout  # printed at the start
    run = json.loads((tmp_path / "d" / "run.json").read_text())
    cfg = run["config"]["judging"]
    assert cfg["warmup_source"] == "default" and 0 < cfg["warmup_s"] <= 0.3
    assert run["judged"]["window"]["warmup_s"] == cfg["warmup_s"]
    # The raw whole-run figures stay in metrics; the judged window's are in judged.metrics.
    recs = read_lines([tmp_path / "d" / "records.jsonl"])
    assert (
        run["metrics"]["requests"]["completed"]
        == len(recs)
        > run["judged"]["metrics"]["requests"]["completed"]
    )
    health = run["generator_health"]
    assert health["startup_s"] == cfg["generator_health_startup_s"] > 0
    in_flight = {"mean_in_flight", "in_flight_ok_share"}  # over a steady span of 2 s or more
    assert set(health) - in_flight == {
        "startup_s",
        "requests",
        "schedule_lag_p99_ms",
        "whole_run_schedule_lag_p99_ms",
    }
    assert not set(health) & in_flight or set(health) >= in_flight
    lag = next(c for c in run["verdict"]["checks"] if c["name"] == "schedule_lag_p99")
    assert lag["value"] == health["schedule_lag_p99_ms"]
    old = json.loads((tmp_path / "z" / "run.json").read_text())
    assert "judged" not in old and old["config"]["judging"]["warmup_s"] == 0.0
    assert "judged from the first request" in zero.stdout
