"""Empirical quantile tables (`{dist: empirical, points: [[q, v], ...]}`) built from a trace column."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

QUANTILE_GRID: tuple[float, ...] = (
    0.0, 0.01, 0.02, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60,
    0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95, 0.975, 0.99, 0.995, 0.999, 1.0,
)  # fmt: skip
"""Default grid: dense in the tails, exact at p10/p50/p90/p99, always including 0 and 1."""


def empirical_points(
    values: Sequence[float] | np.ndarray, grid: Sequence[float] = QUANTILE_GRID, digits: int = 1
) -> list[list[float]]:
    """[[q, value], ...] with linearly interpolated quantiles of `values` at each q of `grid`."""
    qs = [float(q) for q in grid]
    if qs[0] != 0.0 or qs[-1] != 1.0 or any(b <= a for a, b in zip(qs, qs[1:], strict=False)):
        raise ValueError("grid must rise strictly from 0.0 to 1.0")
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("no values to build an empirical table from")
    vals = np.maximum.accumulate(np.round(np.quantile(arr, qs), digits))
    return [[q, float(v)] for q, v in zip(qs, vals, strict=True)]


def empirical_spec(values: Sequence[float] | np.ndarray, grid: Sequence[float] = QUANTILE_GRID) -> dict:
    """A ready-to-use length spec: `{dist: empirical, points: [[q, v], ...]}`."""
    return {"dist": "empirical", "points": empirical_points(values, grid)}
