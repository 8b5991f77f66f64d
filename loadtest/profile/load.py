"""How requests arrive: closed loop, open loop, trace replay, or a sequence of stages."""

from __future__ import annotations

from pathlib import PurePath
from typing import Literal

from pydantic import Field, model_validator

from loadtest.profile.base import MAX_CONCURRENCY, MAX_RATE, Strict, check_ceiling, rule_error

LOAD_MODES = ("concurrency", "rate", "trace", "stages")
# How each load is driven, in k6's terms: constant-vus, constant-arrival-rate, a replayed schedule, stages.
EXECUTORS = ("constant-streams", "arrival-rate", "trace-replay", "stages")


class TraceLoad(Strict):
    """Replay a trace file's timestamps and lengths."""

    path: str = Field(min_length=1)
    format: Literal["azure", "mooncake", "burstgpt", "bailian", "loadtest", "cc-traces", "auto"] = "auto"
    window_s: tuple[float, float] | None = None
    speedup: float | None = Field(default=None, gt=0)
    target_rate: float | None = Field(default=None, gt=0)
    max_requests: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _rules(self) -> TraceLoad:
        if self.window_s is not None and not 0 <= self.window_s[0] < self.window_s[1]:
            raise rule_error(
                "window_s is [start, end] seconds into the trace with 0 ≤ start < end", "window_s"
            )
        if self.speedup is not None and self.target_rate is not None:
            raise rule_error("give at most one of speedup and target_rate", "target_rate")
        return self


class Stage(Strict):
    """One stage: a rate or a concurrency held (or, with ramp, reached linearly) for duration_s."""

    duration_s: float = Field(gt=0)
    rate: float | None = Field(default=None, gt=0)
    concurrency: int | None = Field(default=None, ge=1)
    ramp: bool = False

    @model_validator(mode="after")
    def _one(self) -> Stage:
        check_ceiling(self.rate, MAX_RATE, "requests/s", "rate")
        check_ceiling(self.concurrency, MAX_CONCURRENCY, "streams", "concurrency")
        if (self.rate is None) == (self.concurrency is None):
            raise rule_error("give exactly one of rate (open loop) or concurrency (closed loop)")
        return self

    @property
    def mode(self) -> str:
        """``rate`` or ``concurrency``."""
        return "rate" if self.rate is not None else "concurrency"


class Load(Strict):
    """Exactly one of concurrency, rate, trace or stages."""

    concurrency: int | None = Field(default=None, ge=1)
    rate: float | None = Field(default=None, gt=0)
    arrival: Literal["poisson", "constant", "gamma"] = "poisson"
    cv: float | None = Field(default=None, gt=0)
    trace: TraceLoad | None = None
    stages: list[Stage] | None = Field(default=None, min_length=1)
    max_in_flight: int | None = Field(default=None, ge=1)
    # Closed loop: the seconds over which the streams start (0: at once; None: at once up to a few hundred
    # a process, else at a rate the generator's host sustains; locust/ramp.py). The judged window begins
    # after the last one started.
    ramp_up_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _rules(self) -> Load:
        check_ceiling(self.rate, MAX_RATE, "requests/s", "rate")
        check_ceiling(self.concurrency, MAX_CONCURRENCY, "streams", "concurrency")
        check_ceiling(self.max_in_flight, MAX_CONCURRENCY, "requests in flight", "max_in_flight")
        given = [m for m in LOAD_MODES if getattr(self, m) is not None]
        if len(given) != 1:
            raise rule_error(
                f"give exactly one load mode: concurrency, rate, trace or stages (got {', '.join(given) or 'none'})"
            )
        if self.stages:
            modes = {s.mode for s in self.stages}
            if len(modes) > 1:
                bad = next(i for i, s in enumerate(self.stages) if s.mode != self.stages[0].mode)
                raise rule_error(
                    f"all stages must use the same mode (stage 0 uses {self.stages[0].mode})", "stages", bad
                )
        open_loop = self.mode == "rate"
        if not open_loop and "arrival" in self.model_fields_set:
            raise rule_error("arrival applies to open loop only (rate, or stages with rate)", "arrival")
        if not open_loop and self.max_in_flight is not None:
            raise rule_error(
                "max_in_flight applies to open loop only (rate, or stages with rate)", "max_in_flight"
            )
        if self.ramp_up_s is not None and self.concurrency is None:
            raise rule_error(
                "ramp_up_s applies to a closed loop (concurrency); stages ramp with their own ramp: true",
                "ramp_up_s",
            )
        if self.arrival == "gamma" and self.cv is None:
            raise rule_error(
                "arrival gamma needs cv (coefficient of variation of inter-arrival gaps, > 0)", "cv"
            )
        if self.arrival != "gamma" and self.cv is not None:
            raise rule_error(f"cv applies to arrival gamma only (arrival is {self.arrival})", "cv")
        return self

    @property
    def mode(self) -> str:
        """``concurrency`` or ``rate`` (stages count as their stages' mode), or ``trace``."""
        if self.stages:
            return self.stages[0].mode
        return "trace" if self.trace is not None else ("rate" if self.rate is not None else "concurrency")

    @property
    def executor(self) -> str:
        """The k6-style name of this load (EXECUTORS): how users are started and kept (locust/executors.py)."""
        if self.stages:
            return "stages"
        return (
            "trace-replay"
            if self.trace is not None
            else "arrival-rate"
            if self.rate is not None
            else "constant-streams"
        )

    @property
    def open_loop(self) -> bool:
        """Arrivals follow a schedule (rate, trace, rate stages); closed loop: a stream sends when its last ended."""
        return self.mode != "concurrency"

    def describe(self) -> str:
        """One line for people: what load this puts on the endpoint (console, run.json, UI, profile list)."""
        if self.concurrency is not None:
            return f"{self.concurrency} concurrent streams (closed loop)"
        if self.rate is not None:
            shape = f"gamma CV {self.cv:g}" if self.arrival == "gamma" and self.cv else self.arrival
            return f"{self.rate:g} req/s {shape} (open loop)"
        if self.trace is not None:
            return f"trace replay of {PurePath(self.trace.path).name} (open loop)"
        stages = self.stages or []
        unit = "streams" if stages and stages[0].concurrency is not None else "req/s"
        levels = " → ".join(
            f"{(st.concurrency if st.concurrency is not None else st.rate):g}" for st in stages
        )
        return f"stages {levels} {unit}"
