"""A sweep folder as compare sees it: its sweep.json read by ``load_sweep``, each point's run folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadtest.contracts.sweep_document import SweepDocument, SweepPoint
from loadtest.sweep.model import SWEEP_FILE, SweepFormatError, load_sweep


@dataclass(frozen=True)
class SweepInput:
    """A compared sweep: its sweep.json (``path``) as the checked SweepDocument."""

    path: Path
    doc: SweepDocument

    def run_dir(self, point: SweepPoint) -> Path:
        """The point's run folder (its ``dir`` is relative to the sweep folder)."""
        return (self.path.parent / point.dir).resolve()


def is_sweep_dir(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file()


def read_sweep(folder: Path) -> SweepInput:
    """``folder/sweep.json`` checked by ``load_sweep``, plus what compare needs: points, each with a ``dir``."""
    doc = load_sweep(folder)
    path = folder / SWEEP_FILE
    if not doc.points:
        raise SweepFormatError(f"{path}: field 'points' must be a non-empty list")
    for i, p in enumerate(doc.points):
        if not p.dir:
            raise SweepFormatError(f"{path}: points[{i}] needs a 'dir' (the point's run folder, relative)")
    return SweepInput(path, doc)
