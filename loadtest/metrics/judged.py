"""The judged window's rules that are not the scan: the default warm-up (and its start-up line), the
window itself, steady-state detection, and a record-log line back into a RequestRecord.

Choosing the window, the generator's steady-state health and goodput are computed in one place only:
``metrics/judged_scan.py`` (``JudgingScan``), from the record log read batch by batch."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadtest.client.record import RequestRecord
from loadtest.contracts.record_line import LineLike, as_line

_BASE_NS = 10**12  # records keep µs offsets from their scheduled time; rebuild on a non-zero base

# The default warm-up (when neither the profile's judging.warmup_s nor --warmup says): requests
# scheduled in the first 10 % of the schedule, at most 30 s, are left out of the judged window. Every
# stream starting at once, connections being set up and caches filling are the start-up, not the
# endpoint's steady state. ``--warmup 0`` judges from the first request.
DEFAULT_WARMUP_SHARE = 0.1
DEFAULT_WARMUP_MAX_S = 30.0


def default_warmup_s(span_s: float) -> float:
    """The default warm-up of a schedule ``span_s`` seconds long: 10 % of it, at most 30 s."""
    return round(min(DEFAULT_WARMUP_MAX_S, max(0.0, span_s) * DEFAULT_WARMUP_SHARE), 3)


def judged_warmup_s(warmup: float | str | None, duration_s: float) -> float:
    """The warm-up a run of ``duration_s`` will leave out, as far as it is known up front (auto: 0)."""
    if warmup is None:
        return default_warmup_s(duration_s)
    return float(warmup) if not isinstance(warmup, str) else 0.0


def describe_warmup(warmup: float | str | None, duration_s: float) -> str:
    """For the start-up line: ``judged after a 3 s warm-up (the default: 10 % of the run, at most 30 s;
    --warmup 0 judges from the start)``."""
    if warmup is None:
        return (
            f"judged after a {default_warmup_s(duration_s):g} s warm-up (the default: "
            f"{DEFAULT_WARMUP_SHARE:.0%} of the run, at most {DEFAULT_WARMUP_MAX_S:g} s; --warmup 0 judges from the start)"
        )
    if warmup == "auto":
        return "judged from the detected steady state (warm-up auto)"
    return (
        f"judged after a {float(warmup):g} s warm-up"
        if warmup
        else "judged from the first request (no warm-up)"
    )


@dataclass(frozen=True)
class Window:
    """Requests scheduled in [start, end) (epoch seconds) are judged."""

    start: float
    end: float
    warmup_s: float
    cooldown_s: float
    automatic: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "duration_s": round(self.end - self.start, 3),
            "warmup_s": round(self.warmup_s, 3),
            "cooldown_s": round(self.cooldown_s, 3),
            "automatic": self.automatic,
        }


def record_from_line(line: LineLike) -> RequestRecord:
    """A record-log line back into a RequestRecord (µs resolution), so metrics are computed one way only."""
    return RequestRecord.from_log(as_line(line), _BASE_NS)


def steady_state(rates: Sequence[float], span: int = 3, level: float = 0.9) -> tuple[int, int]:
    """(first, last) second of steady state: where the rolling ``span``-second mean of throughput first
    reaches, and last holds, ``level`` × the median of the run's middle half."""
    n = len(rates)
    if n < 4 * span:
        return 0, n
    middle = sorted(rates[n // 4 : n - n // 4])
    ref = statistics.median(middle) * level
    rolling = [sum(rates[i : i + span]) / span for i in range(n - span + 1)]
    first = next((i for i, v in enumerate(rolling) if v >= ref), 0)
    last = next((i + span for i in range(len(rolling) - 1, -1, -1) if rolling[i] >= ref), n)
    return first, max(last, first + 1)
