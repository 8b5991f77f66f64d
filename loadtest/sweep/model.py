"""The sweep.json contract: point figures from a run.json, the sweep document, and ``load_sweep``."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
SWEEP_FILE = "sweep.json"
REPORT_FILE = "sweep.html"
POINTS_DIR = "points"
MODES = ("concurrency", "rate", "search")
STATUSES = ("completed", "interrupted")
# Every point carries these figures (None where the run has no value, or the point did not run).
FIGURE_KEYS = (
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
    "prefix_cache_hit_rate",
)
# Per point besides the figures: True when its server's prefix cache answered most prompt tokens of a
# profile that asks for no shared prefixes (run.json ``prefix_cache.warm``, docs/telemetry.md).
FLAG_KEYS = ("warm_cache",)


class SweepFormatError(ValueError):
    """A sweep folder or sweep.json that cannot be read; the message names the file and the fix."""


def _get(doc: Any, *keys: str) -> Any:
    for k in keys:
        doc = doc.get(k) if isinstance(doc, dict) else None
    return doc


def judged_metrics(run: dict[str, Any]) -> dict[str, Any]:
    """The metrics the run's verdict judged: ``judged.metrics`` with a warm-up/cool-down, else ``metrics``."""
    judged = _get(run, "judged", "metrics")
    return judged if isinstance(judged, dict) else (run.get("metrics") or {})


def point_figures(run: dict[str, Any]) -> dict[str, Any]:
    """A point's figures from its run.json (docs/run-json.md), over the judged window when there is one."""
    m = judged_metrics(run)
    lat = m.get("latency_ms") or {}
    thr = m.get("throughput") or {}
    gp = run.get("goodput") or {}
    return {
        "output_tps": thr.get("output_tokens_per_s"),
        "requests_per_s": thr.get("requests_per_s"),
        "tps_per_user": thr.get("tps_per_user"),
        "ttft_p50_ms": _get(lat, "ttft", "p50"),
        "ttft_p90_ms": _get(lat, "ttft", "p90"),
        "ttft_p99_ms": _get(lat, "ttft", "p99"),
        "tpot_p50_ms": _get(lat, "tpot", "p50"),
        "tpot_p90_ms": _get(lat, "tpot", "p90"),
        "e2e_p90_ms": _get(lat, "e2e", "p90"),
        "goodput_rps": gp.get("good_requests_per_s"),
        "slo_attainment": gp.get("attainment"),
        "error_rate": _get(m, "requests", "error_rate"),
        "prefix_cache_hit_rate": _get(run, "prefix_cache", "hit_rate"),
        "warm_cache": bool(_get(run, "prefix_cache", "warm")),
    }


def empty_figures() -> dict[str, Any]:
    return {**dict.fromkeys(FIGURE_KEYS), "warm_cache": False}


def point_entry(
    index: int,
    label: str,
    concurrency: int | None,
    rate: float | None,
    *,
    rel_dir: str,
    status: str,
    exit_code: int | None,
    run: dict[str, Any] | None = None,
    reason: str | None = None,
    offline: bool = False,
) -> dict[str, Any]:
    """One entry of sweep.json's ``points``; figures and verdict come from ``run`` (its run.json) if any."""
    verdict = _get(run, "verdict", "status") if run else None
    return {
        "index": index,
        "label": label,
        "concurrency": concurrency,
        "rate": rate,
        "offline": offline,
        "dir": rel_dir,
        "status": status,
        "exit_code": exit_code,
        "verdict": verdict,
        "reason": reason,
        **(point_figures(run) if run else empty_figures()),
    }


def read_run_json(path: Path) -> dict[str, Any] | None:
    """A run folder's run.json, or None when it is missing or unreadable (a run that never finished)."""
    try:
        doc = json.loads((path / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write_sweep_json(sweep_dir: Path, doc: dict[str, Any]) -> Path:
    """Write ``sweep_dir/sweep.json`` atomically (temporary file, then rename)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    target = sweep_dir / SWEEP_FILE
    fd, tmp = tempfile.mkstemp(prefix=".sweep-", suffix=".json", dir=sweep_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _require(cond: bool, where: Path, what: str) -> None:
    if not cond:
        raise SweepFormatError(f"{where}: {what}; give a folder written by 'loadtest sweep'")


def load_sweep(path: str | Path) -> dict[str, Any]:
    """A sweep folder (or its sweep.json) as the sweep.json structure (docs/sweep.md), checked.

    Every point keeps its keys; ``dir`` stays relative to the sweep folder (``sweep_root`` gives the
    folder). Raises SweepFormatError with one line on a missing file or a wrong shape.
    """
    p = Path(path)
    file = p if p.is_file() else p / SWEEP_FILE
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise SweepFormatError(f"{file} not found; give a folder written by 'loadtest sweep'") from e
    except (OSError, ValueError) as e:
        raise SweepFormatError(f"{file}: not readable JSON ({e})") from e
    _require(isinstance(doc, dict), file, "not a JSON object")
    _require(doc.get("kind") == "sweep", file, "'kind' is not 'sweep'")
    _require(
        doc.get("schema_version") == SCHEMA_VERSION,
        file,
        f"schema_version {doc.get('schema_version')!r} is not {SCHEMA_VERSION}",
    )
    _require(doc.get("mode") in MODES, file, f"'mode' must be one of {', '.join(MODES)}")
    points = doc.get("points")
    _require(isinstance(points, list), file, "'points' is not a list")
    for i, pt in enumerate(points):
        _require(
            isinstance(pt, dict) and "label" in pt and "status" in pt, file, f"points[{i}] lacks label/status"
        )
        for key in FIGURE_KEYS:
            pt.setdefault(key, None)
        pt.setdefault("warm_cache", False)
    n = len(points)
    for key in ("knee", "best_under_slo"):
        v = doc.get(key)
        _require(v is None or (isinstance(v, int) and 0 <= v < n), file, f"'{key}' is not a point index")
    return doc


def sweep_root(path: str | Path) -> Path:
    """The sweep folder of a folder or sweep.json path (what point ``dir`` values are relative to)."""
    p = Path(path)
    return p.parent if p.is_file() else p
