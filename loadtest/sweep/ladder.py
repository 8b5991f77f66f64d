"""The load points of a sweep: concurrency and rate ladders, the offline point, labels and folders."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadtest.sweep.model import POINTS_DIR

DEFAULT_MAX_CONCURRENCY = 128  # 1, 2, 4, ..., 128: eight log2-spaced points
DEFAULT_RATE_STEPS = 8
DEFAULT_OFFLINE_CONCURRENCY = 256  # as traffic_profiles/offline-max-throughput.yaml
OFFLINE_LABEL = "offline"


@dataclass(frozen=True)
class LoadPoint:
    """One load level: closed loop (``concurrency``) or open loop (``rate``); ``offline`` marks the
    MLPerf Offline-like point (a closed loop large enough that the endpoint never runs out of work)."""

    label: str
    concurrency: int | None = None
    rate: float | None = None
    offline: bool = False
    duration_s: float | None = None  # this point's own --duration (a search point lengthened for samples)
    max_requests: int | None = None  # the offline point over a dataset: whole passes, then the run ends

    def folder(self, index: int) -> str:
        """The point's run folder, relative to the sweep folder: ``points/03-c8``."""
        return f"{POINTS_DIR}/{index:02d}-{self.label}"

    def run_args(self) -> list[str]:
        """The ``loadtest run`` options that set this load."""
        own = ["--duration", f"{self.duration_s:g}"] if self.duration_s is not None else []
        if self.max_requests is not None:
            own += ["--max-requests", str(self.max_requests)]
        if self.concurrency is not None:
            return ["--concurrency", str(self.concurrency), *own]
        assert self.rate is not None
        return ["--rate", repr(self.rate), *own]

    @property
    def load(self) -> float:
        """The offered load as one number (streams or requests/s)."""
        return float(self.concurrency if self.concurrency is not None else self.rate or 0.0)


def rate_text(rate: float) -> str:
    """A rate as a short label part, 4 significant digits: 12.5, 0.125, 3.333, 1250."""
    text = f"{rate:.4g}"
    if "e" in text:  # 4 significant digits of a large rate, written out
        text = f"{float(text):.0f}"
    return text


def concurrency_point(n: int) -> LoadPoint:
    return LoadPoint(f"c{n}", concurrency=n)


def rate_point(rate: float, duration_s: float | None = None) -> LoadPoint:
    """An open-loop point; with ``duration_s`` (its own duration) the label says it: ``r12.5-90s``."""
    r = float(rate_text(rate))  # the run gets exactly the rate its label shows
    label = f"r{rate_text(r)}" + (f"-{duration_s:.0f}s" if duration_s is not None else "")
    return LoadPoint(label, rate=r, duration_s=duration_s)


def offline_point(concurrency: int, max_requests: int | None = None) -> LoadPoint:
    """The offline point: ``concurrency`` streams; over a dataset, its size (every query available at
    once) and ``max_requests`` = whole passes (docs/sweep.md)."""
    return LoadPoint(OFFLINE_LABEL, concurrency=concurrency, offline=True, max_requests=max_requests)


def parse_list(text: str, what: str, integer: bool) -> list[float]:
    """``"1,2,4"`` → sorted distinct positive numbers; ValueError naming ``what`` on bad input."""
    values: set[float] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = float(int(part)) if integer else float(part)
        except ValueError:
            kind = "whole number" if integer else "number"
            raise ValueError(f"{what}: {part!r} is not a {kind} (e.g. {what} 1,2,4,8)") from None
        if not v > 0 or math.isinf(v):
            raise ValueError(f"{what}: {part} must be > 0")
        values.add(v)
    if not values:
        raise ValueError(f"{what}: give at least one value, e.g. {what} 1,2,4,8")
    return sorted(values)


def concurrency_ladder(
    points: list[int] | None = None, lo: int | None = None, hi: int | None = None, steps: int | None = None
) -> list[int]:
    """The given points, else ``steps`` log-spaced levels from ``lo`` to ``hi`` (default: doublings
    from ``lo`` = 1 up to ``hi`` = 128, plus ``hi`` itself when it is not a doubling)."""
    if points:
        return sorted(set(points))
    lo = lo or 1
    hi = hi or max(lo, DEFAULT_MAX_CONCURRENCY)
    if lo < 1 or hi < lo:
        raise ValueError(f"--min {lo} / --max {hi}: need 1 ≤ min ≤ max")
    if steps is None:
        out, n = [], lo
        while n < hi:
            out.append(n)
            n *= 2
        return [*out, hi]
    if steps < 2:
        raise ValueError("--steps must be ≥ 2")
    ratio = (hi / lo) ** (1 / (steps - 1))
    return sorted({max(lo, min(hi, round(lo * ratio**i))) for i in range(steps)})


def rate_ladder(hi: float, lo: float | None = None, steps: int | None = None) -> list[float]:
    """``steps`` (default 8) evenly spaced rates from ``lo`` (default hi/steps) to ``hi``, each rounded
    to 3 significant digits."""
    steps = steps or DEFAULT_RATE_STEPS
    if steps < 2:
        raise ValueError("--steps must be ≥ 2")
    lo = hi / steps if lo is None else lo
    if not 0 < lo <= hi:
        raise ValueError(f"--min {lo:g} / --max {hi:g}: need 0 < min ≤ max")
    return [float(f"{lo + (hi - lo) * i / (steps - 1):.3g}") for i in range(steps)]
