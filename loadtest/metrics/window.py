"""The MLPerf Endpoints reporting window: the first steady plateau of super-passes on issue time
(ramp cropped, drain excluded), its status and verdict (docs/sources.md §2)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist, pstdev
from typing import Any

from loadtest.contracts.record_line import RecordLine

# The reference client's steady-state rules (docs/sources.md §2).
MIN_SUPER_PASSES = 4  # below this a trend test is meaningless; a window spans at least this many
WARMUP_SUPER_PASSES = 1  # the ramp: the first super-pass is cropped
COV_BOUNDS = (0.03, 0.05, 0.08)  # a window passes CoV within the loosest bound
ALPHA = 0.05
LEVEL_SHIFT_BAND = 0.05  # a later plateau's TPOT level this far from the first is a level shift
LOW_CONCURRENCY_MAX = 32
MIN_DURATION_LOW_S = 600.0  # concurrency 1–32
MIN_DURATION_HIGH_S = 1200.0  # above
# (metric, percentile) pairs that gate a window: TTFT and TPOT at p50 and p95
GATED = (("ttft", 0.50), ("ttft", 0.95), ("tpot", 0.50), ("tpot", 0.95))
# More super-passes than this are grouped, whole ones together (the reference's super-pass is a tunable
# block of passes): the plateau search grows as n⁴ and must stay a moment's work at finalize.
MAX_SUPER_PASSES = 64

STATUSES = ("windowable", "insufficient_duration", "insufficient_passes", "partial_dataset")
VERDICTS = ("STEADY STATE", "drifting_up", "drifting_down", "anomaly", "not found")


def stands(status: str, verdict: str) -> bool:
    """Whether a window's figures are the Endpoints figures: a windowable steady state (else ``total``)."""
    return status == "windowable" and verdict == "STEADY STATE"


def super_pass_size(concurrency: int | None, dataset_size: int | None) -> int:
    """ceil(concurrency / dataset) · dataset; without a dataset, the concurrency (at least 1)."""
    c = max(1, concurrency or 1)
    if not dataset_size or dataset_size < 1:
        return c
    return math.ceil(c / dataset_size) * dataset_size


def min_duration_s(concurrency: int | None) -> float:
    """600 s at concurrency 1–32, 1,200 s above."""
    return MIN_DURATION_HIGH_S if (concurrency or 1) > LOW_CONCURRENCY_MAX else MIN_DURATION_LOW_S


@dataclass
class SuperPass:
    """One block of requests in issue order: their TTFT and TPOT (ms), output tokens, issue span."""

    first_issue: float = math.inf
    last_issue: float = -math.inf
    issued: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    output_tokens: int = 0


