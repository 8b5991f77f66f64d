"""A sweep folder as compare sees it: sweep.json read by ``load_sweep``, each point with its run folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.sweep.model import FIGURE_KEYS, SWEEP_FILE, SweepFormatError, load_sweep


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: its load level, its run folder and its headline numbers."""

    index: int
    label: str
    concurrency: int | None
    rate: float | None
    dir: Path
    status: str | None
    verdict: str | None
    values: dict[str, float | None]

    def value(self, key: str) -> float | None:
        return self.values.get(key)


@dataclass(frozen=True)
class SweepDoc:
    """sweep.json as read: mode, fingerprint, points, knee and best point under the SLOs."""

    path: Path
    mode: str | None
    status: str | None
    profile: str | None
    fingerprint: str | None
    points: list[SweepPoint]
    knee: int | None
    best_under_slo: int | None
    raw: dict[str, Any]

    def point(self, index: int | None) -> SweepPoint | None:
        return next((p for p in self.points if p.index == index), None) if index is not None else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _index(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def is_sweep_dir(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file()


def read_sweep(folder: Path) -> SweepDoc:
    """``folder/sweep.json`` checked by ``load_sweep``, plus what compare needs: points, each with a ``dir``."""
    doc = load_sweep(folder)
    path = folder / SWEEP_FILE
    if not doc["points"]:
        raise SweepFormatError(f"{path}: field 'points' must be a non-empty list")
    points = []
    for i, p in enumerate(doc["points"]):
        if not isinstance(p.get("dir"), str):
            raise SweepFormatError(f"{path}: points[{i}] needs a 'dir' (the point's run folder, relative)")
        points.append(
            SweepPoint(
                index=i if (idx := _index(p.get("index"))) is None else idx,
                label=str(p.get("label") or p["dir"]),
                concurrency=_index(p.get("concurrency")),
                rate=_num(p.get("rate")),
                dir=(folder / p["dir"]).resolve(),
                status=p.get("status"),
                verdict=p.get("verdict"),
                values={k: _num(p.get(k)) for k in FIGURE_KEYS},
            )
        )
    return SweepDoc(
        path=path,
        mode=doc.get("mode"),
        status=doc.get("status"),
        profile=doc.get("profile"),
        fingerprint=doc.get("fingerprint"),
        points=points,
        knee=_index(doc.get("knee")),
        best_under_slo=_index(doc.get("best_under_slo")),
        raw=doc,
    )
