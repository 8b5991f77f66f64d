"""Server-side latency from Prometheus histograms: bucket deltas between two scrapes, bucket-interpolated percentiles."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from loadtest.telemetry.names import HISTOGRAMS, histogram_candidates
from loadtest.telemetry.scrape import Scrape

PERCENTILES = ((50.0, "p50"), (90.0, "p90"), (99.0, "p99"))
METHOD = (
    "bucket-interpolated: Prometheus histogram_quantile (linear within the bucket that holds the rank), "
    "so the bucket bounds are the resolution; a rank in the +Inf bucket reads as the last finite bound; "
    "a value and its bucket's upper end are capped at mean / (1 - q) (Markov's bound, latencies being >= 0)"
)
Buckets = Mapping[float, float]  # upper bound (math.inf last) -> cumulative count
SnapT = TypeVar("SnapT")  # what a timed snapshot holds (a Scrape, or a Compact one)


def delta(start: Buckets | None, end: Buckets) -> tuple[dict[float, float], bool]:
    """The observations between two scrapes of one histogram, and whether it counted from zero: a
    counter that went down (a restarted server) or a changed set of bounds does, as Prometheus'
    ``increase`` does."""
    if not start or set(start) != set(end):
        return dict(sorted(end.items())), True
    out = {le: end[le] - start[le] for le in sorted(end)}
    if any(v < 0 for v in out.values()):
        return dict(sorted(end.items())), True
    return out, False


def quantile(q: float, buckets: Buckets) -> tuple[float, float, float | None] | None:
    """(value, bucket lower bound, bucket upper bound or None for +Inf) of quantile ``q`` (0..1) of
    cumulative ``buckets``, by linear interpolation within the bucket (histogram_quantile); None when
    empty. The first bucket's lower bound is 0; a rank in the +Inf bucket gives the last finite bound."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    counts = [buckets[b] for b in bounds]
    # cumulative counts never decrease; a scrape taken mid-update may show it, so smooth it out
    for i in range(1, len(counts)):
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    i = next(k for k, c in enumerate(counts) if c >= rank)
    lo = bounds[i - 1] if i > 0 else 0.0
    if math.isinf(bounds[i]):
        return (lo, lo, None)
    c_lo = counts[i - 1] if i > 0 else 0.0
    hi = bounds[i]
    if hi <= 0 or counts[i] == c_lo:
        return (hi, lo, hi)
    return (lo + (hi - lo) * (rank - c_lo) / (counts[i] - c_lo), lo, hi)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000.0, 3)


def summarize(
    name: str, buckets: Buckets, total_s: float | None, with_bounds: bool = True
) -> dict[str, Any] | None:
    """count, mean and p50/p90/p99 in ms (each with the bucket it fell in) of one histogram delta."""
    count = buckets.get(math.inf, 0.0)
    if count <= 0:
        return None
    out: dict[str, Any] = {"name": name, "count": int(round(count))}
    mean = total_s / count if total_s is not None and total_s >= 0 else None
    out["mean_ms"] = _ms(mean)
    for p, key in PERCENTILES:
        got = quantile(p / 100.0, buckets)
        if got is None:
            out[f"{key}_ms"], out[f"{key}_bucket_ms"] = None, None
            continue
        value, lo, hi = got
        if mean is not None and hi is not None:
            # No more than 1 - q of non-negative values can exceed mean / (1 - q) (Markov): a coarse first
            # bucket (vLLM's queue time: 0-300 ms) then no longer reads as 150 ms for a 0.01 ms queue.
            cap = max(lo, mean / (1.0 - p / 100.0))
            value, hi = min(value, cap), min(hi, cap)
        out[f"{key}_ms"] = _ms(value)
        out[f"{key}_bucket_ms"] = [_ms(lo), _ms(hi)]
    if with_bounds:
        out["bounds_ms"] = [_ms(b) for b in sorted(buckets) if not math.isinf(b)]
    return out


def server_latency(
    start: Scrape | None, end: Scrape, engine: str, with_bounds: bool = True
) -> dict[str, dict[str, Any]]:
    """Per latency metric (ttft, itl, e2e, queue, prefill, decode) the server's histograms observed
    between ``start`` and ``end`` (``start`` None: since the server started); absent ones are left out."""
    out: dict[str, dict[str, Any]] = {}
    for metric, names in histogram_candidates(engine).items():
        name = next((n for n in names if n in end.buckets), None)
        if name is None:
            continue
        d, restarted = delta(start.buckets.get(name) if start else None, end.buckets[name])
        total = _sum_delta(start, end, name + "_sum", restarted)
        s = summarize(name, d, total, with_bounds)
        if s is not None:
            out[metric] = s
    return {m: out[m] for m in HISTOGRAMS if m in out}


def _sum_delta(start: Scrape | None, end: Scrape, key: str, restarted: bool) -> float | None:
    if key not in end.total:
        return None
    if start is None or key not in start.total or restarted:
        return end.total[key]
    d = end.total[key] - start.total[key]
    return end.total[key] if d < 0 else d


def nearest_snapshots(
    snaps: Sequence[tuple[float, SnapT]], t_from: float, t_to: float
) -> tuple[tuple[float, SnapT], tuple[float, SnapT]] | None:
    """The snapshots that bracket [t_from, t_to]: the last at or before ``t_from`` (else the first)
    and the first at or after ``t_to`` (else the last); None when they do not span any time."""
    if len(snaps) < 2:
        return None
    before = [s for s in snaps if s[0] <= t_from]
    after = [s for s in snaps if s[0] >= t_to]
    a = before[-1] if before else snaps[0]
    b = after[0] if after else snaps[-1]
    return (a, b) if b[0] > a[0] else None


Compact = dict[str, tuple[tuple[float, ...], "array[float]", float | None]]


def compact(scrape: Scrape, bounds_cache: dict[str, tuple[float, ...]]) -> Compact:
    """A scrape's histograms only, as flat arrays (a long run keeps one per tick); equal bounds share
    one tuple through ``bounds_cache``."""
    out: Compact = {}
    for name, b in scrape.buckets.items():
        bounds = tuple(b)
        if bounds_cache.get(name) != bounds:
            bounds_cache[name] = bounds
        out[name] = (bounds_cache[name], array("d", b.values()), scrape.total.get(name + "_sum"))
    return out


def expand(c: Compact, engine: str) -> Scrape:
    """A compact snapshot back into a Scrape that ``server_latency`` reads."""
    s = Scrape(engine=engine)
    for name, (bounds, counts, total) in c.items():
        s.buckets[name] = dict(zip(bounds, counts, strict=True))
        if total is not None:
            s.total[name + "_sum"] = total
    return s
