"""Open-loop arrival schedules, split across workers without changing the global schedule."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Sequence

PROCESSES = ("poisson", "constant", "gamma")


def unit_gaps(seed: int, process: str = "poisson", cv: float = 1.0) -> Iterator[float]:
    """Inter-arrival gaps of a rate-1 renewal process (mean 1; gamma: shape 1/cv², CV ``cv``)."""
    if process not in PROCESSES:
        raise ValueError(f"unknown arrival process {process!r}; choose one of {PROCESSES}")
    rng = random.Random(f"{seed}:arrivals")
    if process == "constant":
        while True:
            yield 1.0
    if process == "poisson":
        while True:
            yield rng.expovariate(1.0)
    if cv <= 0:
        raise ValueError("gamma arrivals need cv > 0")
    k = 1.0 / (cv * cv)
    while True:
        yield rng.gammavariate(k, 1.0 / k)


def arrival_offsets(rate: float, seed: int, process: str = "poisson", cv: float = 1.0) -> Iterator[float]:
    """Seconds since the start of the run at which requests 0, 1, 2, … are scheduled."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if process not in PROCESSES:
        raise ValueError(f"unknown arrival process {process!r}; choose one of {PROCESSES}")
    t = 0.0
    if process == "gamma":
        for gap in unit_gaps(seed, process, cv):
            yield t
            t += gap / rate
        return
    rng = random.Random(f"{seed}:arrivals")
    while True:  # poisson/constant kept draw-for-draw as before (existing schedules unchanged)
        yield t
        t += rng.expovariate(rate) if process == "poisson" else 1.0 / rate


def stage_offsets(
    stages: Sequence[tuple[float, float, bool]], seed: int, process: str = "poisson", cv: float = 1.0
) -> Iterator[float]:
    """Arrival offsets over ``(duration_s, rate, ramp)`` stages; a ramp goes linearly from the previous rate.

    A rate-1 renewal process is mapped through the inverse of the cumulative rate Λ(t) (time
    rescaling), so Poisson gives the non-homogeneous Poisson process of the piecewise-linear rate.
    The first stage ramps from 0. The schedule ends with the last stage.
    """
    segs: list[tuple[float, float, float, float, float, float]] = []  # (t0, Λ0, Λ1, duration, r0, r1)
    t0 = lam = prev = 0.0
    for duration, rate, ramp in stages:
        if duration < 0 or rate < 0:
            raise ValueError("stage durations and rates must be ≥ 0")
        r0 = prev if ramp else rate
        end = lam + duration * (r0 + rate) / 2
        segs.append((t0, lam, end, duration, r0, rate))
        t0, lam, prev = t0 + duration, end, rate
    i = 0
    x = 0.0
    for gap in unit_gaps(seed, process, cv):
        if x >= lam:
            return
        while segs[i][2] <= x:
            i += 1
        s0, l0, _, d, r0, r1 = segs[i]
        yield s0 + _invert_linear(x - l0, d, r0, r1)
        x += gap


def _invert_linear(x: float, d: float, r0: float, r1: float) -> float:
    """τ in [0, d] with ∫₀^τ rate = x for a rate going linearly from r0 to r1 over d."""
    a = (r1 - r0) / (2 * d) if d > 0 else 0.0
    root = r0 + math.sqrt(max(0.0, r0 * r0 + 4 * a * x))
    return min(d, 2 * x / root) if root > 0 else 0.0


def trace_offsets(timestamps: Iterable[float], speed: float = 1.0) -> Iterator[float]:
    """A recorded trace's arrival offsets in seconds, replayed ``speed`` times faster."""
    for t in timestamps:
        yield float(t) / speed


def split(offsets: Iterable[float], worker: int, n_workers: int) -> Iterator[tuple[int, float]]:
    """(global index, offset) of this worker's share: every ``n_workers``-th arrival of one global schedule."""
    if not 0 <= worker < n_workers:
        raise ValueError("need 0 ≤ worker < n_workers")
    for i, t in enumerate(offsets):
        if i % n_workers == worker:
            yield i, t


def worker_share(
    rate: float, seed: int, worker: int, n_workers: int, process: str = "poisson", cv: float = 1.0
) -> Iterator[tuple[int, float]]:
    """(global index, offset) of this worker's share of ``arrival_offsets``."""
    return split(arrival_offsets(rate, seed, process, cv), worker, n_workers)
