"""The rate search's third outcome: a point too short to prove its percentiles is rerun longer, not a miss."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.sim import SimProcess
from loadtest.sweep import load_sweep
from loadtest.sweep.search import MAX_LENGTHENINGS, MAX_RERUN_S, Bisection
from tests.conftest import run_cli, write_profile


def test_bisection_reruns_a_rate_that_lacked_samples() -> None:
    b = Bisection(lo=10, hi=80)
    assert b.next_rate() == 10 and b.next_duration() is None
    b.record_insufficient(10, 12.5)  # proved nothing: neither a pass nor a miss
    assert b.done_because is None and b.tried == []
    assert (b.next_rate(), b.next_duration()) == (10, 12.5)
    b.record(10, True)
    assert (b.next_rate(), b.next_duration()) == (80, None)
    b.record(80, False)
    assert b.next_rate() == 45 and b.passed == 10 and b.failed == 80
    stuck = Bisection(lo=1, hi=2)
    for _ in range(MAX_LENGTHENINGS):
        stuck.record_insufficient(1, 100.0)
        assert stuck.next_rate() == 1
    stuck.record_insufficient(1, 400.0)
    assert stuck.next_rate() is None and "--point-duration" in (stuck.done_because or "")
    slow = Bisection(lo=0.1, hi=2)
    slow.record_insufficient(0.1, MAX_RERUN_S + 1)  # a p99 at 0.1 req/s: over an hour of requests
    assert slow.next_rate() is None and "raise --min" in (slow.done_because or "")


def test_search_lengthens_a_point_too_short_for_its_p90(tmp_path: Path) -> None:
    # p90 needs 44 samples (early stopping, 99 % confidence): 8 req/s for 1 s has about 8
    prof = write_profile(
        tmp_path / "p.yaml",
        name="search-chat",
        input_tokens={"dist": "fixed", "value": 64},
        output_tokens={"dist": "fixed", "value": 8},
    )
    out = tmp_path / "search"
    with SimProcess(speedup=8) as sim:
        r = run_cli(
            ["sweep", "--profile", str(prof), "--host", sim.base_url, "--ladder", "search", "--min", "8"]
            + ["--max", "2000", "--max-iterations", "3", "--point-duration", "1"]
            + ["--slo", "ttft_p90=1500ms", "--out", str(out)],
            timeout=240,
        )
    assert r.returncode in (0, 10), r.stdout[-3000:] + r.stderr[-3000:]
    doc = load_sweep(out)
    pts = doc.points
    first, again = pts[0], pts[1]
    assert first.rate == 8 and first.verdict == "invalid" and first.needs_duration_s is not None
    assert first.needs_duration_s >= 44 / 8, first.needs_duration_s  # enough requests at 8 req/s
    assert again.rate == 8 and again.duration_s == first.needs_duration_s
    assert again.label == f"r8-{first.needs_duration_s:.0f}s" and again.needs_duration_s is None
    assert again.verdict == "pass", again
    run = json.loads((out / again.dir / "run.json").read_text())
    assert run["config"]["duration_s"] == again.duration_s
    assert doc.search is not None and doc.search.lengthened_runs >= 1
    assert doc.stopped_because is not None and "lowest rate" not in doc.stopped_because
    assert len(pts) >= 3 and pts[2].rate == 2000  # the search went on to its upper bound


def test_mlperf_server_search_converges(tmp_path: Path) -> None:
    """mlperf-llama3.1-8b-server on the embedded engine (smoke: short points, said to be no result)."""
    out = tmp_path / "mlperf"
    r = run_cli(
        [
            "sweep",
            "--profile",
            "mlperf-llama3.1-8b-server",
            "--ladder",
            "search",
            "--min",
            "4",
            "--max",
            "200",
        ]
        + ["--no-offline", "--tolerance", "0.5", "--max-iterations", "6", "--point-duration", "2", "--smoke"]
        + ["--out", str(out)],
        timeout=400,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = load_sweep(out)
    assert doc.stopped_because is not None and doc.stopped_because.startswith("converged"), (
        doc.stopped_because
    )
    s = doc.search
    assert s is not None and s.highest_passing_rate is not None and s.lowest_failing_rate is not None
    assert 4 <= s.highest_passing_rate < s.lowest_failing_rate <= 200 and s.runs >= 3
