"""A point that proved nothing for want of samples: how long it would have to run to prove its percentiles."""

from __future__ import annotations

from loadtest.contracts.run_document import RunDocument

# The checks a longer run satisfies: the early-stopping evidence of each percentile SLO, the minimum
# query count and the minimum duration (loadtest/metrics/verdict.py).
_MORE_OF_THE_SAME = ("min_queries", "min_duration")
MARGIN = 1.15  # Poisson arrivals: a point sized to exactly the samples it needs falls short half the time


def _lengthens(name: str) -> bool:
    return name.startswith("early_stopping.") or name in _MORE_OF_THE_SAME


def needs_duration_s(run: RunDocument) -> float | None:
    """The duration (s) the run would need for the evidence it lacked, when that is all it lacked; None
    when it is not invalid, or invalid for another reason too (a missed SLO, errors, the generator).

    Each count-based check (early stopping, minimum queries) gives samples had (``value``) against
    samples needed (``limit``); the run's length scales by their ratio (the judged window's start stays
    where it is). The minimum duration is its limit. The longest of these, with a margin.
    """
    verdict = run.verdict
    duration = run.config.duration_s
    if verdict is None or verdict.status != "invalid" or not duration:
        return None
    failing = [c for c in verdict.checks if c.blocking and not c.passed]
    if not failing or not all(_lengthens(c.name) for c in failing):
        return None
    judged = run.judged.window if run.judged is not None else None
    warmup = judged.warmup_s if judged is not None else 0.0
    need = duration
    for c in failing:
        if c.limit is None:
            return None
        if c.name == "min_duration":
            need = max(need, float(c.limit) + warmup)
            continue
        have = float(c.value or 0.0)
        if have <= 0:
            return None  # nothing counted: a longer run of the same cannot be sized
        need = max(need, warmup + (duration - warmup) * float(c.limit) / have)
    return round(need * MARGIN, 1)
