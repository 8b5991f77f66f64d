"""How long an open-loop run must be for early stopping to prove its SLO percentiles, given the arrivals' spread."""

from __future__ import annotations

import math

from loadtest.metrics import early_stopping as es
from loadtest.metrics.judged import judged_warmup_s

# A run's judged count is random (Poisson or gamma arrivals): the length is chosen so that even a count
# this many standard deviations below its mean still reaches the evidence the percentile needs.
SPREAD_SIGMAS = 2.0


def evidence_requests(p: float) -> int:
    """Requests early stopping needs to prove percentile ``p`` when none is over its limit (p99: 459)."""
    return es.min_queries_for_percentile(p)


def judged_seconds_for(need: int, rate: float, cv: float = 1.0, sigmas: float = SPREAD_SIGMAS) -> float:
    """Judged seconds after which arrivals at ``rate`` per second, inter-arrival CV ``cv`` (1: Poisson),
    give at least ``need`` requests with a margin of ``sigmas`` standard deviations. For a renewal
    process the count over T seconds has mean rate·T and variance about rate·T·cv², so this solves
    rate·T − sigmas·cv·sqrt(rate·T) = need for T."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    b = sigmas * max(cv, 0.0)
    root = (b + math.sqrt(b * b + 4 * need)) / 2  # sqrt(rate·T)
    return root * root / rate


def evidence_duration_s(
    p: float,
    rate: float,
    cv: float = 1.0,
    warmup: float | str | None = None,
    sigmas: float = SPREAD_SIGMAS,
) -> float:
    """The shortest run (whole seconds) whose judged window, after the warm-up ``warmup`` (None: the
    default share), proves percentile ``p`` at ``rate`` arrivals per second with the margin above."""
    judged = judged_seconds_for(evidence_requests(p), rate, cv, sigmas)
    duration = math.ceil(judged)
    while duration - judged_warmup_s(warmup, duration) < judged:
        duration += 1
    return float(duration)
