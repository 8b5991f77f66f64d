"""SLO parsing (profile dict or CLI text), per-request goodness, attainment and goodput."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loadtest.contracts.record_line import LineLike, as_line

# Metrics an SLO may name (the latency histograms of loadtest.metrics.recorder.LATENCY_METRICS).
SLO_METRICS: tuple[str, ...] = ("ttft", "ttft_send", "ttfa", "itl", "tpot", "e2e", "schedule_lag")

_UNIT_MS = {"us": 0.001, "µs": 0.001, "ms": 1.0, "s": 1000.0}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)\s*(us|µs|ms|s)?$")
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)\s*%$")
_KEY = re.compile(r"^(?P<metric>[a-z][a-z0-9_]*?)_p(?P<pct>\d+(?:\.\d+)?)$")
ALLOWED_FORMS = (
    "<metric>_p<percentile>=<duration> with metric one of "
    + ", ".join(SLO_METRICS)
    + " and duration like 2s, 80ms, 1.5 s, 500us or a bare number of ms (e.g. ttft_p99=2s); "
    "error_rate=<percent> like 0.5% (or a bare fraction such as 0.005); "
    "quality_min=<percent> like 99% (the least share of ok requests passing every answer check)"
)


def parse_duration_ms(text: str | float | int) -> float:
    """'2s' → 2000.0, '80ms' → 80.0, '1.5 s' → 1500.0, '500us' → 0.5; a bare number is milliseconds."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration (e.g. 2s, 80ms, 500us)")
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = _DURATION.match(text.strip())
        if not m:
            raise ValueError(
                f"{text!r} is not a duration: use a number with us, ms or s (e.g. 2s, 80ms, 500us)"
            )
        value = float(m.group(1)) * _UNIT_MS[m.group(2) or "ms"]
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ValueError(f"{text!r} is not a finite duration ≥ 0")
    return value


def parse_percent(text: str | float | int) -> float:
    """'0.5%' → 0.005; a bare number is already a fraction in [0, 1] (0.005)."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a percentage (e.g. 0.5%)")
    if isinstance(text, int | float):
        value = float(text)
    else:
        s = text.strip()
        m = _PERCENT.match(s)
        if m:
            value = float(m.group(1)) / 100.0
        else:
            try:
                value = float(s)
            except ValueError:
                raise ValueError(
                    f"{text!r} is not a percentage (e.g. 0.5%) or a fraction (e.g. 0.005)"
                ) from None
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(
            f"{text!r} is not a rate between 0% and 100% (a bare number is a fraction in [0, 1])"
        )
    return value


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


AnySlo = Slo | ErrorRateSlo | QualitySlo


def _parse_one(key: str, value: Any) -> AnySlo:
    key = key.strip()
    if key == "quality_min":
        try:
            return QualitySlo(parse_percent(value))
        except ValueError as e:
            raise ValueError(f"SLO {key!r}: {e}. Allowed forms: {ALLOWED_FORMS}") from None
    if key == "error_rate":
        try:
            return ErrorRateSlo(parse_percent(value))
        except ValueError as e:
            raise ValueError(f"SLO {key!r}: {e}. Allowed forms: {ALLOWED_FORMS}") from None
    m = _KEY.match(key)
    if not m or m.group("metric") not in SLO_METRICS:
        raise ValueError(f"unknown SLO key {key!r}. Allowed forms: {ALLOWED_FORMS}")
    pct = float(m.group("pct"))
    if not 0.0 < pct < 100.0:
        raise ValueError(
            f"SLO {key!r}: the percentile must be strictly between 0 and 100. Allowed forms: {ALLOWED_FORMS}"
        )
    try:
        limit = parse_duration_ms(value)
    except ValueError as e:
        raise ValueError(f"SLO {key!r}: {e}. Allowed forms: {ALLOWED_FORMS}") from None
    return Slo(m.group("metric"), pct, limit)


def parse_slos(spec: Mapping[str, Any] | str | None) -> list[AnySlo]:
    """Parse the profile's ``slos`` dict or the CLI text ``ttft_p99=2s,tpot_p99=80ms,error_rate=0.5%``."""
    if spec is None:
        return []
    if isinstance(spec, str):
        items: list[tuple[str, Any]] = []
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part:
                raise ValueError(f"SLO {part!r} has no '=': write key=value. Allowed forms: {ALLOWED_FORMS}")
            k, v = part.split("=", 1)
            items.append((k.strip(), v.strip()))
    elif isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        raise ValueError(
            f"SLOs must be a mapping or text like ttft_p99=2s,error_rate=0.5% (got {type(spec).__name__})"
        )
    out: list[AnySlo] = []
    seen: set[str] = set()
    for k, v in items:
        slo = _parse_one(k, v)
        if slo.key in seen:
            raise ValueError(f"SLO {k!r} is given twice")
        seen.add(slo.key)
        out.append(slo)
    return out


@dataclass(frozen=True, slots=True)
class RequestSlo:
    """Per-request limits: a request is good when it is ok and meets every limit given.

    A request without a TPOT (one output token or fewer, or not streamed) meets the TPOT limit
    (MLPerf: such requests have no TPOT); a missing TTFT fails a TTFT limit.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    @classmethod
    def from_slos(cls, slos: Iterable[AnySlo]) -> RequestSlo:
        """TTFT and TPOT limits from parsed SLOs (the highest percentile's limit when several)."""
        best: dict[str, Slo] = {}
        for s in slos:
            if (
                isinstance(s, Slo)
                and s.metric in ("ttft", "tpot")
                and (s.metric not in best or s.percentile > best[s.metric].percentile)
            ):
                best[s.metric] = s
        return cls(
            ttft_ms=best["ttft"].limit_ms if "ttft" in best else None,
            tpot_ms=best["tpot"].limit_ms if "tpot" in best else None,
        )

    def is_good_record(self, rec: Any) -> bool:
        """Judge a live ``RequestRecord`` (the same rule as ``is_good`` on its log line)."""
        if rec.outcome != "ok":
            return False
        if self.ttft_ms is not None:
            ttft = rec.ttft_us()
            if ttft is None or ttft > self.ttft_ms * 1000.0:
                return False
        if self.tpot_ms is not None:
            tpot = rec.tpot_us()
            if tpot is not None and tpot > self.tpot_ms * 1000.0:
                return False
        return True

    def is_good(self, record: LineLike) -> bool:
        """Judge one record-log line (``outcome``, ``ttft_us``, ``tpot_us``)."""
        line = as_line(record)
        if line.outcome != "ok":
            return False
        if self.ttft_ms is not None:
            ttft = line.ttft_us
            if ttft is None or ttft > self.ttft_ms * 1000.0:
                return False
        if self.tpot_ms is not None:
            tpot = line.tpot_us
            if tpot is not None and tpot > self.tpot_ms * 1000.0:
                return False
        return True


def merge_slos(profile_slos: Mapping[str, Any] | None, cli: str | None) -> list[AnySlo]:
    """The profile's SLOs with the command line's on top (same key: the command line wins)."""
    merged = {s.key: s for s in parse_slos(dict(profile_slos or {}))}
    merged.update({s.key: s for s in parse_slos(cli)})
    return list(merged.values())
