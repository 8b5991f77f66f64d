"""`loadtest sweep`: ladders against the embedded engine's model, the rate search, Ctrl-C, sweep.html in chromium."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import time
from math import comb
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from loadtest.cli.main import main
from loadtest.contracts.run_document import read_run_document
from loadtest.contracts.sweep_document import (
    FIGURE_KEYS,
    PointFigures,
    SweepDocument,
    SweepEndpoint,
    SweepPoint,
    write_sweep_document,
)
from loadtest.metrics.verdict import EXIT_CODES
from loadtest.sim import SimProcess
from loadtest.sim.clock import step_time_s
from loadtest.sim.presets import EngineConfig, get_gpu, get_model
from loadtest.sweep import SweepFormatError, load_sweep
from loadtest.sweep.analysis import best_under_slo, knee, pareto_front, saturation
from loadtest.sweep.driver import point_why
from loadtest.sweep.ladder import concurrency_ladder, parse_list, rate_ladder, rate_point
from loadtest.sweep.offline import Election, elect_offline
from loadtest.sweep.search import Bisection
from tests.browser import ARTIFACTS, CHROMIUM, open_in_chromium
from tests.conftest import CLI, interrupt_when, run_cli, write_profile

# The engine of every sweep here: a mixture-of-experts model whose decode step grows with the batch (more
# experts touched), and a running-batch limit of 4, so throughput saturates at 4 streams.
GPU, MODEL, MAX_SEQS = "H200", "mixtral-8x7b", 4
# The ladder runs the engine clock at real speed: a busy machine's scheduling delays (a few ms) stay
# small against 8-20 ms decode steps. The search and Ctrl-C tests need no such accuracy: 6x.
SPEEDUP = 1.0
FAST_SPEEDUP = 6.0
PROMPT, OUTPUT = 64, 16
LADDER = [1, 2, 4, 8, 16, 32, 64]
OFFLINE_C = 16
# sweep.json's keys, and a point's before its figures, as docs/sweep.md lists them (a ladder: no search).
SWEEP_KEYS = (
    "schema_version",
    "kind",
    "mode",
    "status",
    "interrupted_reason",
    "created",
    "tool",
    "profile",
    "profile_path",
    "seed",
    "fingerprint",
    "endpoint",
    "slo",
    "point_duration_s",
    "offline_concurrency",
    "stop_at_saturation",
    "points",
    "knee",
    "best_under_slo",
    "stopped_because",
)
OFFLINE_KEYS = ("offline", "offline_point", "offline_reason")  # a concurrency sweep's Offline point
WINDOW_KEYS = ("window_status", "window_verdict", "window_output_tps")  # the run's reporting window
POINT_KEYS = (
    "index",
    "label",
    "concurrency",
    "rate",
    "offline",
    "dir",
    "status",
    "exit_code",
    "verdict",
    "reason",
    "needs_duration_s",
    "duration_s",
)


def _profile(path: Path) -> Path:
    return write_profile(
        path,
        name="sweep-chat",
        salt=True,  # no prompt reuses another's KV cache, across points too
        input_tokens={"dist": "fixed", "value": PROMPT},
        output_tokens={"dist": "fixed", "value": OUTPUT},
    )


# ---- what the engine's step-time model (loadtest/sim/clock.py) predicts for a closed-loop ladder ----


def _mean_step_s(cfg: EngineConfig, running: int, decoding_self: bool) -> float:
    """Expected engine step time with ``running`` requests of PROMPT in / OUTPUT out in the batch: each
    request spends 1 of its OUTPUT steps prefilling, so k prefills ~ Binomial(n, 1/OUTPUT). For a
    request's own TPOT it decodes itself and the other running - 1 requests are the random ones."""
    n = running - 1 if decoding_self else running
    p = 1.0 / OUTPUT
    total = 0.0
    for k in range(n + 1):
        items = [(PROMPT, 0)] * k + [(1, PROMPT + OUTPUT // 2)] * (n - k + (1 if decoding_self else 0))
        total += comb(n, k) * p**k * (1 - p) ** (n - k) * step_time_s(cfg, items)
    return total


def _predicted(concurrency: list[int]) -> list[SweepPoint]:
    """Per ladder point, in wall-clock units (engine time / SPEEDUP): output tok/s (batch / mean step)
    and TPOT (a request's mean decode step, as ``tpot_p50_ms``: the SLO is on the median); the batch
    is min(concurrency, max_num_seqs)."""
    cfg = EngineConfig(gpu=get_gpu(GPU), model=get_model(MODEL), max_num_seqs=MAX_SEQS)
    out = []
    for i, c in enumerate(concurrency):
        b = min(c, MAX_SEQS)
        out.append(
            SweepPoint(
                index=i,
                label=f"c{c}",
                concurrency=c,
                rate=None,
                status="completed",
                exit_code=0,
                output_tps=b / _mean_step_s(cfg, b, False) * SPEEDUP,
                tpot_p50_ms=_mean_step_s(cfg, b, True) * 1000 / SPEEDUP,
            )
        )
    return out


PREDICTED = _predicted(LADDER)
_TPOT = {p.concurrency: p.tpot_p50_ms or 0.0 for p in PREDICTED}
# The SLO: median TPOT (tokens/s per user for the typical stream) at the geometric mean of the predicted
# TPOT at 2 and at 4 streams, so that a ±20 % error in measured TPOT leaves the verdicts unchanged.
TPOT_P50_LIMIT_MS = round(math.sqrt(_TPOT[2] * _TPOT[4]), 3)
SLO = f"tpot_p50={TPOT_P50_LIMIT_MS}ms"
# Tolerance of the check against the model: the knee and the best point under the SLO within one
# ladder step (a factor of 2 in concurrency) of the predicted ones.
TOLERANCE_STEPS = 1


def _predicted_best() -> int:
    ok = [p for p in PREDICTED if (p.tpot_p50_ms or 0.0) <= TPOT_P50_LIMIT_MS]
    best = max(ok, key=lambda p: p.output_tps or 0.0).concurrency
    assert best is not None
    return best


def _predicted_knee() -> int:
    idx = knee(PREDICTED, "concurrency")
    assert idx is not None
    c = PREDICTED[idx].concurrency
    assert c is not None
    return c


def test_model_prediction_is_what_the_test_relies_on() -> None:
    """The engine model puts the best point under the SLO at 2 streams and the knee at the batch limit."""
    assert _TPOT[1] < _TPOT[2] < TPOT_P50_LIMIT_MS < _TPOT[4] == _TPOT[8] == _TPOT[64]
    assert _predicted_best() == 2
    assert _predicted_knee() == MAX_SEQS
    assert saturation(PREDICTED[:6]) is not None and saturation(PREDICTED[:3]) is None


# ---- a real concurrency ladder against the embedded engine ----


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("ladder")
    prof = _profile(tmp / "sweep-chat.yaml")
    out = tmp / "sweep"
    args = ["sweep", "--profile", str(prof), "--points", ",".join(map(str, LADDER))]
    args += ["--offline-concurrency", str(OFFLINE_C), "--point-duration", "2.5", "--slo", SLO]
    args += ["--out", str(out)]
    args += ["--engine-gpu", GPU, "--engine-model", MODEL, "--engine-max-num-seqs", str(MAX_SEQS)]
    args += ["--engine-speedup", str(SPEEDUP)]
    return out, run_cli(args, timeout=240)


def test_ladder_writes_the_sweep_contract(ladder: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, r = ladder
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    raw = json.loads((out / "sweep.json").read_text())
    doc = load_sweep(out)
    assert msgspec.to_builtins(doc) == raw and load_sweep(out / "sweep.json") == doc
    # The keys docs/sweep.md lists, in its order: a point's place and outcome, then its figures.
    assert list(raw) == [*SWEEP_KEYS, *OFFLINE_KEYS]
    assert list(raw["endpoint"]) == ["url", "embedded", "engine"]
    assert all(list(p) == [*POINT_KEYS, *FIGURE_KEYS, "warm_cache", *WINDOW_KEYS] for p in raw["points"])
    assert (doc.schema_version, doc.kind, doc.mode, doc.status) == (1, "sweep", "concurrency", "completed")
    assert doc.profile == "sweep-chat" and doc.slo == {"tpot_p50": TPOT_P50_LIMIT_MS}
    assert len(doc.fingerprint) == 64  # the profile's own workload fingerprint (docs/sweep.md)
    eng = doc.endpoint.engine
    assert eng is not None and doc.endpoint.embedded is True
    assert doc.endpoint.url.startswith("http://127.0.0.1:")
    assert (eng["gpu"], eng["model"], eng["max_num_seqs"], eng["speedup"]) == (
        "H200-SXM",
        "Mixtral-8x7B",
        4,
        SPEEDUP,
    )
    pts = doc.points
    assert [p.index for p in pts] == list(range(len(pts)))
    assert [p.label for p in pts] == [f"c{c}" for c in LADDER] + ["offline"]
    offline = pts[-1]
    assert offline.concurrency == OFFLINE_C and offline.rate is None and offline.status == "completed"
    for p in pts:
        assert p.dir == f"points/{p.index:02d}-{p.label}"
        if p.status == "skipped":
            assert not (out / p.dir).exists() and p.exit_code is None and p.output_tps is None
            continue
        assert p.status == "completed", p
        run_dir = out / p.dir
        run = read_run_document(run_dir)
        assert (run_dir / "report.html").is_file() and (run_dir / "records.jsonl").stat().st_size > 0
        assert run.config.seed == doc.seed and run.config.profile == doc.profile
        assert run.config.load.concurrency == p.concurrency
        assert run.verdict is not None
        assert p.exit_code == run.verdict.exit_code and p.verdict == run.verdict.status
        # The figures are the judged window's (the default warm-up leaves out the start-up).
        assert run.config.judging is not None and run.config.judging.warmup_source == "default"
        assert run.judged is not None and run.judged_metrics() is run.judged.metrics
        thr, lat = run.judged.metrics.throughput, run.judged.metrics.latency_ms
        assert p.output_tps == thr.output_tokens_per_s > 0
        assert p.tps_per_user == thr.tps_per_user and p.ttft_p90_ms == lat["ttft"].p90
        assert p.tpot_p50_ms == lat["tpot"].p50 and p.e2e_p90_ms == lat["e2e"].p90
        assert run.goodput is not None and p.slo_attainment == run.goodput.attainment and p.error_rate == 0
        # A point that did not pass says why: its verdict's first reason (the real cause).
        assert p.reason == (None if p.verdict == "pass" else run.verdict.reasons[0])
    assert (out / "engine.log").exists() and (out / "sweep.html").is_file()
    assert "knee: c" in r.stdout and "best point under the SLOs: c" in r.stdout


def test_ladder_stops_at_saturation(ladder: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, r = ladder
    doc = load_sweep(out)
    pts = doc.points
    ran = [p for p in pts[:-1] if p.status == "completed"]
    skipped = [p for p in pts if p.status == "skipped"]
    assert doc.stopped_because and doc.stopped_because.startswith("saturated"), doc.stopped_because
    # Throughput stops growing at the batch limit (4): the two steps after it gain < 5 %, so the
    # ladder stops after 16 streams (32 at the latest when noise lifts one step) and skips the rest.
    assert skipped and "c64" in [p.label for p in skipped]
    assert all(p.reason == doc.stopped_because for p in skipped)
    assert max(p.concurrency or 0 for p in ran) < min(p.concurrency or 0 for p in skipped)
    assert saturation(ran) == doc.stopped_because
    assert saturation(ran[:-1]) is None  # it did not stop a point too late


def test_knee_and_best_under_slo_land_where_the_engine_model_says(
    ladder: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = ladder
    doc = load_sweep(out)
    pts = doc.points
    knee_point, best = doc.point(doc.knee), doc.point(doc.best_under_slo)
    assert knee_point is not None and best is not None
    measured_knee, measured_best = knee_point.concurrency or 0, best.concurrency or 0
    for p in pts:  # shown with -s: measured against predicted, wall-clock units
        pred = next((q for q in PREDICTED if q.label == p.label), None)
        if pred and p.status == "completed":
            print(
                f"{p.label}: output tok/s {p.output_tps:.0f} (model {pred.output_tps:.0f}), "
                f"TPOT p50 {p.tpot_p50_ms:.2f} ms (model {pred.tpot_p50_ms:.2f})"
            )
    print(
        f"knee c{measured_knee} (model c{_predicted_knee()}), best c{measured_best} (model c{_predicted_best()})"
    )
    assert abs(math.log2(measured_knee) - math.log2(_predicted_knee())) <= TOLERANCE_STEPS, measured_knee
    assert abs(math.log2(measured_best) - math.log2(_predicted_best())) <= TOLERANCE_STEPS, measured_best
    assert best.verdict == "pass" and (best.tpot_p50_ms or 0.0) <= TPOT_P50_LIMIT_MS
    # By definition: no passing point has more throughput, and every point past the batch limit misses.
    assert all((p.output_tps or 0.0) <= (best.output_tps or 0.0) for p in pts if p.verdict == "pass")
    assert all(p.verdict == "slo_missed" for p in pts if (p.concurrency or 0) > MAX_SEQS and p.verdict)
    # The saturated throughput (offline point) against the model: between half and 110 % of it (the
    # client's own time between requests and a busy machine only lower it).
    cap = PREDICTED[-1].output_tps or 0.0
    assert 0.5 * cap <= (pts[-1].output_tps or 0.0) <= 1.1 * cap, (pts[-1].output_tps, cap)


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless chromium")
def test_sweep_report_in_headless_chromium(
    ladder: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = ladder
    html = (out / "sweep.html").read_text()
    low = html.lower()
    for bad in ('src="http', "src='http", 'href="http', "href='http", 'src="//', 'href="//'):
        assert bad not in low, bad
    doc = load_sweep(out)
    for p in doc.points:
        if p.status == "completed":
            assert f'href="{p.dir}/report.html"' in html
    assert "@media print" in html
    shot = ARTIFACTS / "sweep.png"
    page = open_in_chromium(out / "sweep.html", shot, tmp_path / "chromium", expect_plots=4)
    assert page["errors"] == [], page["errors"]
    assert [u for u in page["requests"] if not u.startswith("data:")] == [page["url"]]
    titles = page["titles"]
    for want in ("tokens/s per user", "TTFT p90", "Throughput against latency", "against load"):
        assert any(want in t for t in titles), (want, titles)
    assert page["plots"] == 4 and page["svgs"] >= 4
    assert shot.stat().st_size > 20_000
    # `loadtest report SWEEP_DIR` rebuilds the page from sweep.json.
    (out / "sweep.html").unlink()
    r = run_cli(["report", str(out)], timeout=60)
    assert r.returncode == 0, r.stderr
    rebuilt = (out / "sweep.html").read_text()
    assert rebuilt.count('class="plotly-graph-div"') == html.count('class="plotly-graph-div"') == 4
    assert all(f">{p.label}<" in rebuilt for p in doc.points)


def _colour_sweep(out: Path) -> SweepDocument:
    """A hand-made sweep.json with a point of every kind: passing, an SLO missed, two invalid (too few
    samples, with their reason), an endpoint failing, and the best point offline."""
    reason = "invalid: not enough evidence for ttft_p99 (met at the raw percentile): 120 samples"

    def point(i: int, c: int, verdict: str, tps: float, per_user: float, **kw: Any) -> SweepPoint:
        return SweepPoint(index=i, label=kw.pop("label", f"c{c}"), concurrency=c, rate=None,
                          status="completed", exit_code=EXIT_CODES[verdict], verdict=verdict,
                          output_tps=tps, tps_per_user=per_user, ttft_p90_ms=40.0 * (i + 1),
                          tpot_p90_ms=1000 / per_user, e2e_p90_ms=900.0 + 100 * i,
                          slo_attainment=1.0, error_rate=0.0, dir=f"points/{i:02d}", **kw)  # fmt: skip

    points = [
        point(0, 1, "invalid", 90.0, 95.0, reason=reason),
        point(1, 2, "pass", 170.0, 90.0),
        point(2, 4, "invalid", 300.0, 80.0, reason=reason),
        point(3, 8, "slo_missed", 420.0, 55.0, reason="SLO missed: tpot_p90: p90 18 ms > 15 ms"),
        point(4, 16, "error_rate", 430.0, 30.0, reason="error rate over limit: error rate 5 % > 1 %"),
        point(5, 32, "pass", 520.0, 70.0, label="offline", offline=True),
    ]
    doc = SweepDocument(schema_version=1, kind="sweep", mode="concurrency", status="completed",
                        interrupted_reason=None, created="2026-12-01T12:00:00+00:00",
                        tool={"name": "loadtest", "version": "0"}, profile="colours", profile_path="p.yaml",
                        seed=0, fingerprint="ab" * 32,
                        endpoint=SweepEndpoint(url="http://127.0.0.1:9", embedded=False, engine=None),
                        slo={"ttft_p99": 2000.0}, point_duration_s=5.0, offline_concurrency=32,
                        stop_at_saturation=True, points=points, knee=3, best_under_slo=5,
                        stopped_because=None)  # fmt: skip
    write_sweep_document(out, doc)
    return doc


SWEEP_PROBE = """(() => {
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  const traces = plots.map(g => g.data.map(t => ({name: t.name, color: t.marker && t.marker.color,
    symbol: t.marker && t.marker.symbol, text: t.text, x: t.x})));
  const rows = [...document.querySelectorAll('table.points tbody tr:not(.why)')].map(tr => {
    const v = tr.querySelector('td.verdict'), why = tr.nextElementSibling;
    const b = tr.getBoundingClientRect();
    return {label: tr.children[1].innerText, verdict: v ? v.innerText : null, height: b.height,
            color: v ? getComputedStyle(v).color : null,
            why: why && why.classList.contains('why') ? why.innerText : ''};
  });
  const box = e => e && e.getBoundingClientRect();
  const hit = (a, b) => !!(a && b && a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom);
  const covered = plots.map(g => hit(box(g.querySelector('.modebar')), box(g.querySelector('g.legend'))));
  return {traces, rows, covered};
})()"""


def test_a_point_too_short_to_judge_is_a_warning_with_the_sweeps_option(tmp_path: Path) -> None:
    """The console line under a point that did not pass: an invalid point's warning says it proves
    nothing and names --point-duration (not run's --duration); a missed SLO its reason; a pass nothing."""
    points = {p.label: p for p in _colour_sweep(tmp_path / "s").points}
    short = msgspec.structs.replace(points["c1"], reason=points["c1"].reason + "; fix: run ≥ 459 requests "
                                    "(about 92 s at this run's 5.0 req/s: --duration 92s)")  # fmt: skip
    line = point_why(short)
    assert line is not None and "warning: c1 cannot be judged, it proves nothing either way" in line
    assert "--point-duration 92s" in line and "--duration 92s" not in line
    assert point_why(points["c8"]) == "       SLO missed: tpot_p90: p90 18 ms > 15 ms"
    assert point_why(points["c2"]) is None


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless chromium")
def test_sweep_colours_tell_invalid_from_missed(tmp_path: Path) -> None:
    """Invalid points are drawn apart from SLO misses (their own colour and hollow symbol) and their rows
    say why; the best point, offline, is in "Throughput against latency"."""
    out = tmp_path / "sweep"
    doc = _colour_sweep(out)
    r = run_cli(["report", str(out)], timeout=60)
    assert r.returncode == 0, r.stderr
    shot = ARTIFACTS / "sweep-colours.png"
    page = open_in_chromium(
        out / "sweep.html", shot, tmp_path / "chromium", expect_plots=4, evaluate=SWEEP_PROBE
    )
    assert page["errors"] == [], page["errors"]
    pareto, _, latency, _ = page["value"]["traces"]
    by_name = {t["name"]: t for t in pareto}
    invalid, missed = by_name["not valid: cannot be judged"], by_name["misses an SLO"]
    assert sorted(invalid["text"]) == ["c1", "c4"] and missed["text"] == ["c8"]
    assert by_name["meets the SLOs"]["text"] == ["c2", "offline"] and by_name["endpoint failing"]["text"] == [
        "c16"
    ]
    colours = {t["name"]: (t["color"], t.get("symbol")) for t in pareto if t.get("color")}
    assert len({c for c, _ in colours.values()}) >= 4  # pass, missed, invalid, failing: each its own
    assert invalid["color"] != missed["color"] and invalid["symbol"].endswith("open")
    # The rows: the invalid points' verdict in the invalid colour, their reason in the notes.
    rows = {row["label"]: row for row in page["value"]["rows"]}
    assert rows["c1"]["verdict"] == "RUN INVALID" and "not enough evidence" in rows["c1"]["why"]
    assert rows["c8"]["verdict"] == "SLO MISSED" and "tpot_p90" in rows["c8"]["why"]
    assert rows["c2"]["why"] == "" and rows["offline"]["why"] == ""
    assert rows["c1"]["color"] == rows["c4"]["color"] != rows["c8"]["color"] != rows["c2"]["color"]
    assert all(row["height"] < 60 for row in rows.values()), [(k, r["height"]) for k, r in rows.items()]
    # The offline point (the best one here) has its own markers in "Throughput against latency".
    offline = [t for t in latency if t["name"].startswith("offline")]
    assert len(offline) == 3 and all(t["x"] == [doc.points[5].output_tps] for t in offline)
    assert page["value"]["covered"] == [False] * 4  # no legend under plotly's modebar
    assert shot.stat().st_size > 20_000


# ---- the search and Ctrl-C, against an engine the test starts (the sweep's --host path) ----


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    sim = SimProcess(gpu=GPU, model=MODEL, max_num_seqs=MAX_SEQS, speedup=FAST_SPEEDUP, stderr_path=log)
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()


def test_search_converges_on_the_highest_passing_rate(engine: SimProcess, tmp_path: Path) -> None:
    """Open loop: TTFT stays near one prefill step until the arrivals approach the batch limit's
    capacity (about 75 req/s here), then requests queue; the search brackets that edge."""
    prof = _profile(tmp_path / "sweep-chat.yaml")
    out = tmp_path / "search"
    r = run_cli(
        ["sweep", "--profile", str(prof), "--host", engine.base_url, "--ladder", "search", "--min", "20"]
        + ["--max", "80", "--tolerance", "0.35", "--max-iterations", "6", "--point-duration", "1"]
        + ["--slo", "ttft_p50=25ms", "--out", str(out)],
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    raw = json.loads((out / "sweep.json").read_text())
    doc = load_sweep(out)
    assert msgspec.to_builtins(doc) == raw and list(raw) == [*SWEEP_KEYS, "search"]
    # --host: no engine of the sweep's own, and the models the endpoint serves
    assert raw["endpoint"]["engine"] is None and doc.endpoint.models
    s, pts = doc.search, doc.points
    assert s is not None and doc.mode == "search" and doc.knee is None and doc.endpoint.embedded is False
    assert doc.stopped_because and doc.stopped_because.startswith("converged"), doc.stopped_because
    lo, hi = s.highest_passing_rate, s.lowest_failing_rate
    assert lo is not None and hi is not None
    # A rate that lacked samples (on a busy machine) is run again, longer: one more point, not one more
    # rate; the search goes on from each rate's last run.
    assert len(pts) == s.runs + s.lengthened_runs
    pts = [p for i, p in enumerate(pts) if all(q.rate != p.rate for q in pts[i + 1 :])]
    assert lo < hi and hi - lo <= 0.35 * hi and len(pts) == s.runs <= 6
    assert [p.rate for p in pts[:2]] == [20, 80] and all(p.concurrency is None for p in pts)
    rates = [p.rate or 0.0 for p in pts]
    # Every run passed exactly when its rate is at or below the highest passing one.
    assert all((p.verdict == "pass") == (r <= lo) for p, r in zip(pts, rates, strict=True)), [
        (p.rate, p.verdict) for p in pts
    ]
    best = doc.point(doc.best_under_slo)
    assert best is not None and best.rate == lo and best.exit_code == 0
    # Each middle halves the bracket it was run in.
    for i, p in enumerate(pts[2:], start=2):
        below = max(r for q, r in zip(pts[:i], rates, strict=False) if q.verdict == "pass")
        above = min(r for q, r in zip(pts[:i], rates, strict=False) if q.verdict != "pass")
        assert p.rate == pytest.approx((below + above) / 2, abs=1e-3)


def test_ctrl_c_keeps_finished_points_and_marks_the_sweep_interrupted(
    engine: SimProcess, tmp_path: Path
) -> None:
    prof = _profile(tmp_path / "sweep-chat.yaml")
    out = tmp_path / "rates"
    cmd = CLI + ["sweep", "--profile", str(prof), "--host", engine.base_url, "--ladder", "rate"]
    cmd += ["--points", "10,20,30", "--point-duration", "2", "--out", str(out)]
    second = out / "points" / "01-r20" / "records.jsonl"
    code, text, _ = interrupt_when(
        cmd,
        lambda: second.is_file() and second.stat().st_size > 0,  # the second point is under way
        merge_stderr=True,
    )
    assert code == 130, text
    doc = load_sweep(out)
    assert doc.status == "interrupted" and doc.interrupted_reason == "SIGINT"
    first, cut, rest = doc.points
    assert (first.label, first.status, first.rate) == ("r10", "completed", 10.0)
    assert (first.output_tps or 0.0) > 0 and (out / first.dir / "report.html").is_file()
    assert cut.status == "interrupted" and cut.exit_code == 130
    assert read_run_document(out / cut.dir).status == "interrupted"
    assert rest.status == "skipped" and "interrupted (SIGINT)" in (rest.reason or "")
    assert not (out / rest.dir).exists()
    assert doc.stopped_because == "interrupted (SIGINT)"
    assert "INTERRUPTED" in (out / "sweep.html").read_text()


def test_killed_sweep_leaves_a_sweep_json_of_the_points_so_far(engine: SimProcess, tmp_path: Path) -> None:
    """sweep.json is rewritten after every point: a SIGKILLed sweep still has one, and reports rebuild."""
    prof = _profile(tmp_path / "sweep-chat.yaml")
    out = tmp_path / "killed"
    cmd = CLI + ["sweep", "--profile", str(prof), "--host", engine.base_url, "--ladder", "rate"]
    cmd += ["--points", "10,20,30", "--point-duration", "2", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    family: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "sweep.json").is_file() and (out / "points" / "01-r20" / "records.jsonl").is_file():
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the sweep ended before the kill"
        family = psutil.Process(proc.pid).children(recursive=True)  # the running point's processes
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            family = family or psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
            proc.wait(timeout=30)
        for child in family:  # the point that was running when the sweep died
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    doc = load_sweep(out)
    assert doc.status == "running"  # written while the sweep went on; never finished
    assert [p.label for p in doc.points] == ["r10"] and doc.points[0].status == "completed"
    res = run_cli(["report", str(out)])
    assert res.returncode == 0, res.stderr
    assert (out / "sweep.html").is_file() and "r10" in (out / "sweep.html").read_text()


# ---- the parts on their own ----


def _pt(i: int, c: int | None, tps: float, **kw: Any) -> SweepPoint:
    base: dict[str, Any] = {
        "index": i,
        "label": f"c{c}",
        "concurrency": c,
        "rate": None,
        "status": "completed",
    }
    return SweepPoint(**(base | {"output_tps": tps} | kw))


def test_a_point_is_its_place_then_the_figures() -> None:
    """SweepPoint repeats PointFigures' fields after its own: the figures a run gives are a point's."""
    fields = SweepPoint.__struct_fields__
    assert fields[: len(POINT_KEYS)] == POINT_KEYS
    assert (
        fields[len(POINT_KEYS) :]
        == PointFigures.__struct_fields__
        == (*FIGURE_KEYS, "warm_cache", *WINDOW_KEYS)
    )
    p = _pt(0, 1, 12.5, error_rate=0.25)
    assert [p.figure(k) for k in ("output_tps", "error_rate", "ttft_p90_ms")] == [12.5, 0.25, None]


def test_knee_saturation_and_pareto_front() -> None:
    rising = [_pt(i, 2**i, 100.0 * 2**i) for i in range(6)]
    assert knee(rising, "concurrency") is None  # still growing in proportion: no knee
    assert saturation(rising) is None
    flat = [_pt(i, 2**i, min(2**i, 8) * 100.0) for i in range(7)]
    assert knee(flat, "concurrency") == 3  # 8 streams
    assert saturation(flat[:5]) is None and saturation(flat[:6]).startswith("saturated")
    errors = [*rising[:3], _pt(3, 8, 900.0, error_rate=0.4)]
    assert saturation(errors) == "error rate 40.0% at c8 (over 20%)"
    pts = [
        _pt(0, 1, 100.0, tps_per_user=100.0, verdict="pass", exit_code=0),
        _pt(1, 2, 180.0, tps_per_user=90.0, verdict="pass", exit_code=0),
        _pt(2, 4, 170.0, tps_per_user=40.0, verdict="slo_missed", exit_code=10),  # dominated by c2
        _pt(3, 8, 300.0, tps_per_user=35.0, verdict="slo_missed", exit_code=10),
        _pt(4, 16, 0.0, status="skipped"),
    ]
    assert pareto_front(pts) == [3, 1, 0]
    assert best_under_slo(pts) == 1


def test_bisection_finds_the_threshold_within_tolerance() -> None:
    threshold = 37.3
    b = Bisection(lo=5, hi=200, tolerance=0.02, max_iterations=20)
    while (rate := b.next_rate()) is not None:
        b.record(rate, rate <= threshold)
    assert b.done_because.startswith("converged")
    assert b.passed <= threshold < b.failed and b.failed - b.passed <= 0.02 * b.failed
    assert len(b.tried) <= 2 + math.ceil(math.log2(195 / (0.02 * threshold)))
    low = Bisection(lo=50, hi=200)
    low.record(low.next_rate(), False)
    assert low.next_rate() is None and "lowest rate" in low.done_because
    capped = Bisection(lo=1, hi=1000, tolerance=0.001, max_iterations=4)
    while (rate := capped.next_rate()) is not None:
        capped.record(rate, rate < 3)
    assert len(capped.tried) == 4 and "--max-iterations" in capped.done_because
    with pytest.raises(ValueError, match="0 < min < max"):
        Bisection(lo=10, hi=5)


def test_ladders_and_labels() -> None:
    assert concurrency_ladder() == [1, 2, 4, 8, 16, 32, 64, 128]
    assert concurrency_ladder(lo=4, hi=100) == [4, 8, 16, 32, 64, 100]
    assert concurrency_ladder(lo=1, hi=1000, steps=4) == [1, 10, 100, 1000]
    assert rate_ladder(16.0) == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0]
    assert rate_ladder(77.93, steps=3) == [26.0, 52.0, 77.9]
    assert rate_point(12.5).label == "r12.5" and rate_point(1 / 3).rate == 0.3333
    assert rate_point(12345.6).label == "r12350" and rate_point(38.75).label == "r38.75"
    assert parse_list("8, 2,4,2", "--points", integer=True) == [2, 4, 8]
    with pytest.raises(ValueError, match="--points: 'x' is not a whole number"):
        parse_list("1,x", "--points", integer=True)


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = _profile(tmp_path / "p.yaml")
    base = ["sweep", "--profile", str(prof), "--out", str(tmp_path / "s")]
    for extra, message in (
        (["--ladder", "search"], "neither --slo nor"),
        (["--ladder", "rate", "--no-offline"], "needs --max"),
        (["--points", "1,two"], "'two' is not a whole number"),
        (["--min", "2.5"], "a concurrency level is a whole number"),
        (["--tolerance", "0.1"], "apply to --ladder search only"),
    ):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.startswith("loadtest: error:") and err.count("\n") == 1, err
    assert not (tmp_path / "s" / "points").exists()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "sweep.json").write_text('{"kind": "run"}')
    with pytest.raises(SweepFormatError, match="'kind' is not 'sweep'"):
        load_sweep(tmp_path / "bad")
    assert main(["report", str(tmp_path / "bad")]) == 2
    assert "'kind' is not 'sweep'" in capsys.readouterr().err


# ---- the Offline point: dedicated, elected or none; over a dataset, every query at once ----


def test_offline_is_dedicated_at_98_percent_of_c_max_else_c_max_is_elected() -> None:
    ladder = [_pt(0, 1, 100.0), _pt(1, 8, 500.0), _pt(2, 4, 400.0)]
    offline = _pt(3, 40, 490.0, label="offline", offline=True)
    got = elect_offline([*ladder, offline], requested=True)
    assert (got.mode, got.index) == ("dedicated", 3) and "c8" in got.reason
    low = _pt(3, 40, 489.9, label="offline", offline=True)
    got = elect_offline([*ladder, low], requested=True)
    assert (got.mode, got.index) == ("elected", 1) and "c8 stands" in got.reason
    failed = _pt(3, 40, 0.0, label="offline", offline=True, status="failed")
    assert elect_offline([*ladder, failed], requested=True).mode == "elected"
    assert elect_offline(ladder, requested=False) == Election("none", None, "the sweep ran no offline point")
    assert elect_offline([], requested=True).mode == "none"


def test_offline_point_over_a_dataset_is_every_query_at_once_in_whole_passes(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    rows = 40
    prompts = [f"Row {i}: list {i} colours." for i in range(rows)]
    pq.write_table(pa.table({"prompt": prompts, "output_tokens": [8] * rows}), tmp_path / "forty.parquet")
    prof = tmp_path / "ds.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "ds-sweep",
                "seed": 2,
                "duration_s": 60,
                "load": {"concurrency": 1},
                "dataset": {"path": "forty.parquet", "sampling": "with_replacement"},
                "judging": {"generator_health": "warn"},
            }
        )
    )
    out, tree = tmp_path / "sweep", tmp_path / "tree"
    args = ["sweep", "--profile", str(prof), "--points", "1,4", "--point-duration", "2", "--smoke"]
    args += ["--engine-speedup", "20", "--mlperf-endpoints", str(tree), "--out", str(out)]
    data = Path(__file__).parent / "data" / "submission"  # the bundle's declarations (docs/sweep.md)
    args += [
        "--endpoint-file",
        str(data / "endpoint.yaml"),
        "--seed-set",
        f"{data / 'seedset.yaml'}:2026-10-C1:A",
    ]
    r = run_cli(args, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = load_sweep(out)
    assert doc.offline_concurrency == rows
    off = doc.points[-1]
    assert off.offline and off.concurrency == rows and off.status == "completed"
    run = read_run_document(out / off.dir)
    assert run.metrics.requests.completed == rows  # one whole pass, all of it at once
    assert run.reporting_window is not None and run.reporting_window.super_pass_size == rows
    assert all(p.window_status is not None and p.window_verdict is not None for p in doc.points)
    election = elect_offline(doc.points, requested=True)
    assert (doc.offline, doc.offline_point, doc.offline_reason) == (
        election.mode,
        election.index,
        election.reason,
    )
    assert doc.offline in ("dedicated", "elected") and f"offline: {doc.offline}" in r.stdout
    cmax = next(p for p in doc.points if p.concurrency == 4)
    assert (doc.offline == "dedicated") == (off.output_tps >= 0.98 * cmax.output_tps)
    curve = next((tree / "results").iterdir())
    model = next(curve.iterdir())
    points = {f.name: yaml.safe_load((f / "point.yaml").read_text()) for f in model.iterdir()}
    standing = {name: p["offline"] for name, p in points.items()}
    if doc.offline == "dedicated":
        assert standing == {"r1": "none", "r4": "none", f"r{rows}": "dedicated"}
        offline = points[f"r{rows}"]
        assert offline["concurrency"] == rows and offline["runtime_settings"]["load_pattern"] == "offline"
    else:  # an elected C_max: the offline run is no point of the bundle, and the sweep says why
        assert standing == {"r1": "none", "r4": "elected"}
        assert "left out offline: not a dedicated Offline run" in r.stdout and "0.98" in r.stdout
    summary = json.loads((model / "r4" / "result_summary.json").read_text())
    assert summary["reporting_window"]["basis"] == "total"  # 2 s points: never windowable
    assert summary["reporting_window"]["status"] != "windowable"
