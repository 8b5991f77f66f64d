"""Early stopping against scipy, SLO parsing, goodput, verdicts and JUnit output."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from functools import cache

import numpy as np
import pytest

from loadtest.contracts.record_line import as_line
from loadtest.metrics import early_stopping as es
from loadtest.metrics import hdr
from loadtest.metrics.judged_scan import JudgingScan
from loadtest.metrics.recorder import Aggregate
from loadtest.metrics.slo import (
    ErrorRateSlo,
    RequestSlo,
    Slo,
    latency_slos,
    parse_duration_ms,
    parse_percent,
    parse_slos,
)
from loadtest.metrics.summary import build_metrics
from loadtest.metrics.verdict import (
    DEFAULT_ERROR_RATE,
    EXIT_CODES,
    OVERLOADED,
    ValidityRules,
    headline,
    health_warnings,
    judge,
    junit_xml,
)

try:  # the independent reference for early stopping: only the tests marked requires_scipy use it
    from scipy import special as scipy_special
except ImportError:
    scipy_special = None
requires_scipy = pytest.mark.skipif(
    scipy_special is None, reason="SciPy is not installed: scipy.special.betainc is the reference here"
)

PS = (0.9, 0.99, 0.999)
TS = range(51)
ALPHA = 0.01


# ---------------------------------------------------------------- independent reference (scipy)
@cache
def ref_min_passing(t: int, p: float) -> int:
    """Linear search over h = 1, 2, ... with scipy's betainc (vectorized in chunks)."""
    start, size = 1, 4096
    while True:
        hs = np.arange(start, start + size, dtype=np.float64)
        below = np.nonzero(scipy_special.betainc(hs, t + 1, p) < ALPHA)[0]
        if below.size:
            return int(hs[below[0]])
        start += size
        size *= 2


def ref_estimate(sorted_values: list, p: float):
    """Scan t = 1, 2, ... while n ≥ min_passing(t) + t; the estimate is sorted[n − t]."""
    n = len(sorted_values)
    if n < ref_min_passing(1, p) + 1:
        return None
    t = 1
    while n >= ref_min_passing(t + 1, p) + t + 1:
        t += 1
    return sorted_values[n - t]


