"""What `loadtest compare` compares: a run folder, or a sweep folder and its representative point."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.compare.sweep_json import SweepDoc, SweepPoint, is_sweep_dir, read_sweep
from loadtest.results.record_log import record_files
from loadtest.sweep.model import SweepFormatError


class CompareError(ValueError):
    """Bad input for a comparison; the message is one line that says what to fix."""


@dataclass
class Side:
    """One compared input: its name, the run whose records give the deltas, and the sweep if any."""

    name: str
    path: Path
    run_dir: Path
    run: dict[str, Any]
    sweep: SweepDoc | None = None
    point: SweepPoint | None = None
    point_reason: str = ""

    @property
    def kind(self) -> str:
        return "sweep" if self.sweep is not None else "run"

    @property
    def records(self) -> list[Path]:
        return record_files(self.run_dir)


def read_run_json(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    if not path.is_file():
        raise CompareError(f"{run_dir}: no run.json there (give a run folder or a sweep folder)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CompareError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        raise CompareError(f"{path}: not a loadtest run.json (no 'metrics' section)")
    return doc


def _representative(sweep: SweepDoc) -> tuple[SweepPoint, str]:
    """The point whose records the deltas use: best under the SLOs, else the knee, else the fastest."""
    usable = [p for p in sweep.points if (p.dir / "run.json").is_file()]
    if not usable:
        raise CompareError(f"{sweep.path}: none of its points' folders holds a run.json")
    for idx, why in ((sweep.best_under_slo, "best point under the SLOs"), (sweep.knee, "the knee")):
        p = sweep.point(idx)
        if p is not None and p in usable:
            return p, why
    fastest = max(usable, key=lambda p: p.value("output_tps") or 0.0)
    return fastest, "highest output tokens/s (no knee or best point given)"


def load_side(path: Path, name: str | None = None) -> Side:
    """A run folder (run.json + records*.jsonl) or a sweep folder (sweep.json)."""
    path = Path(path)
    if not path.exists():
        raise CompareError(f"{path}: no such file or folder")
    if path.is_file() and path.name in ("run.json", "sweep.json"):
        path = path.parent
    if not path.is_dir():
        raise CompareError(f"{path}: not a folder (give a run folder or a sweep folder)")
    if is_sweep_dir(path):
        try:
            sweep = read_sweep(path)
        except SweepFormatError as e:
            raise CompareError(str(e)) from None
        point, why = _representative(sweep)
        side = Side(name or path.resolve().name, path, point.dir, read_run_json(point.dir), sweep, point, why)
    else:
        run = read_run_json(path)
        side = Side(name or str(run.get("run_id") or path.resolve().name), path, path, run)
    if not side.records:
        raise CompareError(
            f"{side.run_dir}: no record log (records*.jsonl); the confidence intervals need per-request records"
        )
    return side


def unique_names(names: list[str]) -> list[str]:
    """The same names, with #2, #3... added to repeats so every side has its own label."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} #{seen[n]}")
    return out
