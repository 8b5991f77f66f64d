"""The MLPerf Endpoints v1.0 collection rules (docs/sources.md §2): regions from C_max, minimum durations, the point plan."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ULTRA_LOW_MAX = 32  # §6.2: the 600 s row is concurrency 1–32, whatever C_min is
MIN_POINTS = 7  # §5.3: an elected Offline point, or an agentic curve
MIN_POINTS_DEDICATED_OFFLINE = 8  # §5.3: 1 + 3 + 3 + 1, the last a dedicated Offline run
MAX_POINTS = 32
MIN_DURATION_S = 600.0  # §6.2: concurrency 1–32
MIN_DURATION_ABOVE_S = 1200.0  # §6.2: above 32
AGENTIC_MIN_DURATION_ABOVE_S = 2400.0  # §6.2, agentic table: above 32
MARGIN = 1.10  # §5.4: the margin region runs to ceil(1.10 × C_max)
BANDS = ("ultra_low", "low_concurrency", "med_concurrency", "high_concurrency")


@dataclass(frozen=True)
class Benchmark:
    """A v1.0 benchmark model's dataset id (point.yaml ``dataset``) and its minimum query count (§6.4)."""

    dataset: str
    min_queries: int


# the checker's MIN_QUERY_COUNT (submission_checker/models/aggregate/point_result.py, docs/sources.md §2)
BENCHMARKS: dict[str, Benchmark] = {
    "llama3_1-8b": Benchmark("cnn_dailymail", 13368),
    "gpt-oss-120b": Benchmark("mlperf_gpt_oss_performance", 6396),
}


@dataclass(frozen=True)
class Regions:
    """§5.5's region bounds for (C_max, C_min), each inclusive ``(start, end)``."""

    c_max: int
    c_min: int
    low_latency: tuple[int, int]
    low_concurrency: tuple[int, int]
    med_concurrency: tuple[int, int]
    high_concurrency: tuple[int, int]
    margin: tuple[int, int]

    def of(self, concurrency: int) -> str | None:
        """The region a concurrency falls in (the first that holds it), None above the margin."""
        for name in ("low_latency", "low_concurrency", "med_concurrency", "high_concurrency", "margin"):
            lo, hi = getattr(self, name)
            if lo <= concurrency <= hi:
                return name
        return None

    def band(self, concurrency: int) -> str | None:
        """The §5.3 band a point stands for: ``ultra_low`` (the low-latency region), low, medium or
        high concurrency; None in the margin or above."""
        region = self.of(concurrency)
        if region == "low_latency":
            return "ultra_low"
        return region if region in BANDS else None


def regions(c_max: int, c_min: int = 1) -> Regions:
    """§5.5's reference algorithm, Python's ``round`` (banker's rounding) as the rules require;
    ValueError when C_max ≤ 32 or C_min is outside 1–32."""
    if not 1 <= c_min <= ULTRA_LOW_MAX:
        raise ValueError(f"C_min {c_min}: must be 1 to {ULTRA_LOW_MAX}")
    if c_max <= ULTRA_LOW_MAX:
        raise ValueError(f"C_max {c_max}: the rules need a declared C_max above {ULTRA_LOW_MAX}")
    interval = math.log2(c_max - c_min) / 3
    low_end = round(c_min + 2**interval)
    med_end = round(c_min + 2 ** (2 * interval))
    return Regions(
        c_max=c_max,
        c_min=c_min,
        low_latency=(1, c_min),
        low_concurrency=(c_min + 1, low_end),
        med_concurrency=(low_end + 1, med_end),
        high_concurrency=(med_end + 1, c_max),
        margin=(c_max + 1, math.ceil(MARGIN * c_max)),
    )


def min_duration_s(concurrency: int, agentic: bool = False) -> float:
    """§6.2: 600 s for concurrency 1–32, else 1,200 s (agentic: 2,400 s)."""
    if concurrency <= ULTRA_LOW_MAX:
        return MIN_DURATION_S
    return AGENTIC_MIN_DURATION_ABOVE_S if agentic else MIN_DURATION_ABOVE_S


@dataclass(frozen=True)
class PlannedPoint:
    """One point of the plan: its concurrency, region, minimum duration and whether it is mandatory
    (the §5.3 point of its band, which also needs an accuracy run)."""

    concurrency: int
    region: str
    min_duration_s: float
    mandatory: bool = False
    offline: bool = False


