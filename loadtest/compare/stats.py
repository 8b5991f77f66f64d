"""Seeded, vectorized bootstrap estimates: percentiles, inter-token gaps, rates and proportions, and deltas."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from loadtest.metrics import hdr

REPLICATES = 1000
CONFIDENCE = 0.95
BOOT_SEED = 7
# Bootstrap weight matrices are built in batches of at most this many cells (bounded memory).
_CELLS = 4_000_000


@dataclass(frozen=True)
class Estimate:
    """A point estimate, its bootstrap replicates and its confidence interval."""

    value: float
    reps: np.ndarray

    @property
    def ci(self) -> tuple[float, float]:
        return _interval(self.reps)


@dataclass(frozen=True)
class Delta:
    """Other minus baseline, absolute and relative, with confidence intervals from the replicates."""

    abs: float
    abs_ci: tuple[float, float]
    pct: float | None
    pct_ci: tuple[float, float] | None

    @property
    def significant(self) -> bool:
        lo, hi = self.abs_ci
        return bool(lo > 0 or hi < 0)


def _interval(reps: np.ndarray) -> tuple[float, float]:
    a = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.nanpercentile(reps, [a, 100 - a])
    return float(lo), float(hi)


def rng_for(*keys: str) -> np.random.Generator:
    """A generator seeded from the bootstrap seed and stable names, so reruns give the same intervals."""
    return np.random.default_rng([BOOT_SEED, *(zlib.crc32(k.encode()) for k in keys)])


def _rank_pos(cum: np.ndarray, q: float) -> np.ndarray:
    """Per row, the index of the q-th percentile at LoadGen's rank (the ⌊q/100 · n⌋-th sample from 0,
    docs/metrics.md) given cumulative weights."""
    total = cum[:, -1]
    k = np.minimum(np.floor(hdr.fraction(q) * total) + 1, total)
    return (cum < k[:, None]).sum(axis=1)


def _draw_counts(n: int, b: int, rng: np.random.Generator) -> np.ndarray:
    """How often each of ``n`` items is drawn in each of ``b`` resamples with replacement (b × n)."""
    draws = rng.integers(0, n, size=(b, n)) + (np.arange(b) * n)[:, None]
    return np.bincount(draws.ravel(), minlength=b * n).reshape(b, n)


def _bootstrap_percentiles(
    xs: np.ndarray, qs: tuple[float, ...], batch: int, cum_weights: Callable[[int], np.ndarray]
) -> dict[float, Estimate]:
    """Percentiles of sorted ``xs`` at LoadGen's rank; ``cum_weights(b)`` gives b resamples' cumulative weights."""
    n = xs.size
    reps = np.empty((REPLICATES, len(qs)))
    for b0 in range(0, REPLICATES, batch):
        b = min(batch, REPLICATES - b0)
        cum = cum_weights(b)
        for j, q in enumerate(qs):
            reps[b0 : b0 + b, j] = xs[np.minimum(_rank_pos(cum, q), n - 1)]
    out = {}
    for j, q in enumerate(qs):
        point = xs[hdr.loadgen_index(n, q)]
        out[q] = Estimate(float(point), reps[:, j])
    return out


def percentiles(
    x: np.ndarray, qs: tuple[float, ...], rng: np.random.Generator
) -> dict[float, Estimate] | None:
    """Percentiles of ``x`` at LoadGen's rank (NaNs dropped), each with a bootstrap over the values."""
    xs = np.sort(x[~np.isnan(x)])
    n = xs.size
    if n == 0:
        return None
    return _bootstrap_percentiles(
        xs, qs, max(1, _CELLS // n), lambda b: _draw_counts(n, b, rng).cumsum(axis=1)
    )


def clustered_percentiles(
    x: np.ndarray, owner: np.ndarray, n_owners: int, qs: tuple[float, ...], rng: np.random.Generator
) -> dict[float, Estimate] | None:
    """Percentiles of pooled values (inter-token gaps), bootstrapped over their owners (requests)."""
    if x.size == 0 or n_owners == 0:
        return None
    order = np.argsort(x, kind="stable")
    xs, own = x[order], owner[order]
    return _bootstrap_percentiles(
        xs,
        qs,
        max(1, _CELLS // max(xs.size, n_owners)),
        lambda b: _draw_counts(n_owners, b, rng)[:, own].cumsum(axis=1),
    )


def batches_for(duration_s: float) -> int:
    """Batch-means batches: one per second of run, at least 10 and at most 30."""
    return int(min(30, max(10, round(duration_s))))


def rate(
    times: np.ndarray, weights: np.ndarray, start: float, end: float, rng: np.random.Generator
) -> Estimate | None:
    """Sum of ``weights`` per second over [start, end], with a batch-means bootstrap.

    The window is cut into equal batches; each item counts in the batch it completed in. The point
    estimate is the total over the duration; the replicates resample whole batches, which keeps the
    correlation between neighbouring seconds inside each batch.
    """
    dur = end - start
    if dur <= 0:
        return None
    k = batches_for(dur)
    idx = np.clip(((times - start) / dur * k).astype(np.int64), 0, k - 1)
    per = np.bincount(idx, weights=weights, minlength=k) / (dur / k)
    reps = per[rng.integers(0, k, size=(REPLICATES, k))].mean(axis=1)
    return Estimate(float(weights.sum() / dur), reps)


def proportion(flags: np.ndarray, rng: np.random.Generator) -> Estimate | None:
    """A fraction of true flags with a bootstrap over the items (binomial resampling)."""
    n = flags.size
    if n == 0:
        return None
    p = float(flags.mean())
    return Estimate(p, rng.binomial(n, p, size=REPLICATES) / n)


def transform(est: Estimate | None, fn: Callable[[np.ndarray], np.ndarray]) -> Estimate | None:
    """An estimate of fn(value), with the vectorized fn applied to every replicate."""
    if est is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        return Estimate(float(fn(np.array([est.value]))[0]), np.asarray(fn(est.reps), dtype=float))


def delta(base: Estimate, other: Estimate) -> Delta:
    """other − base from independent replicates of each run."""
    d = other.reps - base.reps
    pct: float | None = None
    pct_ci: tuple[float, float] | None = None
    if base.value != 0 and np.all(base.reps != 0):
        pct = (other.value / base.value - 1.0) * 100.0
        pct_ci = _interval((other.reps / base.reps - 1.0) * 100.0)
    return Delta(other.value - base.value, _interval(d), pct, pct_ci)
