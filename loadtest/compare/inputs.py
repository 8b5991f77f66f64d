"""What `loadtest compare` compares: a run folder, or a sweep folder and its representative point."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadtest.compare.sweep_json import SweepInput, is_sweep_dir, read_sweep
from loadtest.contracts.run_document import RUN_FILE, RunDocument, RunDocumentError, read_run_document
from loadtest.contracts.sweep_document import SweepPoint
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
    run: RunDocument
    sweep: SweepInput | None = None
    point: SweepPoint | None = None
    point_reason: str = ""

    @property
    def kind(self) -> str:
        return "sweep" if self.sweep is not None else "run"

    @property
    def records(self) -> list[Path]:
        return record_files(self.run_dir)


def _read_run(run_dir: Path) -> RunDocument:
    """``run_dir/run.json`` as a RunDocument; CompareError (one line) when it is missing or does not fit."""
    if not (run_dir / RUN_FILE).is_file():
        raise CompareError(f"{run_dir}: no run.json there (give a run folder or a sweep folder)")
    try:
        return read_run_document(run_dir)
    except RunDocumentError as e:
        raise CompareError(str(e)) from None


def _representative(sweep: SweepInput) -> tuple[SweepPoint, str]:
    """The point whose records the deltas use: best under the SLOs, else the knee, else the fastest."""
    doc = sweep.doc
    usable = [p for p in doc.points if (sweep.run_dir(p) / RUN_FILE).is_file()]
    if not usable:
        raise CompareError(f"{sweep.path}: none of its points' folders holds a run.json")
    for idx, why in ((doc.best_under_slo, "best point under the SLOs"), (doc.knee, "the knee")):
        p = doc.point(idx)
        if p is not None and p in usable:
            return p, why
    fastest = max(usable, key=lambda p: p.output_tps or 0.0)
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
        run_dir = sweep.run_dir(point)
        side = Side(name or path.resolve().name, path, run_dir, _read_run(run_dir), sweep, point, why)
    else:
        run = _read_run(path)
        side = Side(name or run.run_id or path.resolve().name, path, path, run)
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
