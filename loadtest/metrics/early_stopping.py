"""MLPerf LoadGen early stopping (odds, minimum passing counts, percentile estimates) from the definition."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import TypeVar

import numpy as np
from hdrh.histogram import HdrHistogram

# The regularized incomplete beta I_x(a, b) is computed with the Numerical Recipes continued
# fraction (betacf) evaluated by the modified Lentz method, using the symmetry
# I_x(a, b) = 1 − I_{1−x}(b, a) so the fraction is always evaluated where it converges fast
# (x < (a + 1) / (a + b + 2)). It needs O(sqrt(max(a, b))) iterations, independent of t, so large
# over-limit counts (histograms of millions of samples) stay cheap.
#
# Meaning (LoadGen, loadgen/early_stopping.cc, confidence c = 0.99, tolerance d = 0):
# odds(h, t, p) = I_p(h, t + 1) = P(Binomial(h + t, 1 − p) ≤ t): the chance of seeing at most t
# over-limit results in h + t trials when the true over-limit rate is exactly 1 − p.

DEFAULT_CONFIDENCE = 0.99
_EPS = 1e-16
_TINY = 1e-300

T = TypeVar("T")


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for I_x(a, b) (Numerical Recipes 6.4, modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = _TINY if abs(d) < _TINY else d
    d = 1.0 / d
    h = d
    max_iter = 200 + int(20 * math.sqrt(max(a, b)))
    for m in range(1, max_iter + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = _TINY if abs(d) < _TINY else d
        c = 1.0 + aa / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = _TINY if abs(d) < _TINY else d
        c = 1.0 + aa / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS * 4:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if a <= 0 or b <= 0:
        raise ValueError(f"a and b must be > 0 (got a={a}, b={b})")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1] (got {x})")
    if x == 0.0 or x == 1.0:
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _check_p(p: float) -> None:
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be strictly between 0 and 1 (got {p})")


def odds(h: int, t: int, p: float) -> float:
    """I_p(h, t + 1): P(at most t over-limit results in h + t trials | true over-limit rate 1 − p)."""
    _check_p(p)
    if t < 0 or h < 0:
        raise ValueError(f"h and t must be ≥ 0 (got h={h}, t={t})")
    if h == 0:
        return 1.0  # with no under-limit results, "at most t over the limit in t trials" is certain
    return betainc_regularized(float(h), float(t + 1), p)


@lru_cache(maxsize=65536)
def find_min_passing(t: int, p: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The smallest h ≥ 1 with odds(h, t, p) < 1 − confidence (exponential, then binary search)."""
    _check_p(p)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1 (got {confidence})")
    if t < 0:
        raise ValueError(f"t must be ≥ 0 (got {t})")
    alpha = 1.0 - confidence
    lo, hi = 0, 1  # invariant: odds(lo) ≥ alpha (odds(0) = 1); search for the first hi below alpha
    while odds(hi, t, p) >= alpha:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if odds(mid, t, p) < alpha:
            hi = mid
        else:
            lo = mid
    return hi


def server_passes(queries_issued: int, t_over: int, p: float, confidence: float = DEFAULT_CONFIDENCE) -> bool:
    """LoadGen Server early stopping for one metric: queries_issued ≥ find_min_passing(t_over, p) + t_over."""
    return queries_issued >= find_min_passing(t_over, p, confidence) + t_over


def server_min_queries(p: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """Queries a Server run needs to pass early stopping when none is over the limit: find_min_passing(0, p)
    (p90 44, p99 459)."""
    return find_min_passing(0, p, confidence)


def min_queries_for_percentile(p: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The smallest sample count that gives a percentile estimate: find_min_passing(1, p) + 1 (p90 64,
    p99 662), LoadGen's "Need to process at least N queries for early stopping"."""
    return find_min_passing(1, p, confidence) + 1


def estimate_t(n: int, p: float, confidence: float = DEFAULT_CONFIDENCE) -> int | None:
    """The largest t ≥ 1 with n ≥ find_min_passing(t, p) + t (None below ``min_queries_for_percentile``).

    LoadGen's SingleStream search starts at t = 1 and stops at the first t that no longer passes;
    find_min_passing(t, p) + t grows strictly with t, so this is a binary search over t.
    """
    if n < min_queries_for_percentile(p, confidence):
        return None
    lo, hi = 1, n  # find_min_passing(n, p) + n > n always, so t = n never passes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if n >= find_min_passing(mid, p, confidence) + mid:
            lo = mid
        else:
            hi = mid
    return lo


def estimate_index(n: int, t: int) -> int:
    """The 0-based index into ascending samples for an estimate with t ≥ 1: n − t, LoadGen's
    ``sample_latencies[queries_issued - t]`` (t = 1: the largest sample)."""
    return n - t


def percentile_estimate(
    sorted_values: Sequence[T], p: float, confidence: float = DEFAULT_CONFIDENCE
) -> T | None:
    """Early-stopping percentile estimate: sorted[n − t] (0-based) for the largest passing t ≥ 1.

    ``sorted_values`` must be ascending; p is a fraction (0.99 for p99). None when n is below
    ``min_queries_for_percentile(p)``. The true p-quantile is at most the estimate with the given
    confidence.
    """
    n = len(sorted_values)
    t = estimate_t(n, p, confidence)
    if t is None:
        return None
    return sorted_values[estimate_index(n, t)]


def percentile_estimate_from_histogram(
    hist: HdrHistogram, p: float, confidence: float = DEFAULT_CONFIDENCE
) -> int | None:
    """The same estimate from an HdrHistogram, in the histogram's units.

    The sample at 0-based rank n − t is located by walking the recorded buckets; its
    value is the bucket's highest equivalent value (as ``hdr.percentiles`` reports), so the
    estimate is exact up to the histogram's 3-significant-figure resolution and never below it.
    """
    n = int(hist.get_total_count())
    t = estimate_t(n, p, confidence)
    if t is None:
        return None
    rank = estimate_index(n, t) + 1  # 1-based count of samples at or below the estimate
    cumulative = np.cumsum(_counts(hist))
    index = int(np.searchsorted(cumulative, rank, side="left"))
    return int(hist.get_highest_equivalent_value(hist.get_value_from_index(index)))


def count_above(hist: HdrHistogram, limit: float) -> int:
    """Samples over ``limit``: total − samples whose bucket lies entirely at or below ``limit``.

    A sample counts as over the limit when its bucket's highest equivalent value exceeds the
    limit: the same convention as the reported percentiles, so a percentile at or below the limit
    and the over-limit count agree.
    """
    counts = _counts(hist)
    over = 0
    for index in np.nonzero(counts)[0][::-1]:
        if hist.get_highest_equivalent_value(hist.get_value_from_index(int(index))) <= limit:
            break
        over += int(counts[index])
    return over


def _counts(hist: HdrHistogram) -> np.ndarray:
    """The histogram's bucket counts as a numpy view (no copy)."""
    return np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
