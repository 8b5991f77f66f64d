"""What a sweep's points say: the Pareto front, the knee, the best point under the SLOs, saturation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# Saturation: stop climbing when output tokens/s gained less than SATURATION_GAIN over the best
# earlier point at each of the last SATURATION_STEPS load steps, or when a point's error rate is
# over SATURATION_ERROR_RATE.
SATURATION_GAIN = 0.05
SATURATION_STEPS = 2
SATURATION_ERROR_RATE = 0.20
# The knee needs this much lift of the normalized throughput curve above the chord (Kneedle).
KNEE_MIN_LIFT = 0.1


def _tps(p: dict[str, Any]) -> float | None:
    v = p.get("output_tps")
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def measured(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Points that ran to the end and have a throughput figure."""
    return [p for p in points if p.get("status") == "completed" and _tps(p) is not None]


def endpoint_dead(p: dict[str, Any]) -> bool:
    """No successful request at this point: 0 ok requests/s (ok ÷ duration), or every request failed."""
    rps, err = p.get("requests_per_s"), p.get("error_rate")
    return (isinstance(rps, int | float) and rps <= 0) or (isinstance(err, int | float) and err >= 1.0)


def endpoint_failed(p: dict[str, Any]) -> bool:
    """The point's endpoint check failed: no successful request, or its verdict is ``error_rate``
    (error rate over its limit, or stopped early for failing wholesale; docs/ci.md)."""
    return endpoint_dead(p) or p.get("verdict") == "error_rate"


def usable(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured points whose endpoint worked: the only candidates for the knee and the best point."""
    return [p for p in measured(points) if not endpoint_failed(p)]


def ladder_points(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured ladder points (the offline point apart), in increasing load."""
    pts = [p for p in measured(points) if not p.get("offline")]
    return _by_load(pts)


def _by_load(pts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(pts, key=lambda p: p["concurrency"] if p.get("concurrency") is not None else p["rate"])


def pareto_front(
    points: Sequence[dict[str, Any]], x_key: str = "tps_per_user", higher_x_better: bool = True
) -> list[int]:
    """Indices of the measured points no other point beats on both output tokens/s and ``x_key``,
    sorted by ``x_key``."""
    pts = [p for p in measured(points) if isinstance(p.get(x_key), int | float)]

    def better_or_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
        ax, bx = a[x_key], b[x_key]
        x_ok = ax >= bx if higher_x_better else ax <= bx
        return x_ok and _tps(a) >= _tps(b)  # type: ignore[operator]

    front = [
        p
        for p in pts
        if not any(
            q is not p and better_or_equal(q, p) and (q[x_key] != p[x_key] or _tps(q) != _tps(p)) for q in pts
        )
    ]
    return [p["index"] for p in sorted(front, key=lambda p: p[x_key])]


def knee(points: Sequence[dict[str, Any]], mode: str) -> int | None:
    """The knee of output tokens/s against load (Kneedle): both normalized to [0, 1] over the ladder
    points (load on a log2 axis for a concurrency ladder, linear for a rate ladder), the point where
    the curve lifts highest above the chord from the first to the last point. None for a search, with
    fewer than 3 points, or when no point lifts KNEE_MIN_LIFT above the chord (throughput still
    growing in proportion to load). Only usable points count: one whose endpoint failed (no
    successful request, error rate over its limit, stopped early) is neither the knee nor on the curve."""
    if mode == "search":
        return None
    pts = _by_load([p for p in usable(points) if not p.get("offline")])
    if len(pts) < 3:
        return None
    xs = [math.log2(p["concurrency"]) if mode == "concurrency" else float(p["rate"]) for p in pts]
    ys = [_tps(p) or 0.0 for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 <= x0 or y1 <= y0:
        return None
    lifts = [(y - y0) / (y1 - y0) - (x - x0) / (x1 - x0) for x, y in zip(xs, ys, strict=True)]
    best = max(range(len(pts)), key=lambda i: lifts[i])
    return pts[best]["index"] if lifts[best] >= KNEE_MIN_LIFT else None


def passed(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Usable points whose run passed its verdict (exit 0)."""
    return [p for p in usable(points) if p.get("verdict") == "pass" and p.get("exit_code") == 0]


def best_under_slo(points: Sequence[dict[str, Any]]) -> int | None:
    """The point with the highest output tokens/s among the usable ones whose run passed its verdict."""
    ok = passed(points)
    return max(ok, key=lambda p: _tps(p) or 0.0)["index"] if ok else None


def best_search_point(points: Sequence[dict[str, Any]]) -> int | None:
    """A search's best point: the highest rate among the usable points that passed."""
    ok = [p for p in passed(points) if p.get("rate") is not None]
    return max(ok, key=lambda p: p["rate"])["index"] if ok else None


def saturation(points: Sequence[dict[str, Any]]) -> str | None:
    """Why climbing should stop after the latest ladder point, or None to go on."""
    pts = ladder_points(points)
    if not pts:
        return None
    last = pts[-1]
    err = last.get("error_rate")
    if isinstance(err, int | float) and err > SATURATION_ERROR_RATE:
        return f"error rate {err:.1%} at {last['label']} (over {SATURATION_ERROR_RATE:.0%})"
    if len(pts) <= SATURATION_STEPS:
        return None
    gains = []
    for i in range(len(pts) - SATURATION_STEPS, len(pts)):
        before = max(_tps(p) or 0.0 for p in pts[:i])
        gain = (_tps(pts[i]) or 0.0) / before - 1 if before > 0 else math.inf
        if gain >= SATURATION_GAIN:
            return None
        gains.append(f"{pts[i]['label']} {gain:+.1%}")
    return (
        f"saturated: output tokens/s grew less than {SATURATION_GAIN:.0%} at each of the last "
        f"{SATURATION_STEPS} load steps ({', '.join(gains)})"
    )
