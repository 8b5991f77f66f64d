"""What a sweep's points say: the Pareto front, the knee, the best point under the SLOs, saturation."""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadtest.contracts.sweep_document import SweepPoint

# Saturation: stop climbing when output tokens/s gained less than SATURATION_GAIN over the best
# earlier point at each of the last SATURATION_STEPS load steps, or when a point's error rate is
# over SATURATION_ERROR_RATE.
SATURATION_GAIN = 0.05
SATURATION_STEPS = 2
SATURATION_ERROR_RATE = 0.20
# The knee needs this much lift of the normalized throughput curve above the chord (Kneedle).
KNEE_MIN_LIFT = 0.1


def _tps(p: SweepPoint) -> float | None:
    v = p.output_tps
    return v if v is not None and math.isfinite(v) else None


def _load(p: SweepPoint) -> float:
    """The offered load: streams for a closed loop, requests/s for an open one."""
    return float(p.concurrency if p.concurrency is not None else p.rate or 0.0)


def measured(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """Points that ran to the end and have a throughput figure."""
    return [p for p in points if p.status == "completed" and _tps(p) is not None]


def endpoint_dead(p: SweepPoint) -> bool:
    """No successful request at this point: 0 ok requests/s (ok ÷ duration), or every request failed."""
    rps, err = p.requests_per_s, p.error_rate
    return (rps is not None and rps <= 0) or (err is not None and err >= 1.0)


def endpoint_failed(p: SweepPoint) -> bool:
    """The point's endpoint check failed: no successful request, or its verdict is ``error_rate``
    (error rate over its limit, or stopped early for failing wholesale; docs/ci.md)."""
    return endpoint_dead(p) or p.verdict == "error_rate"


def usable(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """Measured points whose endpoint worked: the only candidates for the knee and the best point."""
    return [p for p in measured(points) if not endpoint_failed(p)]


def ladder_points(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """Measured ladder points (the offline point apart), in increasing load."""
    return sorted((p for p in measured(points) if not p.offline), key=_load)


def pareto_front(
    points: Sequence[SweepPoint], x_key: str = "tps_per_user", higher_x_better: bool = True
) -> list[int]:
    """Indices of the measured points no other point beats on both output tokens/s and ``x_key``
    (one of FIGURE_KEYS), sorted by ``x_key``."""
    pts = [(x, _tps(p) or 0.0, p.index) for p in measured(points) if (x := p.figure(x_key)) is not None]

    def beats(q: tuple[float, float, int], p: tuple[float, float, int]) -> bool:
        (qx, qy, _), (px, py, _) = q, p
        x_ok = qx >= px if higher_x_better else qx <= px
        return x_ok and qy >= py and (qx != px or qy != py)

    front = [p for p in pts if not any(q is not p and beats(q, p) for q in pts)]
    return [index for _, _, index in sorted(front, key=lambda t: t[0])]


def knee(points: Sequence[SweepPoint], mode: str) -> int | None:
    """The knee of output tokens/s against load (Kneedle): both normalized to [0, 1] over the ladder
    points (load on a log2 axis for a concurrency ladder, linear for a rate ladder), the point where
    the curve lifts highest above the chord from the first to the last point. None for a search, with
    fewer than 3 points, or when no point lifts KNEE_MIN_LIFT above the chord (throughput still
    growing in proportion to load). Only usable points count: one whose endpoint failed (no
    successful request, error rate over its limit, stopped early) is neither the knee nor on the curve."""
    if mode == "search":
        return None
    pts = sorted((p for p in usable(points) if not p.offline), key=_load)
    if len(pts) < 3:
        return None
    xs = [math.log2(_load(p)) if mode == "concurrency" else _load(p) for p in pts]
    ys = [_tps(p) or 0.0 for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 <= x0 or y1 <= y0:
        return None
    lifts = [(y - y0) / (y1 - y0) - (x - x0) / (x1 - x0) for x, y in zip(xs, ys, strict=True)]
    best = max(range(len(pts)), key=lambda i: lifts[i])
    return pts[best].index if lifts[best] >= KNEE_MIN_LIFT else None


def passed(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """Usable points whose run passed its verdict (exit 0)."""
    return [p for p in usable(points) if p.verdict == "pass" and p.exit_code == 0]


def best_under_slo(points: Sequence[SweepPoint]) -> int | None:
    """The point with the highest output tokens/s among the usable ones whose run passed its verdict."""
    ok = passed(points)
    return max(ok, key=lambda p: _tps(p) or 0.0).index if ok else None


def best_search_point(points: Sequence[SweepPoint]) -> int | None:
    """A search's best point: the highest rate among the usable points that passed."""
    ok = [(p.rate, p.index) for p in passed(points) if p.rate is not None]
    return max(ok, key=lambda r: r[0])[1] if ok else None


def saturation(points: Sequence[SweepPoint]) -> str | None:
    """Why climbing should stop after the latest ladder point, or None to go on."""
    pts = ladder_points(points)
    if not pts:
        return None
    last = pts[-1]
    err = last.error_rate
    if err is not None and err > SATURATION_ERROR_RATE:
        return f"error rate {err:.1%} at {last.label} (over {SATURATION_ERROR_RATE:.0%})"
    if len(pts) <= SATURATION_STEPS:
        return None
    gains = []
    for i in range(len(pts) - SATURATION_STEPS, len(pts)):
        before = max(_tps(p) or 0.0 for p in pts[:i])
        gain = (_tps(pts[i]) or 0.0) / before - 1 if before > 0 else math.inf
        if gain >= SATURATION_GAIN:
            return None
        gains.append(f"{pts[i].label} {gain:+.1%}")
    return (
        f"saturated: output tokens/s grew less than {SATURATION_GAIN:.0%} at each of the last "
        f"{SATURATION_STEPS} load steps ({', '.join(gains)})"
    )
