"""LoadGen's percentile rule (sorted[⌊n·p⌋]) for the histograms' fast path and the record log's exact samples."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.contracts.record_line import RecordLine
from loadtest.metrics import early_stopping as es
from loadtest.metrics import hdr
from loadtest.metrics.samples import LatencySamples
from loadtest.metrics.slo import parse_slos
from loadtest.metrics.verdict import judge

PCTS = (50.0, 90.0, 95.0, 97.0, 99.0, 99.9)
LOADGEN_FRACTIONS = {50.0: 0.5, 90.0: 0.9, 95.0: 0.95, 97.0: 0.97, 99.0: 0.99, 99.9: 0.999}


def loadgen_rule(values: np.ndarray, fraction: float) -> float:
    """loadgen/results.cc: ``sample_latencies[sample_count * percentile]`` after sorting (a size_t index)."""
    ordered = np.sort(values)
    return float(ordered[int(len(ordered) * fraction)])


def lines_for(ttft_us: np.ndarray) -> list[RecordLine]:
    return [
        RecordLine(
            id=str(i), outcome="ok", t=float(i), ttft_us=int(v), e2e_us=int(v) + 50_000, tpot_us=v / 100
        )
        for i, v in enumerate(ttft_us)
    ]


@pytest.mark.parametrize("n", [7, 10, 33, 100, 101, 999, 4321])
def test_both_paths_take_loadgens_sample(n: int) -> None:
    values = np.random.default_rng(n).lognormal(11, 1.0, n).astype(np.int64) + 1
    samples = LatencySamples()
    samples.add(lines_for(values))
    hist = hdr.new_histogram()
    hdr.record_many(hist, values)
    fast = hdr.fast_percentiles(hist, PCTS)
    for p, v in zip(PCTS, fast, strict=True):
        want = loadgen_rule(values, LOADGEN_FRACTIONS[p])
        assert samples.percentile("ttft", p) == want  # exact: the very sample
        assert v == hist.get_highest_equivalent_value(int(want))  # fast: that sample's bucket
        assert want <= v <= want * 1.001 + 1


def test_hdrh_round_rank_differs_where_loadgen_takes_the_next_sample() -> None:
    # n = 10, p50: n·p = 5.0, LoadGen takes sorted[5] (the 6th), hdrh's round(n·p) takes the 5th.
    values = np.arange(1, 11) * 100  # below 2048 µs a bucket holds one value
    hist = hdr.new_histogram()
    hdr.record_many(hist, values)
    assert hdr.value_at(hist, 50) == 600
    assert hist.get_value_at_percentile(50) == 500
    # n = 7, p90: n·p = 6.3 → sorted[6] (the largest); round(6.3) = 6 → the 6th.
    seven = np.arange(1, 8) * 100
    h7 = hdr.new_histogram()
    hdr.record_many(h7, seven)
    assert hdr.value_at(h7, 90) == 700 and h7.get_value_at_percentile(90) == 600


def test_exact_estimate_and_over_limit_count_follow_the_samples() -> None:
    values = np.random.default_rng(5).lognormal(12, 0.5, 3000).astype(np.int64) + 1
    samples = LatencySamples()
    samples.add(lines_for(values))
    ordered = np.sort(values)
    assert samples.estimate("ttft", 0.99) == float(es.percentile_estimate(ordered.tolist(), 0.99))
    limit = float(ordered[2900])
    assert samples.count_above("ttft", limit) == int((values > limit).sum())


def test_verdict_judges_the_exact_sample_not_its_bucket() -> None:
    # 1000 samples; p99 = sorted[990]. Put the limit between the exact sample and its bucket's top.
    values = np.concatenate([np.full(990, 100_000), np.full(10, 1_000_050)])
    samples = LatencySamples()
    samples.add(lines_for(values))
    hist = hdr.new_histogram()
    hdr.record_many(hist, values)
    assert hdr.value_at(hist, 99) > 1_000_050  # the bucket's highest equivalent value is above the sample
    metrics = {
        "requests": {
            "completed": 1000,
            "ok": 1000,
            "failed": 0,
            "error_rate": 0.0,
            "by_outcome": {"ok": 1000},
        },
        "window": {"duration_s": 100.0},
        "latency_ms": {"ttft": {"count": 1000}},
    }
    slos = parse_slos("ttft_p99=1000.06ms")
    by_hist = {c.name: c for c in judge(metrics, {"ttft": hist}, slos).checks}
    by_samples = {c.name: c for c in judge(metrics, {"ttft": hist}, slos, samples=samples).checks}
    assert not by_hist["ttft_p99"].passed
    assert by_samples["ttft_p99"].passed and by_samples["ttft_p99"].value == 1000.05
