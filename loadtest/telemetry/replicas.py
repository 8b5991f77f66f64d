"""Per-replica figures when several metrics URLs are polled: each instance's own requests, rates, cache, KV."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadtest.telemetry.names import REQUEST_COUNTERS, Delta, Gauge, Ratio, candidates, source_names
from loadtest.telemetry.scrape import Scrape

# The level series averaged over the polls of one replica (run.json telemetry.replicas[]: <series>_mean).
LEVELS = ("requests_running", "requests_waiting", "kv_cache_usage")
RATES = ("generation_tokens_per_s", "prompt_tokens_per_s")


def increase(first: Scrape, last: Scrape, name: str) -> float | None:
    """A counter's increase between two scrapes of one instance; None when either lacks it or it went
    down (the instance restarted: its count since then is ``last``'s)."""
    if name not in first.total or name not in last.total:
        return None
    d = last.total[name] - first.total[name]
    return last.total[name] if d < 0 else d


def fraction(v: float) -> float:
    """0..1; an exporter that reports percent (values above 1) is scaled down."""
    if v > 1.0 + 1e-9:
        v /= 100.0
    return round(min(max(v, 0.0), 1.0), 4)


def gauge_value(src: Gauge, cur: Scrape) -> float:
    """A level as the series reads it: a fraction averaged over label sets, a mean, or a sum."""
    if src.fraction:
        return fraction(cur.mean[src.name] * src.scale)
    return round((cur.mean if src.mean else cur.total)[src.name] * src.scale, 3)


@dataclass
class ReplicaView:
    """One metrics URL's own scrapes: the first and the last, and its level gauges at every poll."""

    url: str
    first: Scrape | None = None
    first_t: float = 0.0
    last: Scrape | None = None
    last_t: float = 0.0
    levels: dict[str, list[float]] = field(default_factory=dict)

    def keep(self, cur: Scrape, t: float) -> None:
        if self.first is None:
            self.first, self.first_t = cur, t
        self.last, self.last_t = cur, t
        table = candidates(cur.engine)
        for series in LEVELS:
            src = next((s for s in table[series] if isinstance(s, Gauge) and s.name in cur.total), None)
            if src is not None:
                self.levels.setdefault(series, []).append(gauge_value(src, cur))

    def figures(self) -> dict[str, Any]:
        """run.json ``telemetry.replicas[]``: this instance's figures between its first and last scrape
        (a figure its metrics lack is None)."""
        out: dict[str, Any] = {"url": self.url, "engine": self.last.engine if self.last else "unknown"}
        first, last = self.first, self.last
        seconds = self.last_t - self.first_t
        out["seconds"] = round(seconds, 3)
        out["requests"] = None
        out |= {rate: None for rate in RATES}
        out |= {
            "prefix_cache_hit_rate": None,
            "prefix_cache_hit_tokens": None,
            "prefix_cache_queried_tokens": None,
        }
        if first is not None and last is not None and last is not first:
            out["requests"] = next(
                (round(d) for n in REQUEST_COUNTERS if (d := increase(first, last, n)) is not None), None
            )
            table = candidates(last.engine)
            for rate in RATES:
                names = [s.name for s in table[rate] if isinstance(s, Delta) and s.name in last.total]
                d = increase(first, last, names[0]) if names else None
                out[rate] = round(d / seconds, 3) if d is not None and seconds > 0 else None
            out |= _prefix(first, last, table["prefix_cache_hit_rate"])
        for series in LEVELS:
            got = self.levels.get(series) or []
            out[f"{series}_mean"] = round(sum(got) / len(got), 4) if got else None
            out[f"{series}_max"] = max(got) if got else None
        return out


def _prefix(first: Scrape, last: Scrape, srcs: list[Any]) -> dict[str, Any]:
    for src in srcs:
        if isinstance(src, Ratio) and all(n in last.total for n in source_names(src)):
            hit = increase(first, last, src.num)
            queried = sum(increase(first, last, n) or 0.0 for n in src.den)
            if hit is None or queried <= 0:
                return {}
            return {
                "prefix_cache_hit_rate": fraction(hit / queried),
                "prefix_cache_hit_tokens": round(hit),
                "prefix_cache_queried_tokens": round(queried),
            }
        if isinstance(src, Gauge) and src.name in last.total:
            return {"prefix_cache_hit_rate": gauge_value(src, last)}
    return {}
