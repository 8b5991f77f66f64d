"""Sampling token lengths and think times from the profile's length distributions (dispatch on ``dist``)."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from typing import Any

from loadtest.profile.base import MAX_TOKENS
from loadtest.profile.schema import Length


def sample_empirical(points: Sequence[tuple[float, float]], rng: random.Random) -> float:
    """Inverse-CDF draw from a (quantile, value) table sorted by quantile, interpolating linearly."""
    if not points:
        raise ValueError("an empirical table needs at least one (quantile, value) point")
    u = rng.random()
    i = bisect.bisect_right(points, u, key=lambda p: p[0])
    if i == 0:
        return float(points[0][1])
    if i == len(points):
        return float(points[-1][1])
    (q0, v0), (q1, v1) = points[i - 1], points[i]
    return float(v0) if q1 <= q0 else v0 + (v1 - v0) * (u - q0) / (q1 - q0)


def _draw(spec: Any, rng: random.Random) -> float:
    """One unclamped draw from any supported shape (fixed, uniform, normal, lognormal, exponential, empirical)."""
    dist = spec.dist
    if dist == "fixed":
        return spec.value
    if dist == "normal":
        return rng.gauss(spec.mean, spec.std)
    if dist == "lognormal":
        return math.exp(rng.gauss(math.log(spec.median), spec.sigma))
    if dist == "exponential":
        return rng.expovariate(1.0 / spec.mean) if spec.mean > 0 else 0.0
    if dist == "empirical":
        return sample_empirical(spec.points, rng)
    raise TypeError(f"unknown length distribution {dist!r}")


def _clamp(v: float, spec: Any, floor: float) -> float:
    """``v`` within the spec's optional min/max and never below ``floor``."""
    lo = getattr(spec, "min", None)
    hi = getattr(spec, "max", None)
    v = max(v, floor if lo is None else max(lo, floor))
    return min(v, hi) if hi is not None else v


def sample_length(spec: Length, rng: random.Random) -> int:
    """One integer length drawn from ``spec`` (clamped to its min/max, and to MAX_TOKENS when it has no max:
    a normal or lognormal tail never asks for more than a profile may give)."""
    if spec.dist == "fixed":
        return spec.value
    if spec.dist == "uniform":
        return rng.randint(spec.min, spec.max)
    return min(int(_clamp(round(_draw(spec, rng)), spec, 0)), MAX_TOKENS)


def sample_seconds(spec: Any, rng: random.Random) -> float:
    """One duration in seconds (≥ 0) from ``spec`` (any length shape, floats kept) or a plain number."""
    if isinstance(spec, int | float):
        return max(0.0, float(spec))
    if spec.dist == "uniform":
        return max(0.0, rng.uniform(spec.min, spec.max))
    return float(_clamp(_draw(spec, rng), spec, 0.0))