@dataclass
class ReportingWindow:
    """The window's verdict, bounds (issue-time epochs, super-pass indices [lo, hi)) and figures."""

    status: str
    verdict: str
    reason: str | None
    dataset_size: int | None
    super_pass_size: int
    super_passes: int  # whole super-passes issued
    warmup_super_passes: int
    min_duration_s: float
    start: float | None = None
    end: float | None = None
    duration_s: float | None = None
    first_super_pass: int | None = None
    passes: int = 0  # super-passes in the window
    requests: int = 0
    output_tokens: int = 0
    system_tps: float | None = None
    tps_per_user: float | None = None
    trend: dict[str, str] = field(default_factory=dict)  # gated metric → up | down | steady | insufficient
    level_shift_at: int | None = None  # the super-pass a level shift starts at (anomaly)
    level_shift_pct: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- statistics (the reference client's, docs/sources.md §2) --------------------------------------
def percentile_lower(values: Sequence[float], p: float) -> float:
    """The sorted sample at ⌊(n−1)·p⌋."""
    s = sorted(values)
    return s[int(p * (len(s) - 1))]


def cov(values: Sequence[float]) -> float:
    """Coefficient of variation (population σ / |mean|); 0 for fewer than two values or a zero mean."""
    if len(values) < 2:
        return 0.0
    m = sum(values) / len(values)
    return pstdev(values) / abs(m) if m else 0.0


def _two_sided_p(z: float) -> float:
    return 2.0 * (1.0 - NormalDist().cdf(abs(z)))


def _mk_s(values: Sequence[float]) -> int:
    n = len(values)
    return sum(
        (values[j] > values[i]) - (values[j] < values[i]) for i in range(n - 1) for j in range(i + 1, n)
    )


def _mk_variance(values: Sequence[float]) -> float:
    n = len(values)
    ties: dict[float, int] = {}
    for v in values:
        ties[v] = ties.get(v, 0) + 1
    return (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18.0


def _rank_autocorrelation(values: Sequence[float]) -> list[float]:
    n = len(values)
    ranks = [0.0] * n
    for rank, i in enumerate(sorted(range(n), key=lambda k: values[k]), start=1):
        ranks[i] = float(rank)
    mean = sum(ranks) / n
    dev = [r - mean for r in ranks]
    denom = sum(d * d for d in dev)
    if denom == 0:
        return [0.0] * (n - 1)
    return [sum(dev[t] * dev[t - k] for t in range(k, n)) / denom for k in range(1, n)]


def trend(values: Sequence[float], alpha: float = ALPHA) -> str:
    """Mann–Kendall with the Hamed–Rao autocorrelation correction: up, down, steady or insufficient."""
    n = len(values)
    if n < MIN_SUPER_PASSES:
        return "insufficient"
    s = _mk_s(values)
    variance = _mk_variance(values)
    bound = 1.96 / math.sqrt(n)
    acf = _rank_autocorrelation(values)
    total = sum((n - k) * (n - k - 1) * (n - k - 2) * r for k, r in enumerate(acf, start=1) if abs(r) > bound)
    correction = 1.0 + (2.0 / (n * (n - 1) * (n - 2))) * total
    variance *= correction if correction > 0 else 1.0
    if variance <= 0:
        return "up" if s > 0 else "down" if s < 0 else "steady"
    z = (s - 1) / math.sqrt(variance) if s > 0 else (s + 1) / math.sqrt(variance) if s < 0 else 0.0
    if _two_sided_p(z) < alpha:
        return "up" if s > 0 else "down" if s < 0 else "steady"
    return "steady"


def pettitt(values: Sequence[float], alpha: float = ALPHA) -> tuple[int, bool]:
    """Pettitt's single change point: (size of the first segment, significant at ``alpha``)."""
    n = len(values)
    if n < MIN_SUPER_PASSES:
        return 0, False
    order = sorted(range(n), key=lambda k: values[k])
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j + 2) / 2.0
        i = j + 1
    cum, k_stat, cp = 0.0, 0.0, 0
    for t in range(1, n):
        cum += ranks[t - 1]
        u = abs(2.0 * cum - t * (n + 1))
        if u > k_stat:
            k_stat, cp = u, t
    p = min(1.0, 2.0 * math.exp(-6.0 * k_stat * k_stat / (n**3 + n**2)))
    return cp, p < alpha


# ---- the window -------------------------------------------------------------------------------------
Trajectories = list[list[float | None]]  # per gated metric, its percentile per super-pass (None: no sample)


def trajectories(series: Sequence[SuperPass]) -> Trajectories:
    """Each gated metric's per-super-pass percentile, computed once."""
    return [
        [percentile_lower(getattr(sp, metric), p) if getattr(sp, metric) else None for sp in series]
        for metric, p in GATED
    ]


def admissible(trajs: Trajectories, lo: int, hi: int) -> bool:
    """Every gated metric trend-steady and within the loosest CoV bound over super-passes [lo, hi)."""
    if hi - lo < MIN_SUPER_PASSES:
        return False
    for traj in trajs:
        values = [v for v in traj[lo:hi] if v is not None]
        if len(values) < hi - lo or trend(values) != "steady" or cov(values) > max(COV_BOUNDS):
            return False
    return True


def plateaus(series: Sequence[SuperPass]) -> list[tuple[int, int]]:
    """Grow-from-left segmentation into maximal admissible windows [lo, hi)."""
    trajs = trajectories(series)
    out: list[tuple[int, int]] = []
    start, n = 0, len(series)
    while start <= n - MIN_SUPER_PASSES:
        hi = None
        for end in range(start + MIN_SUPER_PASSES, n + 1):
            if not admissible(trajs, start, end):
                break
            hi = end
        if hi is None:
            start += 1
        else:
            out.append((start, hi))
            start = hi
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def level_shift(series: Sequence[SuperPass], found: Sequence[tuple[int, int]]) -> tuple[int, float] | None:
    """(change point, % change) when a later plateau's TPOT level moved past the band, per Pettitt."""
    if len(found) < 2:
        return None

    def level(lo: int, hi: int) -> float:
        return _mean([v for sp in series[lo:hi] for v in sp.tpot])

    first = level(*found[0])
    if first <= 0:
        return None
    cp, significant = pettitt([_mean(sp.tpot) for sp in series])
    for lo, hi in found[1:]:
        rel = (level(lo, hi) - first) / first
        if abs(rel) > LEVEL_SHIFT_BAND and significant:
            return cp, rel * 100.0
    return None


def bucket(issues: Sequence[tuple[float, float | None, float | None, int]], size: int) -> list[SuperPass]:
    """(issue time, TTFT ms, TPOT ms, output tokens) per request, into super-passes by issue order."""
    series: list[SuperPass] = []
    for i, (t, ttft, tpot, tokens) in enumerate(sorted(issues, key=lambda r: r[0])):
        if i % size == 0:
            series.append(SuperPass())
        sp = series[-1]
        sp.issued += 1
        sp.first_issue, sp.last_issue = min(sp.first_issue, t), max(sp.last_issue, t)
        if ttft is not None:
            sp.ttft.append(ttft)
            sp.output_tokens += tokens
            if tpot is not None:
                sp.tpot.append(tpot)
    return series


def compute_window(
    issues: Sequence[tuple[float, float | None, float | None, int]],
    concurrency: int | None,
    dataset_size: int | None,
) -> ReportingWindow:
    """The reporting window of a run's requests (see ``bucket``), its status and its verdict."""
    size = super_pass_size(concurrency, dataset_size)
    size *= max(1, math.ceil(len(issues) / size / MAX_SUPER_PASSES))
    series = bucket(issues, size)
    whole = [sp for sp in series if sp.issued == size]
    post = series[WARMUP_SUPER_PASSES:]
    out = ReportingWindow(
        status="windowable",
        verdict="not found",
        reason=None,
        dataset_size=dataset_size,
        super_pass_size=size,
        super_passes=len(whole),
        warmup_super_passes=WARMUP_SUPER_PASSES,
        min_duration_s=min_duration_s(concurrency),
    )
    found = plateaus(post)
    shift = level_shift(post, found)
    if found:
        lo, hi = found[0]
        window = post[lo:hi]
        out.first_super_pass = lo + WARMUP_SUPER_PASSES
        out.passes = hi - lo
        out.start, out.end = window[0].first_issue, window[-1].last_issue
        out.duration_s = out.end - out.start
        out.requests = sum(sp.issued for sp in window)
        out.output_tokens = sum(sp.output_tokens for sp in window)
        out.system_tps = round(out.output_tokens / out.duration_s, 3) if out.duration_s > 0 else None
        mean_tpot = _mean([v for sp in window for v in sp.tpot])
        out.tps_per_user = round(1000.0 / mean_tpot, 3) if mean_tpot > 0 else None
        out.trend = {f"{m}_p{round(p * 100)}": _global(post[lo:], m, p) for m, p in GATED}
    else:
        out.trend = {f"{m}_p{round(p * 100)}": _global(post, m, p) for m, p in GATED}
        out.reason = "no window of ≥ 4 super-passes where TTFT and TPOT p50/p95 are steady"
    if shift is not None:
        out.level_shift_at = shift[0] + WARMUP_SUPER_PASSES
        out.level_shift_pct = round(shift[1], 2)
    out.verdict = _verdict(bool(found), shift is not None, out.trend)
    out.status = _status(out, len(issues), dataset_size)
    return out


def _global(series: Sequence[SuperPass], metric: str, p: float) -> str:
    traj = [percentile_lower(getattr(sp, metric), p) for sp in series if getattr(sp, metric)]
    return trend(traj)


def _verdict(found: bool, shifted: bool, trends: dict[str, str]) -> str:
    if not found:
        return "not found"
    if shifted:
        return "anomaly"
    if "up" in trends.values():
        return "drifting_up"
    if "down" in trends.values():
        return "drifting_down"
    return "STEADY STATE"


def _status(w: ReportingWindow, issued: int, dataset_size: int | None) -> str:
    if dataset_size and issued < dataset_size:
        return "partial_dataset"
    if w.super_passes < WARMUP_SUPER_PASSES + MIN_SUPER_PASSES:
        return "insufficient_passes"
    if w.duration_s is None or w.duration_s < w.min_duration_s:
        return "insufficient_duration"
    return "windowable"


class WindowScan:
    """Collects each request's issue time, TTFT, TPOT and output tokens from the record log (originals
    only: a retry is the same sample); ``window`` computes the reporting window from them."""

    def __init__(self) -> None:
        self._t = array("d")
        self._ttft = array("d")
        self._tpot = array("d")
        self._tokens = array("q")

    def add(self, lines: Sequence[RecordLine]) -> None:
        for ln in lines:
            if ln.attempt:
                continue
            ok = ln.outcome == "ok" and ln.ttft_us is not None
            self._t.append(ln.t)
            self._ttft.append(ln.ttft_us / 1000.0 if ok and ln.ttft_us is not None else math.nan)
            self._tpot.append(ln.tpot_us / 1000.0 if ok and ln.tpot_us is not None else math.nan)
            self._tokens.append(ln.output_tokens if ok else 0)

    def window(self, concurrency: int | None, dataset_size: int | None) -> ReportingWindow:
        rows = [
            (t, None if math.isnan(a) else a, None if math.isnan(b) else b, k)
            for t, a, b, k in zip(self._t, self._ttft, self._tpot, self._tokens, strict=True)
        ]
        return compute_window(rows, concurrency, dataset_size)


def in_window(line: RecordLine, start: float | None, end: float | None) -> bool:
    """A record-log line whose request was issued inside the window [start, end] (every line without one)."""
    if start is None or end is None:
        return True
    return start <= line.t <= end