# ---------------------------------------------------------------- early stopping
@requires_scipy
@pytest.mark.parametrize("p", PS)
def test_odds_matches_scipy(p: float) -> None:
    for t in TS:
        h0 = ref_min_passing(t, p)
        for h in {1, 2, 7, h0 // 2 or 1, h0 - 1 or 1, h0, h0 + 1, 2 * h0, 10 * h0}:
            want = float(scipy_special.betainc(h, t + 1, p))
            assert es.odds(h, t, p) == pytest.approx(want, rel=1e-9, abs=1e-14), (h, t, p)


@requires_scipy
def test_odds_large_arguments() -> None:
    for h, t, p in [(10**6, 9_000, 0.99), (10**7, 100_000, 0.99), (50_000, 40, 0.999)]:
        want = float(scipy_special.betainc(h, t + 1, p))
        assert es.odds(h, t, p) == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_odds_edges_and_errors() -> None:
    assert es.odds(0, 3, 0.99) == 1.0
    assert es.odds(1, 0, 0.9) == pytest.approx(0.9)
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            es.odds(10, 0, bad)
    with pytest.raises(ValueError):
        es.odds(-1, 0, 0.9)


@requires_scipy
@pytest.mark.parametrize("p", PS)
def test_find_min_passing_matches_linear_search(p: float) -> None:
    for t in TS:
        assert es.find_min_passing(t, p) == ref_min_passing(t, p), (t, p)


def test_find_min_passing_known_values() -> None:
    # t = 0: p^h < 0.01  ⇔  h > ln 0.01 / ln p.
    for p in PS:
        assert es.find_min_passing(0, p) == math.floor(math.log(0.01) / math.log(p)) + 1
    assert [es.server_min_queries(p) for p in PS] == [44, 459, 4603]
    # LoadGen's estimate floor, find_min_passing(1, p) + 1 (tests/test_loadgen_summary.py: LoadGen's own)
    assert [es.min_queries_for_percentile(p) for p in PS[:2]] == [64, 662]


@requires_scipy
def test_server_passes_boundary() -> None:
    for p in PS:
        for t in (0, 1, 10, 50):
            need = ref_min_passing(t, p) + t
            assert es.server_passes(need, t, p)
            assert not es.server_passes(need - 1, t, p)


@requires_scipy
@pytest.mark.parametrize("p", PS)
def test_percentile_estimate_matches_reference(p: float) -> None:
    rng = np.random.default_rng(int(p * 1000))
    n_min = es.min_queries_for_percentile(p)
    sizes = [n_min - 1, n_min, n_min + 1, 2 * n_min + 17]
    if p < 0.999:
        sizes.append(20 * n_min + 3)
    for n in sizes:
        values = sorted(rng.lognormal(7.0, 0.6, n).tolist())
        assert es.percentile_estimate(values, p) == ref_estimate(values, p), (n, p)
    assert es.percentile_estimate([], p) is None


def test_percentile_estimate_is_conservative() -> None:
    values = sorted(range(1, 10_001))
    for p in (0.9, 0.99):
        est = es.percentile_estimate(values, p)
        assert est is not None and est >= values[int(len(values) * p)]
    # At the floor t = 1 gives the largest sample; one below it, no estimate.
    n = es.min_queries_for_percentile(0.99)
    assert es.percentile_estimate(list(range(n)), 0.99) == n - 1
    assert es.percentile_estimate(list(range(n - 1)), 0.99) is None


@pytest.mark.parametrize("p", PS)
def test_percentile_estimate_from_histogram(p: float) -> None:
    rng = np.random.default_rng(7)
    n = 3 * es.min_queries_for_percentile(p) + 5
    # Values below 2048 are exact at 3 significant figures.
    exact = np.sort(rng.integers(1, 2000, n))
    h = hdr.new_histogram()
    hdr.record_many(h, exact)
    assert es.percentile_estimate_from_histogram(h, p) == es.percentile_estimate(exact.tolist(), p)
    # Wide values: the histogram gives the bucket's highest equivalent value of the same sample.
    wide = np.sort(rng.integers(1_000, 5_000_000, n))
    h2 = hdr.new_histogram()
    hdr.record_many(h2, wide)
    want = h2.get_highest_equivalent_value(int(es.percentile_estimate(wide.tolist(), p)))
    assert es.percentile_estimate_from_histogram(h2, p) == want
    small = hdr.new_histogram()
    hdr.record_many(small, exact[:10])
    assert es.percentile_estimate_from_histogram(small, p) is None


def test_count_above() -> None:
    values = np.arange(1, 2001)
    h = hdr.new_histogram()
    hdr.record_many(h, values)
    for limit in (0, 1, 500, 1999, 2000, 5000):
        assert es.count_above(h, limit) == int((values > limit).sum())


# ---------------------------------------------------------------- SLO parsing
def test_parse_duration_and_percent() -> None:
    assert parse_duration_ms("2s") == 2000.0
    assert parse_duration_ms("80ms") == 80.0
    assert parse_duration_ms("1.5 s") == 1500.0
    assert parse_duration_ms("500us") == 0.5
    assert parse_duration_ms("500µs") == 0.5
    assert parse_duration_ms("0") == 0.0 and parse_duration_ms(0) == 0.0  # 0 is 0 in any unit
    assert parse_percent("0.5%") == pytest.approx(0.005)
    assert parse_percent("100%") == 1.0
    assert parse_percent(0.02) == 0.02
    assert parse_percent("0.01") == 0.01 and parse_percent(0) == 0.0
    for bad in ("2 min", "-1s", "fast", "", "1e3ms", "nan", "250", 12, 2.5, "5%"):
        with pytest.raises(ValueError):
            parse_duration_ms(bad)
    for bad in ("150%", "abc%", "2", "-1%", "1", 1, 1.0, "2s"):
        with pytest.raises(ValueError):
            parse_percent(bad)
    with pytest.raises(ValueError):
        parse_duration_ms(True)  # type: ignore[arg-type]


def test_parse_slos_forms() -> None:
    from_cli = parse_slos("ttft_p99=2s,tpot_p99=80ms,e2e_p90=20s,error_rate=0.5%")
    from_dict = parse_slos({"ttft_p99": "2s", "tpot_p99": "80ms", "e2e_p90": "20 s", "error_rate": 0.005})
    want = [
        Slo("ttft", 99.0, 2000.0),
        Slo("tpot", 99.0, 80.0),
        Slo("e2e", 90.0, 20000.0),
        ErrorRateSlo(0.005),
    ]
    assert from_cli == want
    assert from_dict == want
    assert parse_slos("ttft_send_p99.9=1s , schedule_lag_p50=5ms,") == [
        Slo("ttft_send", 99.9, 1000.0),
        Slo("schedule_lag", 50.0, 5.0),
    ]
    assert parse_slos("") == [] and parse_slos(None) == [] and parse_slos({}) == []
    assert Slo("ttft", 99.9, 1.0).key == "ttft_p99.9"


@pytest.mark.parametrize(
    ("spec", "names", "hint"),
    [
        ("latency_p99=2s", "latency_p99=2s", "Allowed forms"),
        ("ttft=2s", "ttft=2s", "Allowed forms"),
        ("ttft_p99", "ttft_p99", "key=value"),
        ("ttft_p99=2 min", "ttft_p99=2 min", "e.g. 2s, 80ms"),
        ("ttft_p100=2s", "ttft_p100=2s", "strictly between 0 and 100"),
        ("error_rate=150%", "error_rate=150%", "over 100%"),
        ({"tpot_p99": "fast"}, "tpot_p99=fast", "e.g. 2s, 80ms"),
        ({"ttft_p99": True}, "ttft_p99", "e.g. 2s, 80ms"),
    ],
)
def test_parse_slos_rejects(spec, names: str, hint: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_slos(spec)
    assert names in str(e.value)
    assert hint in str(e.value)


@pytest.mark.parametrize(
    ("spec", "fix"),
    [
        ("ttft_p99=2", "ttft_p99=2: give a unit: 2ms or 2s"),
        ({"tpot_p99": 80}, "tpot_p99=80: give a unit: 80ms or 80s"),
        ("e2e_p90=1.5", "e2e_p90=1.5: give a unit: 1.5ms or 1.5s"),
        ("error_rate=1", "error_rate=1: give a unit: 1%"),
        ({"error_rate": 5}, "error_rate=5: give a unit: 5%"),
        ("quality_min=1", "quality_min=1: give a unit: 1%"),
        ("ttft_p99=2%", "a percentage, not a duration"),
        ("error_rate=2s", "a duration, not a percentage"),
        ("tpot_99=80ms", "unknown SLO key (did you mean tpot_p99?)"),
    ],
)
def test_parse_slos_needs_units(spec, fix: str) -> None:
    """A bare number where it could mean two things is refused, with the fix in the first line."""
    with pytest.raises(ValueError) as e:
        parse_slos(spec)
    assert fix in str(e.value).splitlines()[0]


def test_latency_slos_from_stored_milliseconds() -> None:
    """run.json and sweep.json keep limits as plain milliseconds: read back without the unit rule."""
    stored = {
        "tpot_p50": 80.0,
        "error_rate": 0.01,
        "ttft_p99.9": 2000.0,
        "quality_min": 0.99,
        "e2e_p99": 1e-05,
    }
    assert latency_slos(stored) == [
        Slo("tpot", 50.0, 80.0),
        Slo("ttft", 99.9, 2000.0),
        Slo("e2e", 99.0, 1e-05),
    ]


def test_parse_slos_duplicate() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_slos("ttft_p99=2s,ttft_p99=1s")


# ---------------------------------------------------------------- goodness, attainment, goodput
def _rec(outcome="ok", ttft_us=100_000, tpot_us=20_000.0, t=1000.0, e2e_us=2_000_000, out=100):
    return {
        "outcome": outcome,
        "ttft_us": ttft_us,
        "tpot_us": tpot_us,
        "t": t,
        "e2e_us": e2e_us,
        "output_tokens": out,
    }


def test_request_slo() -> None:
    slo = RequestSlo(ttft_ms=200.0, tpot_ms=30.0)
    assert slo.is_good(_rec())
    assert not slo.is_good(_rec(outcome="http_5xx"))
    assert not slo.is_good(_rec(ttft_us=200_001))
    assert slo.is_good(_rec(ttft_us=200_000))
    assert not slo.is_good(_rec(tpot_us=30_000.5))
    assert slo.is_good(_rec(tpot_us=None))
    assert not slo.is_good(_rec(ttft_us=None))
    assert RequestSlo().is_good(_rec(ttft_us=None))
    assert RequestSlo.from_slos(parse_slos("ttft_p50=1s,ttft_p99=2s,tpot_p90=50ms,e2e_p99=9s")) == RequestSlo(
        2000.0, 50.0
    )


def test_attainment_and_goodput_through_the_scan() -> None:
    """Goodput as the run computes it (metrics/judged_scan): cancelled requests are not judged, a failed
    one is judged and not good, good tokens are the server's count else the client's, per second of the
    span from the first scheduled to the last completed request."""
    recs = [
        _rec(t=1000.0, out=10),  # done 1002: good
        _rec(t=1001.0, ttft_us=300_000, out=20),  # done 1003: bad
        _rec(t=1002.0, outcome="timeout", out=0),  # done 1004: judged, bad
        _rec(t=1003.0, outcome="cancelled"),  # not judged
        _rec(t=1004.0, out=30),  # done 1006: good
        _rec(t=1020.0, out=40),  # done 1022: good
    ]
    scan = JudgingScan(0.0, 0.0, parse_slos("ttft_p99=200ms"), per_scenario=False)
    scan.add([as_line(r) for r in recs])
    gp = scan.goodput(scan.window())
    assert gp is not None and gp["rule"] == {"ttft_ms": 200.0, "tpot_ms": None}
    assert (gp["judged"], gp["good"], gp["attainment"]) == (5, 3, 0.6)
    assert gp["good_requests_per_s"] == pytest.approx(3 / 22, abs=1e-4)
    assert gp["good_output_tokens_per_s"] == pytest.approx(80 / 22, abs=1e-3)
    empty = JudgingScan(0.0, 0.0, parse_slos("ttft_p99=200ms"), per_scenario=False)
    assert empty.goodput(empty.window()) is None


# ---------------------------------------------------------------- verdicts
SLOS = "ttft_p99=2s,tpot_p99=80ms,error_rate=1%"


def make_run(
    n: int = 3000,
    ttft_over: int = 2,
    tpot_over: int = 2,
    errors: int = 0,
    duration_s: float = 700.0,
    mismatched: int = 0,
    usage_reports: int | None = None,
    lag_ms: float = 3.0,
):
    """A run built through the real Aggregate and build_metrics: (metrics, histograms)."""
    rng = np.random.default_rng(n + ttft_over + tpot_over)
    agg = Aggregate()
    ttft = rng.integers(100_000, 1_500_000, n)
    ttft[:ttft_over] = 2_500_000
    tpot = rng.integers(10_000, 60_000, n)
    tpot[:tpot_over] = 90_000
    hdr.record_many(agg.hists["ttft"], ttft)
    hdr.record_many(agg.hists["tpot"], tpot)
    hdr.record_many(agg.hists["e2e"], ttft + 100 * tpot)
    hdr.record_many(agg.hists["schedule_lag"], np.full(n + errors, int(lag_ms * 1000)))
    agg.outcomes.update({"ok": n, "http_5xx": errors})
    agg.totals.update(
        {
            "output_tokens": 100 * n,
            "usage_reports": n if usage_reports is None else usage_reports,
            "token_mismatch_requests": mismatched,
        }
    )
    agg.extend_window(1_000_000.0, 1_000_000.0 + duration_s)
    return build_metrics(agg), agg.hists


def test_pass() -> None:
    metrics, hists = make_run()
    v = judge(
        metrics, hists, SLOS, ValidityRules(min_duration_s=600, min_queries=1000), {"cpu_max_percent": 40}
    )
    assert v.status == "pass" and v.exit_code == 0 and v.passed
    assert v.reasons == []
    names = [c.name for c in v.checks]
    assert names == [  # by cause: the endpoint, validity, the generator's health, the SLOs, flags
        "successful_requests",
        "error_rate",
        "min_duration",
        "min_queries",
        "schedule_lag_p99",
        "generator_cpu",
        "ttft_p99",
        "early_stopping.ttft_p99",
        "tpot_p99",
        "early_stopping.tpot_p99",
        "token_agreement",
    ]
    ttft = v.checks[names.index("ttft_p99")]
    assert ttft.kind == "slo" and ttft.value is not None and ttft.value <= 2000
    assert "early-stopping estimate" in ttft.detail
    # The estimate is the histogram estimate in ms.
    est = es.percentile_estimate_from_histogram(hists["ttft"], 0.99)
    assert f"{round(est / 1000, 3):g} ms" in ttft.detail
    # Mapping and parsed forms give the same verdict.
    v2 = judge(metrics, hists, parse_slos(SLOS), ValidityRules(), None)
    assert v2.status == "pass"


def test_fail_on_one_metric() -> None:
    metrics, hists = make_run(tpot_over=150)  # 5 % over the TPOT limit
    v = judge(metrics, hists, SLOS, ValidityRules(), {})
    assert v.status == "slo_missed" and v.exit_code == 10
    assert v.reasons[0].startswith("SLO missed: tpot_p99")
    failed = {c.name for c in v.checks if not c.passed}
    assert "tpot_p99" in failed and "ttft_p99" not in failed
    # Early stopping also fails, but only as a note: the missed SLO is the result.
    es_check = next(c for c in v.checks if c.name == "early_stopping.tpot_p99")
    assert not es_check.passed and not es_check.blocking


def test_too_short_and_too_few_queries() -> None:
    metrics, hists = make_run(duration_s=30.0)
    v = judge(metrics, hists, SLOS, ValidityRules(min_duration_s=600), {})
    assert v.status == "invalid" and v.exit_code == 11
    assert any("min_duration" in r and "30 s" in r for r in v.reasons)
    v = judge(metrics, hists, SLOS, ValidityRules(min_queries=5000), {})
    assert v.status == "invalid"
    assert any("min_queries" in r and "3000" in r for r in v.reasons)


def test_not_enough_evidence() -> None:
    metrics, hists = make_run(n=200, ttft_over=0, tpot_over=0)  # p99 needs ≥ 459 samples
    v = judge(metrics, hists, SLOS, ValidityRules(), {})
    assert v.status == "invalid"
    assert any("ttft_p99" in r and "not enough evidence" in r for r in v.reasons)
    raw = next(c for c in v.checks if c.name == "ttft_p99")
    assert raw.passed and "no early-stopping estimate" in raw.detail
    # Without histograms the early stopping cannot be applied: also not enough evidence.
    metrics, _ = make_run()
    v = judge(metrics, {}, "ttft_p99=2s", ValidityRules(), {})
    assert v.status == "invalid" and "not enough evidence" in v.reasons[0]


def test_reasons_are_short_one_per_cause_each_with_its_fix() -> None:
    """Too short and too few samples for two SLOs: one sentence per validity check, one sentence for the
    evidence of both SLOs (not one each), every one with its fix, and a headline naming the causes."""
    metrics, hists = make_run(n=200, ttft_over=0, tpot_over=0, duration_s=40.0)
    v = judge(metrics, hists, SLOS, ValidityRules(min_duration_s=600, min_queries=300), {})
    assert v.status == "invalid"
    assert [r.split(":")[1].strip() for r in v.reasons] == [
        "min_duration",
        "min_queries",
        "not enough evidence for ttft_p99, tpot_p99 (met at the raw percentile)",
    ]
    assert all("; fix: " in r and len(r) < 200 for r in v.reasons), v.reasons
    assert "fix: --duration 600s or longer" in v.reasons[0]
    # 200 samples in 40 s: 5 a second, so 300 queries take 60 s and the 459 samples a p99 needs 92 s.
    assert "fix: run ≥ 300 requests (about 60 s at this run's 5.0 req/s: --duration 60s)" in v.reasons[1]
    need = es.server_min_queries(0.99)
    assert f"200 samples, early stopping needs ≥ {need}" in v.reasons[2]
    assert f"fix: run ≥ {need} requests (about {math.ceil(need / 5)} s" in v.reasons[2]
    assert sum(r.count("early stopping") for r in v.reasons) == 1
    assert headline(v.status, v.checks) == "too short; too few samples to prove ttft_p99, tpot_p99"
    # A missed SLO is the result: its early-stopping check stays in the checks, out of the reasons.
    missed = judge(*make_run(tpot_over=150), SLOS, ValidityRules(), {})
    assert missed.reasons == [r for r in missed.reasons if "early stopping needs" not in r]
    assert headline(missed.status, missed.checks) == "tpot_p99 over the limit"
    passed = judge(*make_run(), SLOS, ValidityRules(), {})
    assert headline(passed.status, passed.checks) == "every check passed"
    # An overloaded generator: the fix says how to give it room.
    slow = judge(*make_run(lag_ms=80.0), SLOS, ValidityRules(), {})
    assert "fix: give the generator more room: --processes N" in slow.reasons[0]
    assert headline(slow.status, slow.checks) == "the load generator was overloaded"


def test_generator_overloaded() -> None:
    metrics, hists = make_run(lag_ms=80.0)
    v = judge(metrics, hists, SLOS, ValidityRules(), {})  # lag p99 from metrics
    assert v.status == "invalid" and OVERLOADED in v.reasons[0]
    metrics, hists = make_run()
    v = judge(metrics, hists, SLOS, ValidityRules(), {"schedule_lag_p99_ms": 51.0, "cpu_max_percent": 20})
    assert v.status == "invalid" and OVERLOADED in v.reasons[0]
    v = judge(metrics, hists, SLOS, ValidityRules(), {"schedule_lag_p99_ms": 5.0, "cpu_max_percent": 95})
    assert v.status == "invalid" and OVERLOADED in v.reasons[0] and "95" in v.reasons[0]


def test_a_closed_loop_that_did_not_hold_its_streams_is_the_generators_fault() -> None:
    """13,368 streams asked, 11,184 held on average: a lighter load than the one named, invalid; the
    same run holding 12,500 (94 %) passes; without the figures there is no such check."""
    metrics, hists = make_run()
    health = {"schedule_lag_p99_ms": 1.0, "cpu_percent": 50.0, "streams_asked": 13368}
    short = judge(metrics, hists, SLOS, ValidityRules(), {**health, "mean_in_flight": 11184.0})
    assert short.status == "invalid" and short.exit_code == 11 and OVERLOADED in short.reasons[0]
    assert "streams in flight 11,184 of 13,368 asked on average (84% < 90%)" in short.reasons[0]
    held = judge(metrics, hists, SLOS, ValidityRules(), {**health, "mean_in_flight": 12500.0})
    assert held.status == "pass"
    assert any(c.name == "streams_held" and c.passed for c in held.checks)
    assert not any(c.name == "streams_held" for c in judge(metrics, hists, SLOS, ValidityRules(), {}).checks)


def test_generator_health_warn_reports_the_overload_but_never_blocks() -> None:
    """judging.generator_health: warn — the same overloaded run that fail calls invalid (exit 11) passes,
    with both health checks listed as failed, non-blocking checks and a warning among the reasons."""
    metrics, hists = make_run()
    overloaded = {"schedule_lag_p99_ms": 120.0, "cpu_percent": 99.0, "startup_s": 1.0}
    strict = judge(metrics, hists, SLOS, ValidityRules(generator_health="fail"), overloaded)
    assert strict.status == "invalid" and strict.exit_code == 11
    assert judge(metrics, hists, SLOS, ValidityRules(), overloaded).exit_code == 11  # fail is the default
    assert all(c.blocking for c in strict.checks if c.kind == "health")

    v = judge(metrics, hists, SLOS, ValidityRules(generator_health="warn"), overloaded)
    assert v.status == "pass" and v.exit_code == 0 and v.passed
    health = {c["name"]: c for c in v.to_dict()["checks"] if c["kind"] == "health"}
    assert set(health) == {"schedule_lag_p99", "generator_cpu"}
    assert all(not c["passed"] and not c["blocking"] for c in health.values())
    assert (health["schedule_lag_p99"]["value"], health["schedule_lag_p99"]["limit"]) == (120.0, 50.0)
    assert (health["generator_cpu"]["value"], health["generator_cpu"]["limit"]) == (99.0, 90.0)
    assert len(v.reasons) == 2 and all(r.startswith("warning: ") and OVERLOADED in r for r in v.reasons)
    assert all("not blocking (judging.generator_health: warn)" in r for r in v.reasons)
    assert health_warnings(v) == v.reasons and health_warnings(strict) == []
    # JUnit: passing test cases with the warning in system-out, no failures.
    suite = ET.fromstring(junit_xml(v).encode()).find("testsuite")
    assert suite is not None and suite.get("failures") == "0"
    lag = next(c for c in suite.findall("testcase") if c.get("name") == "schedule_lag_p99")
    assert lag.find("failure") is None and "warning: " in (lag.findtext("system-out") or "")
    # warn relaxes only the generator's health: the other causes still decide the exit code.
    short = judge(
        metrics, hists, SLOS, ValidityRules(min_duration_s=10_000, generator_health="warn"), overloaded
    )
    assert short.status == "invalid" and short.reasons[0].startswith("invalid: min_duration")
    missed = judge(*make_run(tpot_over=150), SLOS, ValidityRules(generator_health="warn"), overloaded)
    assert missed.status == "slo_missed" and missed.exit_code == 10


def test_error_rate_over_limit() -> None:
    metrics, hists = make_run(errors=100)
    v = judge(metrics, hists, SLOS, ValidityRules(), {})
    assert v.status == "error_rate" and v.exit_code == 12
    assert v.reasons[0].startswith("error rate over limit")


def test_precedence() -> None:
    metrics, hists = make_run(errors=100, tpot_over=150)
    v = judge(metrics, hists, SLOS, ValidityRules(), {})
    assert v.status == "error_rate"
    assert [r.split(":")[0] for r in v.reasons[:2]] == ["error rate over limit", "SLO missed"]
    metrics, hists = make_run(tpot_over=150)  # no errors: invalid outranks the missed SLO
    v = judge(metrics, hists, SLOS, ValidityRules(min_duration_s=10_000), {"cpu_max_percent": 99})
    assert v.status == "invalid" and v.exit_code == 11
    assert v.reasons[0].startswith("invalid")
    assert EXIT_CODES == {"pass": 0, "slo_missed": 10, "invalid": 11, "error_rate": 12, "quality_failed": 13}
    # A failing endpoint outranks an invalid run: the generator is not blamed for the endpoint's errors.
    metrics, hists = make_run(errors=100, duration_s=30.0)
    v = judge(metrics, hists, SLOS, ValidityRules(min_duration_s=600), {"cpu_max_percent": 99})
    assert v.status == "error_rate" and v.exit_code == 12
    assert [r.split(":")[0] for r in v.reasons] == ["error rate over limit", "invalid", "invalid"]
    assert OVERLOADED in v.reasons[2] and "min_duration" in v.reasons[1]


def test_token_mismatch_is_flagged_not_failed() -> None:
    metrics, hists = make_run(mismatched=100)  # 3.3 % of 3000
    v = judge(metrics, hists, SLOS, ValidityRules(), {})
    assert v.status == "pass"
    tok = next(c for c in v.checks if c.kind == "tokens")
    assert not tok.passed and not tok.blocking
    assert any(r.startswith("flagged") for r in v.reasons)
    metrics, hists = make_run(usage_reports=0)
    assert not any(c.kind == "tokens" for c in judge(metrics, hists, SLOS, ValidityRules(), {}).checks)


def test_junit_xml_structure() -> None:
    metrics, hists = make_run(errors=100, tpot_over=150, mismatched=100)
    v = judge(metrics, hists, SLOS, ValidityRules(min_duration_s=600), {"cpu_max_percent": 30})
    text = junit_xml(v, "llama <8b> & co", time_s=700.0)
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    for attr in ("name", "tests", "failures", "errors", "skipped", "time"):
        assert attr in suite.attrib and attr in root.attrib
    assert suite.get("name") == "llama <8b> & co"
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) == len(v.checks)
    failures = [f for c in cases for f in c.findall("failure")]
    blocking_failed = [c for c in v.checks if c.blocking and not c.passed]
    assert int(suite.get("failures")) == len(failures) == len(blocking_failed) == 2  # tpot + error_rate
    assert suite.get("errors") == "0" and suite.get("skipped") == "0"
    assert float(suite.get("time")) == 700.0
    for c in cases:
        assert (
            c.get("name")
            and c.get("classname", "").startswith("llama <8b> & co.")
            and c.get("time") is not None
        )
    for f in failures:
        assert f.get("message") and f.get("type") in ("slo_missed", "error_rate")
    kinds = {c.get("classname").rsplit(".", 1)[1] for c in cases}
    assert kinds == {"endpoint", "validity", "health", "slo", "tokens"}
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"status": "error_rate", "exit_code": "12"}
    # The flagged token check is a passing testcase with its warning in system-out.
    tok = next(c for c in cases if c.get("name") == "token_agreement")
    assert tok.find("failure") is None and "flagged" in tok.findtext("system-out")
    # Element order inside testsuite: properties first, then testcases (JUnit schema).
    assert [e.tag for e in suite][0] == "properties"
    assert {e.tag for e in suite} == {"properties", "testcase"}


