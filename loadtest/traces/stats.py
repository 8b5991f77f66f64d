"""Summary statistics of a trace: arrivals, lengths and prefix reuse."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loadtest.traces.record import BLOCK_TOKENS, TraceRecord

QUANTILES: dict[str, float] = {
    "p1": 0.01, "p5": 0.05, "p10": 0.10, "p25": 0.25, "p50": 0.50,
    "p75": 0.75, "p90": 0.90, "p95": 0.95, "p99": 0.99,
}  # fmt: skip


def length_stats(values: Sequence[int] | np.ndarray) -> dict[str, float]:
    """Quantiles p1..p99 (linear interpolation), max and mean of a token-length column."""
    arr = np.asarray(values, dtype=float)
    qs = np.quantile(arr, list(QUANTILES.values()))
    out = {name: float(q) for name, q in zip(QUANTILES, qs, strict=True)}
    out["max"] = float(arr.max())
    out["mean"] = float(arr.mean())
    return out


def arrival_stats(times: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Duration, mean rate, inter-arrival mean/CV and the peak 1-second rate relative to the mean."""
    t = np.sort(np.asarray(times, dtype=float))
    duration = float(t[-1] - t[0]) if t.size else 0.0
    gaps = np.diff(t)
    rate = t.size / duration if duration > 0 else 0.0  # same definition as transform.mean_rate
    gap_mean = float(gaps.mean()) if gaps.size else 0.0
    cv = float(gaps.std() / gap_mean) if gap_mean > 0 else 0.0
    per_second = np.bincount(np.floor(t - t[0]).astype(np.int64)) if t.size else np.zeros(1)
    peak = float(per_second.max())
    return {
        "duration_s": duration,
        "mean_rate_rps": rate,
        "interarrival_mean_s": gap_mean,
        "interarrival_cv": cv,
        "peak_1s_rate_rps": peak,
        "peak_to_mean": peak / rate if rate > 0 else 0.0,
    }


def prefix_stats(records: Sequence[TraceRecord], block_tokens: int = BLOCK_TOKENS) -> dict[str, float]:
    """Share of hash blocks (and of prompt tokens) already seen earlier in the trace, and blocks/request.

    This is the hit potential of an infinite prefix cache; the token share weights each request's
    last, partial block by its real size (input_tokens - block_tokens * (blocks - 1)).
    """
    seen: set[int] = set()
    blocks = reused = 0
    tokens = reused_tokens = 0
    for r in records:
        n = len(r.hash_ids)
        for i, h in enumerate(r.hash_ids):
            size = block_tokens if i < n - 1 else max(r.input_tokens - block_tokens * (n - 1), 0)
            blocks += 1
            tokens += size
            if h in seen:
                reused += 1
                reused_tokens += size
            else:
                seen.add(h)
    return {
        "prefix_reuse_share": reused / blocks if blocks else 0.0,
        "prefix_reuse_token_share": reused_tokens / tokens if tokens else 0.0,
        "mean_blocks_per_request": blocks / len(records) if records else 0.0,
        "unique_blocks": float(len(seen)),
    }


def trace_stats(records: Sequence[TraceRecord], block_tokens: int = BLOCK_TOKENS) -> dict[str, Any]:
    """Count, arrival statistics, input/output token quantiles and, for hash_ids traces, prefix reuse."""
    if not records:
        raise ValueError("trace_stats needs at least one record")
    ordered = sorted(records, key=lambda r: r.timestamp_s)
    out: dict[str, Any] = {"count": len(ordered)}
    out.update(arrival_stats([r.timestamp_s for r in ordered]))
    out["input_tokens"] = length_stats([r.input_tokens for r in ordered])
    out["output_tokens"] = length_stats([r.output_tokens for r in ordered])
    if any(r.hash_ids for r in ordered):
        out.update(prefix_stats(ordered, block_tokens))
    return out
