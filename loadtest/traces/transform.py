"""Cutting and re-timing traces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from loadtest.traces.record import TraceRecord


def mean_rate(records: Sequence[TraceRecord]) -> float:
    """Mean arrival rate in req/s: requests per second of span (first to last arrival)."""
    if len(records) < 2:
        return 0.0
    span = records[-1].timestamp_s - records[0].timestamp_s
    return len(records) / span if span > 0 else float("inf")


def window(
    records: Sequence[TraceRecord], start_s: float, end_s: float, rebase: bool = True
) -> list[TraceRecord]:
    """Requests with start_s <= t < end_s; with rebase, timestamps become t - start_s."""
    if end_s < start_s:
        raise ValueError(f"window end {end_s} is before its start {start_s}")
    chosen = [r for r in records if start_s <= r.timestamp_s < end_s]
    if not rebase or start_s == 0:
        return chosen
    return [replace(r, timestamp_s=r.timestamp_s - start_s) for r in chosen]


def rescale(
    records: Sequence[TraceRecord], speedup: float | None = None, target_rate: float | None = None
) -> list[TraceRecord]:
    """Divide timestamps by speedup, or stretch them so mean_rate equals target_rate (give exactly one)."""
    if (speedup is None) == (target_rate is None):
        raise ValueError("give exactly one of speedup and target_rate")
    if target_rate is not None:
        if target_rate <= 0:
            raise ValueError(f"target_rate must be > 0, got {target_rate}")
        rate = mean_rate(records)
        if not 0 < rate < float("inf"):
            raise ValueError("cannot rescale to a rate: the trace spans no time")
        speedup = target_rate / rate
    assert speedup is not None
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    return [replace(r, timestamp_s=r.timestamp_s / speedup) for r in records]
