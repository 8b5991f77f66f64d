"""Open-loop arrival schedules, split across workers without changing the global schedule."""

from __future__ import annotations

import random
from collections.abc import Iterator


def arrival_offsets(rate: float, seed: int, process: str = "poisson") -> Iterator[float]:
    """Seconds since the start of the run at which requests 0, 1, 2, … are scheduled."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(f"{seed}:arrivals")
    t = 0.0
    while True:
        yield t
        t += rng.expovariate(rate) if process == "poisson" else 1.0 / rate


def worker_share(
    rate: float, seed: int, worker: int, n_workers: int, process: str = "poisson"
) -> Iterator[tuple[int, float]]:
    """(global index, offset) of this worker's share: every ``n_workers``-th arrival of the one global schedule."""
    for i, t in enumerate(arrival_offsets(rate, seed, process)):
        if i % n_workers == worker:
            yield i, t
