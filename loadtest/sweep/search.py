"""LoadGen-style search for the highest open-loop rate whose run meets the SLOs: bounds, then bisection;
a point that lacked samples is rerun longer rather than counted as a miss."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_TOLERANCE = 0.05
DEFAULT_MAX_ITERATIONS = 10
MAX_LENGTHENINGS = 2  # reruns of one rate for want of samples before the search gives up on it
# The longest rerun the search makes on its own: MLPerf Endpoints' longest point (docs/sources.md §2)
MAX_RERUN_S = 1200.0


@dataclass
class Bisection:
    """The search state. It tries ``lo``, then ``hi``, then the middle of the bracket between the
    highest passing and the lowest failing rate, until the bracket is within ``tolerance`` of the
    failing rate, or ``max_iterations`` runs were made (bounds included).

    A run that proved nothing for want of samples (invalid: too few for the early-stopping evidence,
    the minimum query count or duration) is neither a pass nor a miss: ``record_insufficient`` has the
    same rate run again for the duration that would have them (at most MAX_LENGTHENINGS times, each at
    most MAX_RERUN_S)."""

    lo: float
    hi: float
    tolerance: float = DEFAULT_TOLERANCE
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    passed: float | None = None  # the highest rate that met the SLOs
    failed: float | None = None  # the lowest rate that missed them
    tried: list[tuple[float, bool]] = field(default_factory=list)
    done_because: str | None = None
    lengthened: list[tuple[float, float]] = field(default_factory=list)  # (rate, duration s) reruns
    _retry: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.lo < self.hi:
            raise ValueError(f"search bounds: need 0 < min < max (got {self.lo:g} and {self.hi:g})")
        if not 0 < self.tolerance < 1:
            raise ValueError("--tolerance must be between 0 and 1 (e.g. 0.05 for 5 %)")
        if self.max_iterations < 2:
            raise ValueError("--max-iterations must be ≥ 2 (the two bounds)")

    def next_rate(self) -> float | None:
        """The next rate to run, or None when the search is over (``done_because`` says why)."""
        if self.done_because is not None:
            return None
        if self._retry is not None:
            return self._retry[0]
        if not self.tried:
            return self.lo
        if len(self.tried) == 1:
            return self.hi
        assert self.passed is not None and self.failed is not None
        if self.failed - self.passed <= self.tolerance * self.failed:
            self.stop(
                f"converged: {self.passed:g} req/s meets the SLOs, {self.failed:g} req/s does not "
                f"(within {self.tolerance:.0%})"
            )
            return None
        if len(self.tried) >= self.max_iterations:
            self.stop(
                f"{self.max_iterations} runs made (--max-iterations): {self.passed:g} req/s meets the "
                f"SLOs, {self.failed:g} req/s does not"
            )
            return None
        return (self.passed + self.failed) / 2

    def next_duration(self) -> float | None:
        """The next run's own duration (s): a rate rerun for samples; None: the sweep's point duration."""
        return self._retry[1] if self._retry is not None else None

    def record_insufficient(self, rate: float, needs_duration_s: float) -> None:
        """The run at ``rate`` lacked samples only; run it again for ``needs_duration_s``."""
        self._retry = None
        if needs_duration_s > MAX_RERUN_S:
            self.stop(
                f"{rate:g} req/s would need {needs_duration_s:g} s of requests to prove its percentiles "
                f"(over the {MAX_RERUN_S:g} s a rerun may take): raise --min (a higher rate proves them "
                "sooner) or give a longer --point-duration"
            )
            return
        reruns = sum(1 for r, _ in self.lengthened if r == rate)
        if reruns >= MAX_LENGTHENINGS:
            self.stop(
                f"{rate:g} req/s still lacked samples after {reruns} longer runs (last needed "
                f"{needs_duration_s:g} s): give a longer --point-duration"
            )
            return
        self.lengthened.append((rate, needs_duration_s))
        self._retry = (rate, needs_duration_s)

    def record(self, rate: float, passed: bool) -> None:
        """The verdict of the run at ``rate`` (each middle lies inside the bracket, so it stays ordered)."""
        self._retry = None
        self.tried.append((rate, passed))
        if passed:
            self.passed = rate if self.passed is None else max(self.passed, rate)
        else:
            self.failed = rate if self.failed is None else min(self.failed, rate)
        if len(self.tried) == 1 and not passed:
            self.stop(f"the lowest rate ({rate:g} req/s) misses the SLOs; lower --min")
        elif len(self.tried) == 2 and passed:
            self.stop(f"the highest rate ({rate:g} req/s) meets the SLOs; raise --max")

    def stop(self, why: str) -> None:
        """End the search early (an interrupted or failed run)."""
        self.done_because = why
