"""sweep.json for the sweep and its readers: a point's entry and figures from its run.json, ``load_sweep``.

The document itself (SweepDocument, SweepPoint, the checks, the atomic write) is
loadtest/contracts/sweep_document.py; its constants and error are re-exported here.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from loadtest.contracts.run_document import RunDocument, RunDocumentError, Summary, read_run_document
from loadtest.contracts.sweep_document import (
    FIGURE_KEYS,
    MODES,
    SCHEMA_VERSION,
    SWEEP_FILE,
    PointFigures,
    SweepDocument,
    SweepFormatError,
    SweepPoint,
    read_sweep_document,
)
from loadtest.sweep.evidence import needs_duration_s

__all__ = [
    "FIGURE_KEYS",
    "MODES",
    "POINTS_DIR",
    "REPORT_FILE",
    "SCHEMA_VERSION",
    "SWEEP_FILE",
    "SweepFormatError",
    "load_sweep",
    "point_entry",
    "point_figures",
    "read_run_json",
    "sweep_root",
]

REPORT_FILE = "sweep.html"
POINTS_DIR = "points"
STATUSES = ("completed", "interrupted")


# A latency the run has no summary of (no request got that far): every percentile None.
_NO_SUMMARY = Summary(
    count=0, min=None, max=None, mean=None, stddev=None, p50=None, p90=None, p95=None, p99=None, p99_9=None
)


def point_figures(run: RunDocument) -> PointFigures:
    """A point's figures from its run.json (docs/run-json.md), over the judged window when there is one."""
    m = run.judged_metrics()
    ttft, tpot, e2e = (m.latency_ms.get(k) or _NO_SUMMARY for k in ("ttft", "tpot", "e2e"))
    gp, pc, rw = run.goodput, run.prefix_cache, run.reporting_window
    return PointFigures(
        output_tps=m.throughput.output_tokens_per_s,
        requests_per_s=m.throughput.requests_per_s,
        tps_per_user=m.throughput.tps_per_user,
        ttft_p50_ms=ttft.p50,
        ttft_p90_ms=ttft.p90,
        ttft_p99_ms=ttft.p99,
        tpot_p50_ms=tpot.p50,
        tpot_p90_ms=tpot.p90,
        e2e_p90_ms=e2e.p90,
        goodput_rps=gp.good_requests_per_s if gp is not None else None,
        slo_attainment=gp.attainment if gp is not None else None,
        error_rate=m.requests.error_rate,
        prefix_cache_hit_rate=pc.hit_rate if pc is not None else None,
        warm_cache=pc is not None and pc.warm,
        window_status=rw.status if rw is not None else None,
        window_verdict=rw.verdict if rw is not None else None,
        window_output_tps=rw.system_tps if rw is not None else None,
    )


def point_entry(
    index: int,
    label: str,
    concurrency: int | None,
    rate: float | None,
    *,
    rel_dir: str,
    status: str,
    exit_code: int | None,
    run: RunDocument | None = None,
    reason: str | None = None,
    offline: bool = False,
    duration_s: float | None = None,
) -> SweepPoint:
    """One point of sweep.json; figures and verdict come from ``run`` (its run.json) if any. A point
    whose verdict is not a pass, and that has no other ``reason``, takes its verdict's first reason
    (the real cause, with its fix); ``duration_s``: the point's own duration (a lengthened search point)."""
    figures = point_figures(run) if run is not None else PointFigures()
    verdict = run.verdict.status if run is not None and run.verdict is not None else None
    if reason is None and run is not None and run.verdict is not None and verdict != "pass":
        reason = next(iter(run.verdict.reasons), None)
    return SweepPoint(
        index=index,
        label=label,
        concurrency=concurrency,
        rate=rate,
        offline=offline,
        dir=rel_dir,
        status=status,
        exit_code=exit_code,
        verdict=verdict,
        reason=reason,
        needs_duration_s=needs_duration_s(run) if run is not None else None,
        duration_s=duration_s,
        **msgspec.structs.asdict(figures),
    )


def read_run_json(path: Path) -> RunDocument | None:
    """A run folder's run.json, or None when it is missing or unreadable (a run that never finished)."""
    try:
        return read_run_document(path)
    except RunDocumentError:
        return None


def load_sweep(path: str | Path) -> SweepDocument:
    """A sweep folder (or its sweep.json) as the checked SweepDocument (docs/sweep.md).

    Every point's ``dir`` stays relative to the sweep folder (``sweep_root`` gives the folder).
    Raises SweepFormatError with one line on a missing file or a wrong shape.
    """
    return read_sweep_document(path)


def sweep_root(path: str | Path) -> Path:
    """The sweep folder of a folder or sweep.json path (what point ``dir`` values are relative to)."""
    p = Path(path)
    return p.parent if p.is_file() else p