# ---------------------------------------------------------------- a failing endpoint
def test_default_error_rate_limit_applies_without_an_error_rate_slo() -> None:
    metrics, hists = make_run(errors=60)  # 60 of 3060 = 1.96 %
    for slos in (None, "", "ttft_p99=2s"):
        v = judge(metrics, hists, slos, ValidityRules(), {})
        assert v.status == "error_rate" and v.exit_code == 12, slos
        check = next(c for c in v.checks if c.name == "error_rate")
        assert check.limit == DEFAULT_ERROR_RATE == 0.01 and check.kind == "endpoint"
        assert "default limit" in check.detail and "60 of 3060 requests failed" in check.detail
        assert v.reasons[0].startswith("error rate over limit: error rate 1.96 % > 1 %")
    # Below the default limit: a pass; a profile's or --slo's error_rate replaces the default.
    metrics, hists = make_run(errors=10)  # 0.33 %
    assert judge(metrics, hists, None, ValidityRules(), {}).status == "pass"
    metrics, hists = make_run(errors=60)
    v = judge(metrics, hists, "error_rate=5%", ValidityRules(), {})
    assert v.status == "pass" and "default" not in next(c for c in v.checks if c.name == "error_rate").detail
    v = judge(metrics, hists, "error_rate=0.1%", ValidityRules(), {})
    assert v.status == "error_rate"


