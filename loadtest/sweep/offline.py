"""The sweep's Offline point: dedicated (its own run, ≥ 0.98 × the C_max point's system_tps), elected (the
C_max point stands as the Offline point) or none (docs/sources.md §2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.contracts.sweep_document import SweepPoint
from loadtest.workload.builder import Workload

DEDICATED_MIN_RATIO = 0.98  # a dedicated Offline point needs this share of the C_max point's system_tps
OFFLINE_MODES = ("dedicated", "elected", "none")


@dataclass(frozen=True)
class Election:
    """How the sweep's Offline point stands: the mode, the point's index, and why."""

    mode: str
    index: int | None
    reason: str


def _tps(p: SweepPoint) -> float | None:
    return p.output_tps if p.status == "completed" and p.output_tps else None


def elect_offline(points: Sequence[SweepPoint], requested: bool) -> Election:
    """The Offline point of a concurrency sweep's points (``requested``: the sweep ran an offline point)."""
    ladder = [p for p in points if not p.offline and p.concurrency is not None and _tps(p) is not None]
    cmax = max(ladder, key=lambda p: p.concurrency or 0, default=None)
    dedicated = next((p for p in points if p.offline and _tps(p) is not None), None)
    if not requested:
        return Election("none", None, "the sweep ran no offline point")
    if dedicated is not None and cmax is None:
        return Election("dedicated", dedicated.index, "no ladder point to compare with")
    if dedicated is not None and cmax is not None:
        need = DEDICATED_MIN_RATIO * float(cmax.output_tps or 0.0)
        got = float(dedicated.output_tps or 0.0)
        if got >= need:
            return Election(
                "dedicated",
                dedicated.index,
                f"{got:,.1f} tok/s ≥ 0.98 × {cmax.label}'s {cmax.output_tps:,.1f}",
            )
        return Election(
            "elected",
            cmax.index,
            f"the offline point's {got:,.1f} tok/s < 0.98 × {cmax.label}'s {cmax.output_tps:,.1f}: {cmax.label} stands",
        )
    if cmax is not None:
        return Election("elected", cmax.index, f"the offline point measured nothing: {cmax.label} stands")
    return Election("none", None, "no point measured throughput")


def dataset_offline(workload: Workload) -> tuple[int, int] | None:
    """(concurrency, requests) of the Offline point over a one-scenario dataset profile: every query
    available at once (concurrency = the dataset's size), whole passes (``dataset.passes``, at least one)."""
    if len(workload.scenarios) != 1 or not workload.datasets:
        return None
    (dataset,) = workload.datasets.values()
    size = len(dataset.conversations)
    return size, workload.pass_units or size
