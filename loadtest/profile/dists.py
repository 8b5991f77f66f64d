"""Distributions: token lengths (``Length``) and durations in seconds (``Dist``), chosen by ``dist``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from loadtest.profile.base import MAX_TOKENS, Strict, check_ceiling, rule_error

DIST_TAGS = ("fixed", "uniform", "normal", "lognormal", "empirical")


def _check_range(lo: float, hi: float | None) -> None:
    if hi is not None and hi < lo:
        raise rule_error(f"max ({hi:g}) must be ≥ min ({lo:g})", "max")


def _token_ceiling(spec: object, *fields: str) -> None:
    """Every token count ``fields`` of a length spec at most MAX_TOKENS."""
    for name in fields:
        check_ceiling(getattr(spec, name), MAX_TOKENS, "tokens", name)


class Empirical(Strict):
    """A quantile table: [quantile, value] pairs from 0 to 1; samples interpolate linearly."""

    dist: Literal["empirical"]
    points: list[tuple[float, float]] = Field(min_length=2)

    @model_validator(mode="after")
    def _table(self) -> Empirical:
        qs = [q for q, _ in self.points]
        vs = [v for _, v in self.points]
        for i, (q, v) in enumerate(self.points):
            if not 0 <= q <= 1:
                raise rule_error(f"quantile {q:g} is outside [0, 1]", "points", i, 0)
            if v < 0:
                raise rule_error(f"value {v:g} must be ≥ 0", "points", i, 1)
            if i and q <= qs[i - 1]:
                raise rule_error("quantiles must be strictly increasing", "points", i, 0)
            if i and v < vs[i - 1]:
                raise rule_error("values must be non-decreasing", "points", i, 1)
        if qs[0] != 0 or qs[-1] != 1:
            raise rule_error("the first quantile must be 0 and the last 1", "points")
        return self

    def quantile(self, u: float) -> float:
        """The value at quantile ``u`` (linear interpolation between the points)."""
        for (q0, v0), (q1, v1) in zip(self.points, self.points[1:], strict=False):
            if u <= q1:
                return v0 + (v1 - v0) * (max(u, q0) - q0) / (q1 - q0)
        return self.points[-1][1]


class EmpiricalLength(Empirical):
    """A quantile table of token counts (each at most MAX_TOKENS)."""

    @model_validator(mode="after")
    def _bound(self) -> EmpiricalLength:
        for i, (_, v) in enumerate(self.points):
            check_ceiling(v, MAX_TOKENS, "tokens", "points", i, 1)
        return self


class Fixed(Strict):
    """Always ``value`` tokens."""

    dist: Literal["fixed"]
    value: int = Field(ge=0)

    @model_validator(mode="after")
    def _bound(self) -> Fixed:
        _token_ceiling(self, "value")
        return self


class Uniform(Strict):
    """Integers uniform in [min, max]."""

    dist: Literal["uniform"]
    min: int = Field(ge=0)
    max: int = Field(ge=0)

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        _check_range(self.min, self.max)
        _token_ceiling(self, "min", "max")
        return self


class Normal(Strict):
    """Normal(mean, std), rounded and clamped to [min, max]."""

    dist: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: int = Field(default=1, ge=0)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _order(self) -> Normal:
        _check_range(self.min, self.max)
        _token_ceiling(self, "mean", "min", "max")
        return self


class LogNormal(Strict):
    """exp(Normal(ln median, sigma)), rounded and clamped to [min, max]."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0, le=5)
    min: int = Field(default=1, ge=0)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _order(self) -> LogNormal:
        _check_range(self.min, self.max)
        _token_ceiling(self, "median", "min", "max")
        return self


class FixedDist(Strict):
    """Always ``value`` seconds."""

    dist: Literal["fixed"]
    value: float = Field(ge=0)


class UniformDist(Strict):
    """Seconds uniform in [min, max]."""

    dist: Literal["uniform"]
    min: float = Field(ge=0)
    max: float = Field(ge=0)

    @model_validator(mode="after")
    def _order(self) -> UniformDist:
        _check_range(self.min, self.max)
        return self


class NormalDist(Strict):
    """Normal(mean, std) seconds, clamped to [min, max]."""

    dist: Literal["normal"]
    mean: float = Field(ge=0)
    std: float = Field(ge=0)
    min: float = Field(default=0.0, ge=0)
    max: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _order(self) -> NormalDist:
        _check_range(self.min, self.max)
        return self


class LogNormalDist(Strict):
    """exp(Normal(ln median, sigma)) seconds, clamped to [min, max]."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0, le=5)
    min: float = Field(default=0.0, ge=0)
    max: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _order(self) -> LogNormalDist:
        _check_range(self.min, self.max)
        return self


Length = Annotated[Fixed | Uniform | Normal | LogNormal | EmpiricalLength, Field(discriminator="dist")]
Dist = Annotated[
    FixedDist | UniformDist | NormalDist | LogNormalDist | Empirical, Field(discriminator="dist")
]
