"""Client policy of a profile: connect/read/total timeouts and the (off by default) retry policy."""

from __future__ import annotations

from pydantic import Field, field_validator

from loadtest.profile.base import Strict


class RetrySpec(Strict):
    """Which failed answers are sent again, how often and after how long. ``max: 0`` (default) = never."""

    on: list[int] = Field(default_factory=lambda: [429, 503])
    max: int = Field(default=0, ge=0, le=10)
    backoff_s: float = Field(default=1.0, ge=0)
    backoff_factor: float = Field(default=2.0, ge=1)
    max_backoff_s: float = Field(default=30.0, ge=0)
    honor_retry_after: bool = True

    @field_validator("on")
    @classmethod
    def _statuses(cls, v: list[int]) -> list[int]:
        bad = [s for s in v if s != 429 and not 500 <= s <= 599]
        if bad:
            raise ValueError(f"only 429 and 5xx answers can be retried, not {bad}")
        return sorted(set(v))


class ClientSpec(Strict):
    """How each request is bounded in time, and retried. Command-line options override these."""

    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=300.0, gt=0)  # longest silence within a response
    total_timeout_s: float = Field(default=0.0, ge=0)  # whole request; 0 = no limit
    retries: RetrySpec = Field(default_factory=RetrySpec)
    # Closed loop: after a failed request a stream waits 0.05 s, doubling per failure in a row up to
    # this cap, before its next request (reset by a success); 0 = send again at once.
    failure_backoff_max_s: float = Field(default=1.0, ge=0)
    # After the load stops, requests in flight get this long to finish; those still unanswered then are
    # the endpoint's `timeout`s (errors), not cancellations.
    drain_timeout_s: float = Field(default=60.0, gt=0)
