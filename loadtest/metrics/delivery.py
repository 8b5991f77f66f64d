"""Merged and burst delivery: streams whose token events reached the client in far fewer reads than the
server wrote them, or in bursts of reads far closer together than the stream's pace (a buffering proxy or
gateway), per request and per run; the run's diagnosis (docs/metrics.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from loadtest.client.record import merged_gap_mask
from loadtest.metrics import hdr

# A stream is judged only with this many token events: fewer say nothing about how they were delivered.
MIN_EVENTS = 8
# Merged: on average this many token events per socket read, or the first read holding this share of
# them. A server that puts many tokens in one event (one chunk per N tokens) writes one event per read:
# the test counts events against reads, never tokens.
EVENTS_PER_READ = 4.0
FIRST_READ_SHARE = 0.5
# Bursts: a gap between two separate reads is a burst gap when it is shorter than BURST_FRACTION of the
# stream's pace from there on (burst_gap_mask); a stream is delivered in bursts when at least
# BURST_STREAM_SHARE of its gaps are burst or merged gaps, one of them at least a burst gap (a block
# re-sent in separate reads; a slower client reads more of a block at once, merged). Measured in
# docs/metrics.md, "Burst delivery": under load through LiteLLM 71-85 % of a run's streams qualify,
# direct from the engine at most 6 % (half instead of 30 % of the gaps: 39-79 % through LiteLLM, too
# close to the run's RUN_SHARE).
# A stream is re-sent whole when its mean gap is under BURST_FRACTION of the run's usual one, the
# WHOLE_REFERENCE_PERCENTILE of its judged streams' mean gaps: a gateway that read a whole answer before
# passing it on writes it evenly, at its own pace (up to near half the streams re-sent whole still leave
# the reference a server's pace).
BURST_FRACTION = 0.1
BURST_STREAM_SHARE = 0.3
WHOLE_REFERENCE_PERCENTILE = 75.0
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
# When the load generator itself fell behind: a client that reads late finds a stream's events together.
GENERATOR_CAUSE = (
    "a client that falls behind reads a stream's events together, so this is not evidence of a proxy; "
    "ITL and TPOT are not measurable"
)
GENERATOR_FIX = "measure again with a generator that keeps up (a quieter host, or more --processes)"


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
    pace: its mean gap, or the mean of the gaps after it where there are at least MIN_EVENTS of them and
    that is longer (a gateway catching up re-sends the tokens it held at its own pace, which would pull
    the whole stream's mean down to it)."""
    gaps = (times[1:] - times[:-1]).astype(np.float64)
    n = int(gaps.size)
    if n < 1:
        return np.zeros(0, dtype=bool)
    pace = np.full(n, gaps.sum() / n)
    if n > MIN_EVENTS:
        after = np.cumsum(gaps[::-1])[::-1][1 : n - MIN_EVENTS + 1] / np.arange(n - 1, MIN_EVENTS - 1, -1)
        np.maximum(pace[: after.size], after, out=pace[: after.size])  # after[i]: the mean of gaps[i + 1:]
    return ~merged_gap_mask(times) & (gaps < BURST_FRACTION * pace)


def stream_bursts(times: np.ndarray) -> np.ndarray | None:
    """The burst gaps (``burst_gap_mask``) of a stream delivered in bursts: at least MIN_EVENTS events, at
    least one burst gap, and burst and merged gaps together at least BURST_STREAM_SHARE of its gaps;
    None for any other stream."""
    if int(times.size) < MIN_EVENTS:
        return None
    mask = burst_gap_mask(times)
    bursts = int(mask.sum())
    short = bursts + int(merged_gap_mask(times).sum())
    return mask if bursts and short >= BURST_STREAM_SHARE * (times.size - 1) else None


def mean_gap_us(times: np.ndarray) -> int:
    """A stream's mean gap between token events, µs (``times`` in ns, sorted, at least two)."""
    return int((times[-1] - times[0]) // ((times.size - 1) * 1000))


def whole_bursts(mean_gaps: HdrHistogram, unflagged_gaps: HdrHistogram) -> int:
    """How many streams were re-sent whole: of the judged streams neither merged nor in bursts
    (``unflagged_gaps``: their mean gaps), those whose mean gap is under BURST_FRACTION of the
    WHOLE_REFERENCE_PERCENTILE of every judged stream's (``mean_gaps``)."""
    usual = hdr.value_at(mean_gaps, WHOLE_REFERENCE_PERCENTILE)
    if not usual or not unflagged_gaps.get_total_count():
        return 0
    below = BURST_FRACTION * usual
    return hdr.cumulative_at(unflagged_gaps, [math.ceil(below) - 1])[0]


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
    parts = _diagnosis_parts(itl_merged)
    return None if parts is None else f"{parts[0]}: {parts[1]}: {parts[2]}"


def generator_diagnosis(itl_merged: Mapping[str, Any], behind: str) -> str | None:
    """The diagnosis (``diagnosis``) of a run whose load generator fell behind (``behind``: its failed
    health check's detail): the generator is named as the likelier cause, not a proxy; else None."""
    parts = _diagnosis_parts(itl_merged)
    if parts is None:
        return None
    return f"the load generator fell behind ({behind}) during {parts[0]}: {parts[1]}; {GENERATOR_CAUSE}"


def _diagnosis_parts(itl_merged: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The diagnosis's kind (merged or burst delivery), what was seen and its usual cause; None when
    neither dominates the run."""
    if not dominant(itl_merged):
        return None
    share = merged_share(itl_merged) or 0.0
    streams = int(itl_merged.get("streams") or 0)
    if int(itl_merged.get("burst_streams") or 0) > int(itl_merged.get("merged_streams") or 0):
        seen = (
            f"{share * 100:.0f} % of {streams} streamed requests reached the client merged or in bursts "
            "of reads far closer together than the stream's pace"
        )
        return "burst delivery", seen, BURST_CAUSE
    seen = f"{share * 100:.0f} % of {streams} streamed requests reached the client in far fewer reads than the server's events"
    return "merged delivery", seen, CAUSE


def not_measurable(metric: str) -> str:
    """The detail of a figure or SLO on ``metric`` that merged or burst delivery makes meaningless."""
    return f"not measurable: {metric.upper()} of tokens that arrived merged or in bursts times the proxy"