@dataclass
class Plan:
    """The points a v1.0 curve needs for a declared C_max, in order, with the Offline point last."""

    regions: Regions
    agentic: bool
    points: list[PlannedPoint] = field(default_factory=list)
    min_queries: int | None = None  # per point (§6.4): whole passes of the dataset
    dataset: str | None = None

    @property
    def concurrencies(self) -> list[int]:
        """The fixed-concurrency points (the ladder), without the Offline point."""
        return [p.concurrency for p in self.points if not p.offline]

    @property
    def total_s(self) -> float:
        """The minimum wall time of the fixed-concurrency points (the Offline pass is the endpoint's)."""
        return sum(p.min_duration_s for p in self.points if not p.offline)


def plan_points(
    c_max: int,
    agentic: bool = False,
    offline_concurrency: int | None = None,
    benchmark: str | None = None,
) -> Plan:
    """The powers of two below C_max and C_max itself (at least 7, each band covered; a band left empty
    gets its middle), and for a non-agentic curve the dedicated Offline point (8 in all) at
    ``offline_concurrency`` (the dataset's size: one whole pass at once)."""
    r = regions(c_max)
    levels = {2**k for k in range(int(math.log2(c_max)) + 1) if 2**k < c_max} | {c_max}
    for band in BANDS[1:]:
        lo, hi = getattr(r, band)
        if lo <= hi and not any(lo <= c <= hi for c in levels):
            levels.add(round(math.sqrt(lo * hi)))
    ordered = sorted(levels)[:MAX_POINTS]
    mandatory = {1, c_max}
    for band in BANDS[1:3]:
        inside = [c for c in ordered if r.band(c) == band]
        if inside:
            mandatory.add(inside[-1])
    bench = BENCHMARKS.get(benchmark or "")
    plan = Plan(
        regions=r,
        agentic=agentic,
        min_queries=bench.min_queries if bench else None,
        dataset=bench.dataset if bench else None,
    )
    for c in ordered:
        plan.points.append(
            PlannedPoint(c, r.of(c) or "margin", min_duration_s(c, agentic), mandatory=c in mandatory)
        )
    if not agentic:
        size = offline_concurrency or plan.min_queries or 0
        plan.points.append(PlannedPoint(size, "offline", 0.0, mandatory=True, offline=True))
    return plan


def duration_text(seconds: float) -> str:
    """Seconds as ``600 s (10 min)`` or ``12,000 s (3 h 20 min)``."""
    minutes = round(seconds / 60)
    hours, rest = divmod(minutes, 60)
    human = f"{hours} h {rest} min" if hours else f"{rest} min"
    return f"{seconds:,.0f} s ({human})"


def plan_lines(plan: Plan) -> list[str]:
    """The plan for people: the regions, one line per point, the total wall time."""
    r = plan.regions
    bounds = ", ".join(
        f"{name.replace('_', ' ')} {lo}–{hi}"
        for name, (lo, hi) in (
            ("low_latency", r.low_latency),
            ("low", r.low_concurrency),
            ("medium", r.med_concurrency),
            ("high", r.high_concurrency),
            ("margin", r.margin),
        )
    )
    fixed = len(plan.concurrencies)
    need = MIN_POINTS if plan.agentic else MIN_POINTS_DEDICATED_OFFLINE
    queries = (
        f", each ≥ {plan.min_queries:,} queries (whole passes of {plan.dataset})" if plan.min_queries else ""
    )
    lines = [
        f"MLPerf Endpoints v1.0 plan for C_max {r.c_max} (C_min {r.c_min}): {bounds}",
        f"{len(plan.points)} points ({fixed} fixed-concurrency"
        f"{'' if plan.agentic else ' + a dedicated Offline run'}; the rules need ≥ {need}){queries}",
    ]
    for p in plan.points:
        mark = " mandatory, with accuracy" if p.mandatory else ""
        if p.offline:
            size = f"{p.concurrency:,}" if p.concurrency else "the dataset's size"
            lines.append(f"  offline  concurrency {size}: one whole pass at once, no minimum duration;{mark}")
        else:
            region = r.band(p.concurrency) or p.region
            lines.append(
                f"  c{p.concurrency:<6} {region.replace('_', ' '):<17} ≥ {duration_text(p.min_duration_s)}{mark}"
            )
    lines.append(
        f"total: ≥ {duration_text(plan.total_s)} of fixed-concurrency points"
        f"{'' if plan.agentic else ', plus the Offline pass'}"
    )
    return lines
