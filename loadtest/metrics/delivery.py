"""Merged and burst delivery: streams whose token events reached the client in far fewer reads than the
server wrote them, or in bursts of reads far closer together than the stream's pace (a buffering proxy or
gateway), per request and per run; the run's diagnosis (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from loadtest.client.record import merged_gap_mask

# A stream is judged only with this many token events: fewer say nothing about how they were delivered.
MIN_EVENTS = 8
# Merged: on average this many token events per socket read, or the first read holding this share of
# them. A server that puts many tokens in one event (one chunk per N tokens) writes one event per read:
# the test counts events against reads, never tokens.
EVENTS_PER_READ = 4.0
FIRST_READ_SHARE = 0.5
# Bursts: a gap between two separate reads is a burst gap when it is shorter than BURST_FRACTION of the
# stream's mean gap, (last - first) / (events - 1); a stream is delivered in bursts when at least
# BURST_STREAM_SHARE of its timed (not merged) gaps are burst gaps. Measured in docs/metrics.md, "Burst
# delivery": under load through LiteLLM 71-85 % of a run's streams qualify, direct from the engine at
# most 6 % (half instead of 30 % of the gaps: 39-79 % through LiteLLM, too close to the run's RUN_SHARE).
BURST_FRACTION = 0.1
BURST_STREAM_SHARE = 0.3
# The run's diagnosis: at least this share of the judged streams merged (or in bursts), and at least MIN_STREAMS of them.
RUN_SHARE = 0.5
MIN_STREAMS = 3
# The ITL and TPOT figures and SLOs a merged delivery makes meaningless.
UNMEASURABLE = ("itl", "tpot")
CAUSE = (
    "a buffering proxy between client and server (or a server that writes its events together): "
    "TTFT includes the buffering; ITL and TPOT are not measurable"
)
BURST_CAUSE = (
    "a proxy or gateway that re-sends the tokens in bursts: ITL times the proxy, not the server; "
    "ITL and TPOT are not measurable"
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


def burst_gap_mask(times: np.ndarray) -> np.ndarray:
    """Per gap between consecutive token events (``times``, sorted): True when it is a burst gap, a gap
    between separate reads (not merged: ``merged_gap_mask``) shorter than BURST_FRACTION of the stream's
    mean gap."""
    n = int(times.size) - 1
    if n < 1:
        return np.zeros(0, dtype=bool)
    pace = (times[-1] - times[0]) / n
    return ~merged_gap_mask(times) & (times[1:] - times[:-1] < BURST_FRACTION * pace)


def stream_bursts(times: np.ndarray) -> np.ndarray | None:
    """The burst gaps (``burst_gap_mask``) of a stream delivered in bursts: at least MIN_EVENTS events and
    at least BURST_STREAM_SHARE of its timed gaps burst gaps; None for any other stream."""
    if int(times.size) < MIN_EVENTS:
        return None
    timed = int((~merged_gap_mask(times)).sum())
    mask = burst_gap_mask(times)
    return mask if timed > 0 and int(mask.sum()) >= BURST_STREAM_SHARE * timed else None


def burst_delivery(times: np.ndarray) -> bool | None:
    """Whether one stream's token events (``times``, sorted) arrived in bursts (``stream_bursts``); None
    when it has fewer than MIN_EVENTS events to judge."""
    if int(times.size) < MIN_EVENTS:
        return None
    return stream_bursts(times) is not None


def merged_share(itl_merged: Mapping[str, Any]) -> float | None:
    """The share of judged streams delivered merged or in bursts (run.json ``metrics.itl_merged``); None
    without any judged stream."""
    streams = int(itl_merged.get("streams") or 0)
    return _untimed(itl_merged) / streams if streams else None


def _untimed(itl_merged: Mapping[str, Any]) -> int:
    return int(itl_merged.get("merged_streams") or 0) + int(itl_merged.get("burst_streams") or 0)


def dominant(itl_merged: Mapping[str, Any]) -> bool:
    """Whether merged or burst delivery is the run's pattern (RUN_SHARE of at least MIN_STREAMS judged
    streams, the two counted together)."""
    share = merged_share(itl_merged)
    return share is not None and _untimed(itl_merged) >= MIN_STREAMS and share >= RUN_SHARE


def diagnosis(itl_merged: Mapping[str, Any]) -> str | None:
    """The one-line diagnosis when merged or burst delivery dominates the run (named after the more
    frequent of the two), else None."""
    if not dominant(itl_merged):
        return None
    share = merged_share(itl_merged) or 0.0
    streams = int(itl_merged.get("streams") or 0)
    if int(itl_merged.get("burst_streams") or 0) > int(itl_merged.get("merged_streams") or 0):
        return (
            f"burst delivery: {share * 100:.0f} % of {streams} streamed requests reached the client "
            f"merged or in bursts of reads far closer together than the stream's pace: {BURST_CAUSE}"
        )
    return (
        f"merged delivery: {share * 100:.0f} % of {streams} streamed "
        f"requests reached the client in far fewer reads than the server's events: {CAUSE}"
    )


def not_measurable(metric: str) -> str:
    """The detail of a figure or SLO on ``metric`` that merged or burst delivery makes meaningless."""
    return f"not measurable: {metric.upper()} of tokens that arrived merged or in bursts times the proxy"