def _dead_run(failed: int = 57) -> tuple[dict, dict]:
    agg = Aggregate()
    hdr.record_many(agg.hists["schedule_lag"], np.full(failed, 90_000))  # 90 ms: the generator looks bad too
    agg.outcomes.update({"http_4xx": failed})
    agg.add_error_sample("http_4xx", "HTTP 400: model 'x' does not exist")
    agg.extend_window(1_000_000.0, 1_000_020.0)
    return build_metrics(agg), agg.hists


def test_no_successful_request_never_passes_and_is_the_first_reason() -> None:
    metrics, hists = _dead_run()
    # Even with an error-rate SLO that allows everything, and no other SLO: a dead endpoint fails.
    for slos in (None, "error_rate=100%", SLOS):
        v = judge(metrics, hists, slos, ValidityRules(min_queries=1000), {"cpu_percent": 100.0})
        assert v.status == "error_rate" and v.exit_code == 12 and not v.passed, slos
        assert v.reasons[0] == (
            "endpoint failing: no successful requests: 100 % of 57 requests failed "
            "(http_4xx: HTTP 400: model 'x' does not exist)"
        )
        # Everything else that failed is a consequence, named on one line after the cause.
        assert len(v.reasons) == 2 and v.reasons[1].startswith("also failed, as consequences")
        for name in ("min_queries", "schedule_lag_p99", "generator_cpu"):
            assert name in v.reasons[1]
        assert OVERLOADED not in " ".join(v.reasons)
    # The commonest failure from the record log, when given, names the class and message.
    v = judge(metrics, hists, None, ValidityRules(), {}, failure="http_4xx: HTTP 400: bad request")
    assert v.reasons[0].endswith("(http_4xx: HTTP 400: bad request)")
    # Nothing finished at all (every request cancelled by the generator: an interrupt before any answer;
    # requests the endpoint left unanswered at the end are its timeouts, not cancellations): nothing to
    # judge, so the run is invalid and never passes, but the endpoint is not blamed.
    agg = Aggregate()
    agg.outcomes.update({"cancelled": 4})
    v = judge(build_metrics(agg), agg.hists, None, ValidityRules(), {})
    assert v.status == "invalid" and not v.passed and "no request finished" in v.reasons[0]


