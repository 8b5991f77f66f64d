"""The live dashboard's time series: windowed percentiles, rates, in-flight and SLO attainment, bounded."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadtest.metrics import hdr
from loadtest.metrics.recorder import Aggregate, RunAggregates

SERIES_METRICS: tuple[str, ...] = ("ttft", "itl", "tpot", "e2e")
WINDOW_PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0))
DEFAULT_INTERVAL_S = 2.0
MAX_POINTS = 600  # when full, every other point goes and the interval doubles: any run length fits


def _ms(us: int | None) -> float | None:
    return None if us is None else round(us / 1000.0, 3)


def _ratio(good: int, judged: int) -> float | None:
    return round(good / judged, 4) if judged > 0 else None


@dataclass
class ScopeSeries:
    """One scope's columns (all requests, or one scenario): one value per sample, None before it existed.

    Latencies are the percentiles of the requests (ITL: the gaps) recorded since the previous sample
    (``p50``/``p90``/``p99``) and of the run so far (``p99_run``), in ms. Rates are per second of the
    window: successful and failed requests, output tokens of the requests that completed in it, and
    the failed requests of each outcome class. Attainment is the share of judged requests that met
    the per-request SLO, in the window and over the run.
    """

    latency_ms: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)
    ok_per_s: list[float | None] = field(default_factory=list)
    failed_per_s: list[float | None] = field(default_factory=list)
    output_tokens_per_s: list[float | None] = field(default_factory=list)
    errors_per_s: dict[str, list[float | None]] = field(default_factory=dict)
    attainment: list[float | None] = field(default_factory=list)
    attainment_run: list[float | None] = field(default_factory=list)
    # the previous sample's cumulative state (the window is the difference)
    _counts: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _outcomes: Counter[str] = field(default_factory=Counter, repr=False)
    _totals: Counter[str] = field(default_factory=Counter, repr=False)

    def columns(self) -> list[list[float | None]]:
        cols = [self.ok_per_s, self.failed_per_s, self.output_tokens_per_s, self.attainment]
        cols += [self.attainment_run, *self.errors_per_s.values()]
        return cols + [c for m in self.latency_ms.values() for c in m.values()]

    def pad(self, n: int) -> None:
        """None for the ``n`` samples taken before this scope had any request (zero errors for a class)."""
        self.ok_per_s += [None] * n
        self.failed_per_s += [None] * n
        self.output_tokens_per_s += [None] * n
        self.attainment += [None] * n
        self.attainment_run += [None] * n
        for metric in SERIES_METRICS:
            cols = self.latency_ms.setdefault(metric, {})
            for name in (*(k for k, _ in WINDOW_PERCENTILES), "p99_run"):
                cols.setdefault(name, []).extend([None] * n)

    def add(self, agg: Aggregate, window_s: float, points_before: int) -> None:
        """Append one sample: the window since the last ``add`` (``window_s`` long)."""
        for metric in SERIES_METRICS:
            hist = agg.hists[metric]
            now = hdr.counts_of(hist)
            prev = self._counts.get(metric)
            window = now if prev is None else now - prev
            self._counts[metric] = now
            values = hdr.percentiles_of_counts(hist, window, [p for _, p in WINDOW_PERCENTILES])
            cols = self.latency_ms[metric]
            for (name, _), v in zip(WINDOW_PERCENTILES, values, strict=True):
                cols[name].append(_ms(v))
            (run_p99,) = hdr.fast_percentiles(hist, (99.0,))
            cols["p99_run"].append(_ms(run_p99))
        outcomes = Counter({k: int(v) for k, v in agg.outcomes.items()})
        d_out = outcomes - self._outcomes
        totals = Counter({k: int(agg.totals.get(k, 0)) for k in ("output_tokens", "slo_judged", "slo_good")})
        d_tot = Counter(totals)
        d_tot.subtract(self._totals)
        self._outcomes, self._totals = outcomes, totals
        per_s = 1.0 / window_s if window_s > 0 else 0.0
        failed = {o: n for o, n in d_out.items() if o not in ("ok", "cancelled")}
        self.ok_per_s.append(round(d_out.get("ok", 0) * per_s, 3))
        self.failed_per_s.append(round(sum(failed.values()) * per_s, 3))
        self.output_tokens_per_s.append(round(d_tot["output_tokens"] * per_s, 1))
        self.attainment.append(_ratio(d_tot["slo_good"], d_tot["slo_judged"]))
        self.attainment_run.append(_ratio(totals["slo_good"], totals["slo_judged"]))
        for outcome in outcomes:
            if outcome not in ("ok", "cancelled") and outcome not in self.errors_per_s:
                self.errors_per_s[outcome] = [0.0] * points_before
        for outcome, col in self.errors_per_s.items():
            col.append(round(failed.get(outcome, 0) * per_s, 3))

    def halve(self) -> None:
        for col in self.columns():
            del col[-2::-2]  # every other point, the newest kept

    def to_data(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms,
            "ok_per_s": self.ok_per_s,
            "failed_per_s": self.failed_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "errors_per_s": self.errors_per_s,
            "attainment": self.attainment,
            "attainment_run": self.attainment_run,
        }


class LiveSeries:
    """Samples a run's aggregates (a recorder's, or a master's merge) on an interval into at most
    ``max_points`` points per column.

    Only the cumulative histograms and counters are read: each point is the difference
    from the previous one (one copy of each histogram's counts per scope is kept for that).
    """

    def __init__(
        self, started_epoch: float, interval_s: float = DEFAULT_INTERVAL_S, max_points: int = MAX_POINTS
    ) -> None:
        if max_points < 4:
            raise ValueError("max_points must be at least 4")
        self.started_epoch = started_epoch
        self.interval_s = interval_s
        self.max_points = max_points
        self.t: list[float] = []
        self.in_flight: list[int] = []
        self.users: list[int] = []
        self.scopes: dict[str, ScopeSeries] = {}
        self._last = started_epoch

    def sample(self, aggregates: RunAggregates, now: float, in_flight: int, users: int) -> None:
        """One point at epoch ``now``: the window since the previous point."""
        window = max(now - self._last, 1e-6)
        self._last = now
        n = len(self.t)
        self.t.append(round(now - self.started_epoch, 2))
        self.in_flight.append(in_flight)
        self.users.append(users)
        tracks = [("all", aggregates.all), *sorted(aggregates.scenarios.items())]
        for name, agg in tracks:
            scope = self.scopes.get(name)
            if scope is None:
                scope = self.scopes[name] = ScopeSeries()
                scope.pad(n)
            scope.add(agg, window, n)
        if len(self.t) > self.max_points:
            del self.t[-2::-2]
            del self.in_flight[-2::-2]
            del self.users[-2::-2]
            for scope in self.scopes.values():
                scope.halve()
            self.interval_s *= 2

    def due(self, now: float) -> bool:
        """Whether the next sample is due (``interval_s`` after the previous one)."""
        return now - self._last >= self.interval_s * 0.999

    def to_data(self) -> dict[str, Any]:
        """What /llm/series serves: the sample times (s since the start) and each scope's columns."""
        return {
            "interval_s": self.interval_s,
            "t": self.t,
            "in_flight": self.in_flight,
            "users": self.users,
            "scopes": {name: s.to_data() for name, s in self.scopes.items()},
        }
