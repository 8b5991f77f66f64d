"""SLO parsing (profile dict or CLI text), per-request goodness, attainment and goodput."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loadtest.contracts.record_line import LineLike, as_line
from loadtest.profile.slo_spec import (
    ALLOWED_FORMS,
    RATE_KEYS,
    SLO_METRICS,
    AnySlo,
    ConversationSlo,
    ErrorRateSlo,
    QualitySlo,
    Slo,
    parse_duration_ms,
    parse_percent,
    parse_slo,
)

__all__ = [
    "ALLOWED_FORMS",
    "SLO_METRICS",
    "AnySlo",
    "ConversationSlo",
    "ErrorRateSlo",
    "QualitySlo",
    "RequestSlo",
    "Slo",
    "latency_slos",
    "merge_slos",
    "parse_duration_ms",
    "parse_percent",
    "parse_slos",
]


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
                raise ValueError(f"{part}: no '=': write key=value with a unit (e.g. ttft_p99=2s)")
            k, v = part.split("=", 1)
            items.append((k.strip(), v.strip()))
    elif isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        raise ValueError(
            f"SLOs are a mapping or text like ttft_p99=2s,error_rate=0.5% (got {type(spec).__name__})"
        )
    out: list[AnySlo] = []
    seen: set[str] = set()
    for k, v in items:
        slo = parse_slo(k, v)
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


def latency_slos(limits_ms: Mapping[str, float]) -> list[Slo]:
    """Latency SLOs from keys and limits already in milliseconds (run.json, sweep.json: no units)."""
    keys = [(parse_slo(k, "0ms"), v) for k, v in limits_ms.items() if k not in RATE_KEYS]
    return [Slo(s.metric, s.percentile, float(v)) for s, v in keys if isinstance(s, Slo)]


def merge_slos(profile_slos: Mapping[str, Any] | None, cli: str | None) -> list[AnySlo]:
    """The profile's SLOs with the command line's on top (same key: the command line wins)."""
    merged = {s.key: s for s in parse_slos(dict(profile_slos or {}))}
    merged.update({s.key: s for s in parse_slos(cli)})
    return list(merged.values())
