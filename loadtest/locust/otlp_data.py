"""The live metrics' Prometheus families (what ``--prometheus-port`` renders) as OpenTelemetry metrics data:
counters as monotonic cumulative sums, gauges as gauges, histograms as explicit-bucket histograms at
the Prometheus bounds (docs/sources.md §15)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the otlp extra: imported where a push is asked for (loadtest/locust/otlp_push.py)
    from opentelemetry.sdk.metrics.export import Metric, MetricsData

SCOPE = "loadtest"
UNITS = {"histogram": "s"}  # the latency histograms are in seconds; counts and ratios carry no unit


def _number(value: float) -> int | float:
    """A whole count as an integer (OTLP's as_int), anything else as a double."""
    return int(value) if value.is_integer() else value


def _histogram_point(samples: list[Any], start_ns: int, now_ns: int) -> Any:
    """One label set's ``_bucket``/``_sum``/``_count`` samples as a cumulative histogram point: OTLP's
    per-bucket counts from Prometheus's cumulative ``le`` counts (bucket i is (bound[i-1], bound[i]],
    the last one above the largest bound)."""
    from opentelemetry.sdk.metrics.export import HistogramDataPoint

    cumulative = sorted(
        (float(s.labels["le"]), s.value) for s in samples if s.name.endswith("_bucket")
    )  # "+Inf" parses as inf: last
    total = next(s.value for s in samples if s.name.endswith("_count"))
    bounds = [le for le, _ in cumulative if math.isfinite(le)]
    counts, below = [], 0.0
    for _, c in cumulative:
        counts.append(int(c - below))
        below = c
    if len(counts) == len(bounds):  # no +Inf bucket: the rest of the count lies above the last bound
        counts.append(int(total - below))
    labels = {k: v for k, v in samples[0].labels.items() if k != "le"}
    return HistogramDataPoint(
        attributes=labels,
        start_time_unix_nano=start_ns,
        time_unix_nano=now_ns,
        count=int(total),
        sum=next(s.value for s in samples if s.name.endswith("_sum")),
        bucket_counts=counts,
        explicit_bounds=bounds,
        min=None,  # type: ignore[arg-type]  # optional in OTLP: the buckets do not say (left unset)
        max=None,  # type: ignore[arg-type]
    )


def _family_metrics(family: Any, start_ns: int, now_ns: int) -> list[Metric]:
    """One Prometheus family as OTLP metrics; the metric is named as its Prometheus samples are
    (counters with ``_total``), so that a collector's Prometheus exporter gives back the same names."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        Metric,
        NumberDataPoint,
        Sum,
    )

    cumulative = AggregationTemporality.CUMULATIVE
    desc, unit = family.documentation, UNITS.get(family.type, "")
    if family.type == "counter":
        points = [
            NumberDataPoint(dict(s.labels), start_ns, now_ns, _number(s.value))
            for s in family.samples
            if s.name.endswith("_total")
        ]
        if not points:
            return []
        return [Metric(f"{family.name}_total", desc, unit, Sum(points, cumulative, True))]
    if family.type == "gauge":
        points = [NumberDataPoint(dict(s.labels), 0, now_ns, float(s.value)) for s in family.samples]
        return [Metric(family.name, desc, unit, Gauge(points))] if points else []
    if family.type == "histogram":
        by_labels: dict[tuple[tuple[str, str], ...], list[Any]] = {}
        for s in family.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            by_labels.setdefault(key, []).append(s)
        hpoints = [_histogram_point(group, start_ns, now_ns) for group in by_labels.values()]
        return [Metric(family.name, desc, unit, Histogram(hpoints, cumulative))] if hpoints else []
    return []


def metrics_data(
    families: Iterable[Any], resource: Mapping[str, str], start_ns: int, now_ns: int, version: str
) -> MetricsData:
    """``families`` (a ``LiveCollector.collect()``: one snapshot of the run) as one OTLP export:
    ``resource`` its attributes (merged over ``OTEL_RESOURCE_ATTRIBUTES``), ``start_ns`` the start of
    the cumulative series (the run's), ``now_ns`` the snapshot's time."""
    from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    metrics = [m for family in families for m in _family_metrics(family, start_ns, now_ns)]
    scope = ScopeMetrics(InstrumentationScope(SCOPE, version), metrics, "")
    return MetricsData([ResourceMetrics(Resource.create(dict(resource)), [scope], "")])