def test_junit_reports_an_invalid_run_as_an_error_and_a_miss_as_a_failure() -> None:
    metrics, hists = make_run(tpot_over=150)
    short = judge(metrics, hists, None, ValidityRules(min_duration_s=10_000), {})
    assert short.status == "invalid"
    suite = ET.fromstring(junit_xml(short).encode()).find("testsuite")
    case = next(c for c in suite.findall("testcase") if c.get("name") == "min_duration")
    assert case.find("failure") is None and case.find("error").get("type") == "invalid"
    assert suite.get("errors") == "1" and suite.get("failures") == "0"
    missed = judge(metrics, hists, SLOS, ValidityRules(), {})
    assert missed.status == "slo_missed"
    suite = ET.fromstring(junit_xml(missed).encode()).find("testsuite")
    assert suite.get("errors") == "0" and int(suite.get("failures")) >= 1
    assert all(c.find("error") is None for c in suite.findall("testcase"))


def test_stopped_early_leads_the_verdict_and_junit() -> None:
    metrics, hists = _dead_run(20)
    cause = "endpoint failing: 100 % of 20 requests failed (http_4xx: HTTP 400: model 'x' does not exist)"
    v = judge(metrics, hists, SLOS, ValidityRules(), {"schedule_lag_p99_ms": 90.0}, stopped_early=cause)
    assert v.status == "error_rate" and v.exit_code == 12
    assert v.reasons[0] == f"stopped early: {cause}"
    assert [c.name for c in v.checks][:3] == ["stopped_early", "successful_requests", "error_rate"]
    root = ET.fromstring(junit_xml(v).encode())
    first = root.find("testsuite").findall("testcase")[0]
    assert first.get("name") == "stopped_early" and first.get("classname") == "loadtest.endpoint"
    assert first.find("failure").get("message") == f"stopped early: {cause}"
    assert first.find("failure").get("type") == "error_rate"
    # Stopped early after earlier successes: the stop is still a failure, whatever the error rate.
    metrics, hists = make_run(errors=25)  # 0.8 %: under the default limit
    v = judge(metrics, hists, None, ValidityRules(), {}, stopped_early="endpoint failing: the last 25 ...")
    assert v.status == "error_rate" and v.reasons[0].startswith("stopped early:")


def test_reasons_are_ordered_by_cause() -> None:
    metrics, hists = make_run(errors=100, tpot_over=150, duration_s=30.0)
    v = judge(
        metrics,
        hists,
        SLOS,
        ValidityRules(min_duration_s=600),
        {"schedule_lag_p99_ms": 80.0, "startup_s": 3.0},
    )
    heads = [r.split(":")[0] for r in v.reasons]
    assert heads[:4] == ["error rate over limit", "invalid", "invalid", "SLO missed"]
    assert "min_duration" in v.reasons[1] and OVERLOADED in v.reasons[2]
    assert "steady state: the first 3 s left out" in v.reasons[2]
    assert v.status == "error_rate"
