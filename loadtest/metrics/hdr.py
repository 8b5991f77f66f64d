"""HDR histogram helpers: one shape for every latency, vectorized bulk recording, exact merge."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # one hour in microseconds
SIGNIFICANT_FIGURES = 3
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)


def new_histogram(highest: int = HIGHEST_US) -> HdrHistogram:
    """An integer histogram from 1 to ``highest`` at 3 significant figures."""
    return HdrHistogram(LOWEST_US, highest, SIGNIFICANT_FIGURES)


def record(hist: HdrHistogram, value: float) -> None:
    """Record one value, clamped into the trackable range (never silently dropped)."""
    v = int(value)
    hist.record_value(min(max(v, LOWEST_US), hist.highest_trackable_value))


def record_many(hist: HdrHistogram, values: Iterable[int] | np.ndarray) -> None:
    """Record many values at once with numpy; identical to calling ``record`` for each."""
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.int64)
    if arr.size == 0:
        return
    arr = np.clip(arr, LOWEST_US, hist.highest_trackable_value)
    masked = arr | hist.sub_bucket_mask
    # bit_length via frexp: exact for integers below 2**53.
    _, exp = np.frexp(masked.astype(np.float64))
    bucket = exp.astype(np.int64) - hist.unit_magnitude - (hist.sub_bucket_half_count_magnitude + 1)
    sub_bucket = arr >> (bucket + hist.unit_magnitude)
    index = ((bucket + 1) << hist.sub_bucket_half_count_magnitude) + (sub_bucket - hist.sub_bucket_half_count)
    counts = np.ctypeslib.as_array(hist.counts)
    lo = int(index.min())
    per_index = np.bincount(index - lo)  # counts per bucket index in [lo, max]: no np.add.at (slow)
    hit = np.flatnonzero(per_index)
    counts[hit + lo] += per_index[hit].astype(counts.dtype)
    hist.total_count += int(arr.size)
    hist.min_value = min(hist.min_value, int(arr.min()))
    hist.max_value = max(hist.max_value, int(arr.max()))


def encode(hist: HdrHistogram) -> str:
    """Compressed base64 form (HdrHistogram's standard encoding) for sending to the master."""
    return hist.encode().decode("ascii")


def add_encoded(hist: HdrHistogram, encoded: str) -> None:
    """Merge an encoded histogram into ``hist`` exactly."""
    hist.add(HdrHistogram.decode(encoded.encode("ascii")))


def fraction(p: float) -> float:
    """A percentile (99.9) as the fraction LoadGen multiplies by (0.999: the double nearest the decimal)."""
    return float(f"{p / 100.0:.12g}")


def loadgen_index(n: int, p: float) -> int:
    """LoadGen's 0-based index of the p-th percentile among n ascending samples: ⌊n · p/100⌋, at most
    n − 1 (``sample_latencies[sample_count * percentile]`` in loadgen/results.cc)."""
    return min(int(n * fraction(p)), n - 1)


def fast_percentiles(hist: HdrHistogram, pcts: Iterable[float]) -> list[int | None]:
    """The sample at LoadGen's rank (``loadgen_index``) for each percentile, as the highest value
    equivalent to its bucket, from one vectorized pass over the counts.

    The rank is exact (the counts are); the value is the bucket's, within 3 significant figures.
    hdrh's own ``get_value_at_percentile`` ranks by round(n · p) instead (one sample lower whenever the
    fraction of n · p is below one half) and walks every bucket in Python for each call.
    """
    return percentiles_of_counts(hist, np.ctypeslib.as_array(hist.counts)[: hist.counts_len], pcts)


def counts_of(hist: HdrHistogram) -> np.ndarray:
    """A copy of the histogram's bucket counts (to take a window's counts as the difference of two)."""
    return np.ctypeslib.as_array(hist.counts)[: hist.counts_len].astype(np.int64)


def percentiles_of_counts(hist: HdrHistogram, counts: np.ndarray, pcts: Iterable[float]) -> list[int | None]:
    """``fast_percentiles`` of bucket counts laid out like ``hist``'s (its own, or a window's: two
    ``counts_of`` apart)."""
    pcts = list(pcts)
    cum = np.cumsum(counts, dtype=np.int64)
    n = int(cum[-1]) if len(cum) else 0
    if n <= 0:
        return [None] * len(pcts)
    out: list[int | None] = []
    for p in pcts:
        idx = int(np.searchsorted(cum, loadgen_index(n, p) + 1, side="left"))  # LoadGen's rank
        out.append(int(hist.get_highest_equivalent_value(hist.get_value_from_index(idx))))
    return out


def _index_values(hist: HdrHistogram, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each of the first ``n`` count indexes: its lowest equivalent value and its range's size."""
    return _index_table(n, hist.sub_bucket_half_count_magnitude, hist.unit_magnitude)


@functools.lru_cache(maxsize=8)  # one table per histogram shape (every latency histogram shares one)
def _index_table(n: int, half_magnitude: int, unit_magnitude: int) -> tuple[np.ndarray, np.ndarray]:
    half = 1 << half_magnitude
    index = np.arange(n, dtype=np.int64)
    bucket = (index >> half_magnitude) - 1
    sub = (index & (half - 1)) + half
    low = bucket < 0
    sub[low] -= half
    bucket[low] = 0
    shift = bucket + unit_magnitude
    lowest, size = sub << shift, np.left_shift(1, shift)
    lowest.flags.writeable = size.flags.writeable = False  # shared: never changed in place
    return lowest, size


def cumulative_at(hist: HdrHistogram, bounds: Iterable[float]) -> list[int]:
    """How many values are at or under each bound, each value counted at its bucket's highest equivalent
    value (what a Prometheus ``le`` bucket of this histogram holds), in one vectorized pass."""
    n = hist.counts_len
    counts = np.ctypeslib.as_array(hist.counts)[:n]
    lowest, size = _index_values(hist, n)
    cum = np.cumsum(counts, dtype=np.int64)
    highest = lowest + size - 1
    out = []
    for b in bounds:
        k = int(np.searchsorted(highest, b, side="right"))  # indexes whose whole range is ≤ b
        out.append(int(cum[k - 1]) if k else 0)
    return out


def total_estimate(hist: HdrHistogram) -> float:
    """The sum of the recorded values, each at its bucket's median equivalent value: count × hdrh's
    ``get_mean_value()``, without its per-bucket Python loop."""
    n = hist.counts_len
    counts = np.ctypeslib.as_array(hist.counts)[:n]
    lowest, size = _index_values(hist, n)
    return float(np.dot(counts.astype(np.float64), (lowest + (size >> 1)).astype(np.float64)))


def value_at(hist: HdrHistogram, p: float) -> int | None:
    """The one percentile ``fast_percentiles`` gives (None for an empty histogram)."""
    return fast_percentiles(hist, (p,))[0]


def percentiles(hist: HdrHistogram, pcts: Iterable[float] = PERCENTILES) -> dict[str, int | None]:
    """Values at the given percentiles (LoadGen's rank; the highest value equivalent to that sample)."""
    pcts = list(pcts)
    return {percentile_key(p): v for p, v in zip(pcts, fast_percentiles(hist, pcts), strict=True)}


def summary(hist: HdrHistogram) -> dict[str, float | int | None]:
    """Count, mean, min, max, stddev and the standard percentiles (hdrh's definitions, computed over
    the non-empty buckets only)."""
    n = hist.get_total_count()
    out: dict[str, float | int | None] = {"count": n}
    if n:
        counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
        nz = np.flatnonzero(counts)
        mids = np.array(
            [hist._hdr_median_equiv_value(hist.get_value_from_index(int(i))) for i in nz], dtype=np.float64
        )
        c = counts[nz].astype(np.float64)
        mean = float((mids * c).sum() / n)
        std = float(np.sqrt((((mids - mean) ** 2) * c).sum() / n))
        out.update(
            mean=round(mean, 3),
            min=int(hist.get_min_value()),
            max=int(hist.get_max_value()),
            stddev=round(std, 3),
        )
    else:
        out.update(mean=None, min=None, max=None, stddev=None)
    out.update(percentiles(hist))
    return out


def cdf_points(hist: HdrHistogram, max_points: int = 400) -> list[tuple[float, float]]:
    """(value, cumulative fraction) pairs for plotting a CDF, thinned to at most ``max_points``."""
    n = hist.get_total_count()
    if n == 0:
        return []
    pts: list[tuple[float, float]] = []
    for item in hist.get_recorded_iterator():
        pts.append((float(item.value_iterated_to), item.total_count_to_this_value / n))
    if len(pts) > max_points:
        step = len(pts) / max_points
        pts = [pts[int(i * step)] for i in range(max_points)] + [pts[-1]]
    return pts


def percentile_key(p: float) -> str:
    """run.json's key of a percentile: ``p99``, ``p99_9``."""
    return f"p{p:g}".replace(".", "_")
