"""Merged delivery: streams whose token events reached the client in far fewer reads than the server
wrote them (a buffering proxy), per request and per run; the run's diagnosis (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

# A stream is judged only with this many token events: fewer say nothing about how they were delivered.
MIN_EVENTS = 8
# Merged: on average this many token events per socket read, or the first read holding this share of
# them. A server that puts many tokens in one event (one chunk per N tokens) writes one event per read:
# the test counts events against reads, never tokens.
EVENTS_PER_READ = 4.0
FIRST_READ_SHARE = 0.5
# The run's diagnosis: at least this share of the judged streams merged, and at least MIN_STREAMS of them.
RUN_SHARE = 0.5
MIN_STREAMS = 3
# The ITL and TPOT figures and SLOs a merged delivery makes meaningless.
UNMEASURABLE = ("itl", "tpot")
CAUSE = (
    "a buffering proxy between client and server (or a server that writes its events together): "
    "TTFT includes the buffering; ITL and TPOT are not measurable"
)


def merged_delivery(times: np.ndarray) -> bool | None:
    """Whether one stream's token events (``times``: their arrival times, sorted; events in one read
    share a time) arrived merged; None when it has fewer than MIN_EVENTS events to judge."""
    n = int(times.size)
    if n < MIN_EVENTS:
        return None
    new_read = times[1:] != times[:-1]
    reads = int(new_read.sum()) + 1
    if n >= EVENTS_PER_READ * reads:
        return True
    first = int(np.argmax(new_read)) + 1 if reads > 1 else n  # events in the first read
    return first >= FIRST_READ_SHARE * n


def merged_share(itl_merged: Mapping[str, Any]) -> float | None:
    """The share of judged streams delivered merged (run.json ``metrics.itl_merged``); None without any."""
    streams = int(itl_merged.get("streams") or 0)
    return int(itl_merged.get("merged_streams") or 0) / streams if streams else None


def dominant(itl_merged: Mapping[str, Any]) -> bool:
    """Whether merged delivery is the run's pattern (RUN_SHARE of at least MIN_STREAMS judged streams)."""
    share = merged_share(itl_merged)
    merged = int(itl_merged.get("merged_streams") or 0)
    return share is not None and merged >= MIN_STREAMS and share >= RUN_SHARE


def diagnosis(itl_merged: Mapping[str, Any]) -> str | None:
    """The one-line diagnosis when merged delivery dominates the run, else None."""
    if not dominant(itl_merged):
        return None
    share = merged_share(itl_merged) or 0.0
    return (
        f"merged delivery: {share * 100:.0f} % of {int(itl_merged.get('streams') or 0)} streamed "
        f"requests reached the client in far fewer reads than the server's events: {CAUSE}"
    )


def not_measurable(metric: str) -> str:
    """The detail of a figure or SLO on ``metric`` that merged delivery makes meaningless."""
    return f"not measurable: {metric.upper()} of tokens that arrived merged times the proxy's buffer"
