"""SLOs as written (profile ``slos``, ``--slo``, the web UI): keys, values with explicit units, one SLO each."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any

# Metrics an SLO may name (the latency histograms of loadtest.metrics.recorder.LATENCY_METRICS).
SLO_METRICS: tuple[str, ...] = ("ttft", "ttft_send", "ttfa", "itl", "tpot", "e2e", "schedule_lag")

_UNIT_MS = {"us": 0.001, "µs": 0.001, "ms": 1.0, "s": 1000.0}
_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
_DURATION = re.compile(rf"^{_NUMBER}\s*(us|µs|ms|s)?$")
_PERCENT = re.compile(rf"^{_NUMBER}\s*%$")
_KEY = re.compile(r"^(?P<metric>[a-z][a-z0-9_]*?)_p(?P<pct>\d+(?:\.\d+)?)$")
RATE_KEYS = ("error_rate", "quality_min", "conversation_attainment")
ALLOWED_FORMS = (
    "<metric>_p<percentile>=<duration> with metric one of "
    + ", ".join(SLO_METRICS)
    + " and a duration with its unit: 2s, 80ms, 1.5 s, 500us (e.g. ttft_p99=2s); "
    "error_rate=<percent> like 0.5% (or a fraction below 1 such as 0.005); "
    "quality_min=<percent> like 99% (the least share of ok requests passing every answer check); "
    "conversation_attainment=<percent> like 90% (the least share of conversations whose every call met "
    "the per-request SLOs)"
)


def _text(value: Any) -> str:
    """``value`` as it was written (a YAML number shown without a trailing .0)."""
    return f"{value:g}" if isinstance(value, float) else str(value).strip()


def _number(value: Any, what: str, example: str) -> tuple[float, str | None]:
    """The number and its unit (None: a bare number); ValueError when it is neither."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not {what} (e.g. {example})")
    if not isinstance(value, str):
        number, unit = float(value), None
    else:
        m = _DURATION.match(value.strip()) or _PERCENT.match(value.strip())
        if not m:
            raise ValueError(f"{value!r} is not {what} (e.g. {example})")
        number = float(m.group(1))
        unit = "%" if value.strip().endswith("%") else (m.group(2) if m.lastindex == 2 else None)
    if math.isnan(number) or math.isinf(number) or number < 0:
        raise ValueError(f"{value!r} is not a finite {what} ≥ 0")
    return number, unit


def parse_duration_ms(value: str | float | int) -> float:
    """'2s' → 2000.0, '80ms' → 80.0, '1.5 s' → 1500.0, '500us' → 0.5; a bare number other than 0 is
    refused (2 could be 2 ms or 2 s): ValueError whose text is the fix."""
    number, unit = _number(value, "a duration", "2s, 80ms, 500us")
    if unit == "%":
        raise ValueError(f"{_text(value)} is a percentage, not a duration: give 2s, 80ms or 500us")
    if unit is None:
        if number == 0:
            return 0.0
        shown = _text(value)
        raise ValueError(f"give a unit: {shown}ms or {shown}s")
    return number * _UNIT_MS[unit]


def parse_percent(value: str | float | int) -> float:
    """'0.5%' → 0.005; a bare number is a fraction, taken only below 1 (0.005; 0 is 0): 1 could be 1 % or
    100 %. ValueError whose text is the fix."""
    number, unit = _number(value, "a percentage", "0.5%")
    if unit is None:
        if number >= 1:
            shown = _text(value)
            raise ValueError(
                f"give a unit: {shown}% (a bare number is a fraction below 1, e.g. 0.005 for 0.5%)"
            )
        return number
    if unit != "%":
        raise ValueError(f"{_text(value)} is a duration, not a percentage: give e.g. 0.5%")
    if number > 100:
        raise ValueError(f"{_text(value)} is over 100%")
    return number / 100.0


@dataclass(frozen=True, slots=True)
class Slo:
    """A latency percentile objective: ``metric``'s ``percentile`` (e.g. 99.0) must be ≤ ``limit_ms``."""

    metric: str
    percentile: float
    limit_ms: float

    @property
    def key(self) -> str:
        """The key as written in profiles and on the CLI, e.g. ``ttft_p99`` or ``ttft_p99.9``."""
        return f"{self.metric}_p{self.percentile:g}"

    @property
    def p(self) -> float:
        """The percentile as a fraction (0.99 for p99)."""
        return self.percentile / 100.0


@dataclass(frozen=True, slots=True)
class ErrorRateSlo:
    """The fraction of failed requests (cancelled ones excluded) must be ≤ ``limit``."""

    limit: float

    @property
    def key(self) -> str:
        return "error_rate"


@dataclass(frozen=True, slots=True)
class QualitySlo:
    """The share of ok requests that pass every answer check (client/quality.py) must be ≥ ``limit``."""

    limit: float

    @property
    def key(self) -> str:
        return "quality_min"


@dataclass(frozen=True, slots=True)
class ConversationSlo:
    """The share of judged conversations whose every call met the per-request SLOs must be ≥ ``limit``
    (judged with early stopping on the conversations' count, metrics/conversations.py)."""

    limit: float

    @property
    def key(self) -> str:
        return "conversation_attainment"


AnySlo = Slo | ErrorRateSlo | QualitySlo | ConversationSlo


def _close_key(key: str) -> str:
    """' (did you mean tpot_p99?)' for a near miss such as ``tpot_99``, else ''."""
    known = [f"{m}_p99" for m in SLO_METRICS] + list(RATE_KEYS)
    guess = re.sub(r"_p?(\d+(?:\.\d+)?)$", r"_p\1", key.lower().replace("-", "_"))
    m = _KEY.match(guess)
    if guess != key and m and m.group("metric") in SLO_METRICS:
        return f" (did you mean {guess}?)"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def parse_slo(key: str, value: Any) -> AnySlo:
    """One SLO from its key and value as written; ValueError with one line: the key, the value, the fix."""
    key = key.strip()
    written = f"{key}={_text(value)}" if isinstance(value, int | float | str) else key
    try:
        if key == "quality_min":
            return QualitySlo(parse_percent(value))
        if key == "error_rate":
            return ErrorRateSlo(parse_percent(value))
        if key == "conversation_attainment":
            share = parse_percent(value)
            if not 0.0 < share < 1.0:
                raise ValueError("the share must be strictly between 0% and 100% (e.g. 90%)")
            return ConversationSlo(share)
        m = _KEY.match(key)
        if not m or m.group("metric") not in SLO_METRICS:
            raise ValueError(f"unknown SLO key{_close_key(key)}. Allowed forms: {ALLOWED_FORMS}")
        pct = float(m.group("pct"))
        if not 0.0 < pct < 100.0:
            raise ValueError(
                f"the percentile must be strictly between 0 and 100 (e.g. {m.group('metric')}_p99)"
            )
        return Slo(m.group("metric"), pct, parse_duration_ms(value))
    except ValueError as e:
        raise ValueError(f"{written}: {e}") from None
