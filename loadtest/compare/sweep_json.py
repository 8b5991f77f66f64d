"""A small reader of a sweep folder's ``sweep.json`` (the sweep folder contract, schema_version 1)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SWEEP_FILE = "sweep.json"
POINT_KEYS = (
    "output_tps",
    "requests_per_s",
    "tps_per_user",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p90_ms",
    "e2e_p90_ms",
    "goodput_rps",
    "slo_attainment",
    "error_rate",
)


class SweepFileError(ValueError):
    """sweep.json is missing, unreadable or does not follow the contract."""


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
    """Read ``folder/sweep.json``; errors name the file and the field."""
    path = folder / SWEEP_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SweepFileError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("kind", "sweep") != "sweep":
        raise SweepFileError(f"{path}: not a sweep document (expected an object with kind: sweep)")
    if doc.get("schema_version", 1) != 1:
        raise SweepFileError(f"{path}: schema_version {doc.get('schema_version')!r} is not supported (1 is)")
    raw_points = doc.get("points")
    if not isinstance(raw_points, list) or not raw_points:
        raise SweepFileError(f"{path}: field 'points' must be a non-empty list")
    points = []
    for i, p in enumerate(raw_points):
        if not isinstance(p, dict) or not isinstance(p.get("dir"), str):
            raise SweepFileError(f"{path}: points[{i}] needs a 'dir' (the point's run folder, relative)")
        points.append(
            SweepPoint(
                index=_index(p.get("index")) if _index(p.get("index")) is not None else i,
                label=str(p.get("label") or p["dir"]),
                concurrency=_index(p.get("concurrency")),
                rate=_num(p.get("rate")),
                dir=(folder / p["dir"]).resolve(),
                status=p.get("status"),
                verdict=p.get("verdict"),
                values={k: _num(p.get(k)) for k in POINT_KEYS},
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
