"""Arrival schedules: gamma burstiness, staged ramps, traces, and worker splits that keep one global schedule."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from itertools import islice

import pytest

from loadtest.schedule.arrivals import (
    arrival_offsets,
    split,
    stage_offsets,
    trace_offsets,
    worker_share,
)

STAGES = [(30.0, 100.0, False), (30.0, 300.0, True), (30.0, 300.0, False), (30.0, 0.0, True)]


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_arrivals_hit_rate_and_cv(cv: float) -> None:
    rate = 10.0
    # The mean gap's relative error has sd cv/√n: size n so ±3 % is 3.5 sd (20k arrivals for CV ≤ 1.2).
    n = max(20_000, math.ceil((3.5 * cv / 0.03) ** 2))
    ts = list(islice(arrival_offsets(rate, 7, "gamma", cv), n + 1))
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    mean = statistics.fmean(gaps)
    assert abs(1 / mean - rate) / rate < 0.03
    assert abs(statistics.pstdev(gaps) / mean - cv) / cv < 0.05


def test_constant_and_poisson_shapes() -> None:
    const = list(islice(arrival_offsets(4.0, 1, "constant"), 5))
    assert const == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    ts = list(islice(arrival_offsets(20.0, 1), 20_001))
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    assert abs(statistics.pstdev(gaps) / statistics.fmean(gaps) - 1) < 0.05
    with pytest.raises(ValueError):
        next(arrival_offsets(1.0, 1, "bursty"))


def _count(ts: list[float], a: float, b: float) -> int:
    return sum(a <= t < b for t in ts)


def test_stage_counts_follow_the_integral_of_the_rate() -> None:
    ts = list(stage_offsets(STAGES, 3))
    assert ts == sorted(ts) and ts[-1] < 120
    # Flat 100/s; ramp 100→300; flat 300; ramp 300→0.
    for (a, b), want in {(0, 30): 3000, (30, 60): 6000, (60, 90): 9000, (90, 120): 4500}.items():
        assert abs(_count(ts, a, b) - want) / want < 0.05
    # Within the first ramp the rate grows linearly: halves carry 15·(100+200)/2 and 15·(200+300)/2.
    assert abs(_count(ts, 30, 45) - 2250) / 2250 < 0.05
    assert abs(_count(ts, 45, 60) - 3750) / 3750 < 0.05


def test_stages_ramp_from_zero_and_constant_stages_are_exact() -> None:
    ts = list(stage_offsets([(10.0, 50.0, True), (10.0, 50.0, False)], 0, "constant"))
    assert len(ts) == 250 + 500
    assert _count(ts, 0, 5) == pytest.approx(62.5, abs=1)  # ∫₀⁵ 5t dt
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    assert gaps[-1] == pytest.approx(1 / 50)


def test_trace_offsets_pass_through() -> None:
    assert list(trace_offsets([0, 1.5, 3])) == [0.0, 1.5, 3.0]
    assert list(trace_offsets([0, 2, 4], speed=2)) == [0.0, 1.0, 2.0]


SCHEDULES: dict[str, Callable[[], Iterable[float]]] = {
    "poisson": lambda: arrival_offsets(50.0, 5),
    "constant": lambda: arrival_offsets(50.0, 5, "constant"),
    "gamma": lambda: arrival_offsets(50.0, 5, "gamma", 3.0),
    "stages": lambda: stage_offsets(STAGES[:2], 5, "gamma", 2.0),
    "trace": lambda: trace_offsets([i * 0.37 for i in range(400)]),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("n_workers", [1, 3])
def test_splits_reproduce_the_global_schedule_exactly(name: str, n_workers: int) -> None:
    n = 3000
    full = list(islice(SCHEDULES[name](), n))
    shares = [list(islice(split(SCHEDULES[name](), w, n_workers), n)) for w in range(n_workers)]
    merged = sorted(x for s in shares for x in s if x[0] < n)
    assert merged == list(enumerate(full))
    for w, s in enumerate(shares):
        assert all(i % n_workers == w for i, _ in s)


def test_worker_share_is_split_of_arrival_offsets() -> None:
    a = list(islice(worker_share(5.0, 3, 1, 4, "gamma", 0.5), 50))
    b = list(islice(split(arrival_offsets(5.0, 3, "gamma", 0.5), 1, 4), 50))
    assert a == b and not math.isnan(a[-1][1])
