"""LoadGen-style search for the highest open-loop rate whose run meets the SLOs: bounds, then bisection."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_TOLERANCE = 0.05
DEFAULT_MAX_ITERATIONS = 10


@dataclass
class Bisection:
    """The search state. It tries ``lo``, then ``hi``, then the middle of the bracket between the
    highest passing and the lowest failing rate, until the bracket is within ``tolerance`` of the
    failing rate, or ``max_iterations`` runs were made (bounds included)."""

    lo: float
    hi: float
    tolerance: float = DEFAULT_TOLERANCE
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    passed: float | None = None  # the highest rate that met the SLOs
    failed: float | None = None  # the lowest rate that missed them
    tried: list[tuple[float, bool]] = field(default_factory=list)
    done_because: str | None = None

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

    def record(self, rate: float, passed: bool) -> None:
        """The verdict of the run at ``rate`` (each middle lies inside the bracket, so it stays ordered)."""
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
