"""How long a run must be for early stopping to prove its SLO percentiles, and how long its end-of-run drain waits."""

from __future__ import annotations

import math

from loadtest.metrics import early_stopping as es
from loadtest.metrics.judged import judged_warmup_s
from loadtest.metrics.slo import Slo, parse_slos
from loadtest.profile.dists import Empirical, Fixed, Length
from loadtest.profile.schema import Profile

# A run's judged count is random (Poisson or gamma arrivals): the length is chosen so that even a count
# this many standard deviations below its mean still reaches the evidence the percentile needs.
SPREAD_SIGMAS = 2.0


def evidence_requests(p: float) -> int:
    """Requests early stopping needs to prove percentile ``p`` when none is over its limit (p99: 459)."""
    return es.server_min_queries(p)


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


# The end-of-run drain when the profile does not set client.drain_timeout_s and its SLOs do not say
# how long a compliant answer may take; at most MAX_AUTO_DRAIN_S however long the answers.
DEFAULT_DRAIN_S = 60.0
MAX_AUTO_DRAIN_S = 3600.0
DRAIN_MARGIN = 1.1


def longest_output(length: Length | None) -> int | None:
    """The most output tokens a length spec can ask for (None: unbounded or not given)."""
    if isinstance(length, Fixed):
        return length.value
    if isinstance(length, Empirical):
        return int(length.points[-1][1])
    return getattr(length, "max", None)


def drain_timeout_for(profile: Profile) -> float:
    """How long requests in flight get to finish after the load stops (docs/reliability.md).

    ``client.drain_timeout_s`` when the profile sets it; otherwise long enough that an endpoint which
    meets the profile's SLOs finishes its longest answer: the E2E limit, or the TTFT limit plus the
    longest output at the TPOT limit, with a tenth more, at least 60 s. Without such SLOs, 60 s. So a
    request still unanswered when the drain ends is the endpoint's timeout, never a long answer cut off.
    """
    client = profile.client
    if "drain_timeout_s" in client.model_fields_set:
        return client.drain_timeout_s
    limits: dict[str, float] = {}
    for slo in parse_slos(profile.slos or {}):
        if isinstance(slo, Slo):
            limits[slo.metric] = max(limits.get(slo.metric, 0.0), slo.limit_ms / 1e3)
    if "e2e" in limits:
        need = limits["e2e"]
    elif "tpot" in limits:
        outputs = [longest_output(sc.output_tokens) for sc in profile.scenarios]
        if not outputs or any(n is None for n in outputs):
            return client.drain_timeout_s
        need = limits.get("ttft", 0.0) + max(n for n in outputs if n is not None) * limits["tpot"]
    else:
        return client.drain_timeout_s
    return float(min(MAX_AUTO_DRAIN_S, max(client.drain_timeout_s, math.ceil(need * DRAIN_MARGIN))))
