"""Sampling token lengths from the profile's length distributions."""

from __future__ import annotations

import math
import random

from loadtest.profile.schema import Fixed, Length, LogNormal, Normal, Uniform


def sample_length(spec: Length, rng: random.Random) -> int:
    """One integer length drawn from ``spec`` (clamped to its min/max)."""
    if isinstance(spec, Fixed):
        return spec.value
    if isinstance(spec, Uniform):
        return rng.randint(spec.min, spec.max)
    if isinstance(spec, Normal):
        v = rng.gauss(spec.mean, spec.std)
    elif isinstance(spec, LogNormal):
        v = math.exp(rng.gauss(math.log(spec.median), spec.sigma))
    else:  # pragma: no cover - the schema admits nothing else
        raise TypeError(spec)
    n = max(spec.min, round(v))
    return min(n, spec.max) if spec.max is not None else n
