"""Render a sweep folder's sweep.json into one self-contained, offline, printable sweep.html."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from markupsafe import Markup

from loadtest.contracts.sweep_document import SweepDocument, SweepEndpoint, SweepPoint
from loadtest.economics.sweep import cost_columns, with_cost_cells
from loadtest.fmt import NA, fmt_ms, fmt_num, fmt_pct, short_hash
from loadtest.report import charts, sweep_charts
from loadtest.report.run_report import VERDICT_LABELS, template_env
from loadtest.sweep.model import REPORT_FILE, load_sweep, sweep_root
from loadtest.telemetry.warm import WARM_THRESHOLD

TEMPLATE = "sweep_report.html.j2"
MODE_TEXT = {
    "concurrency": "concurrency ladder (closed loop)",
    "rate": "rate ladder (open loop, Poisson arrivals unless the profile says otherwise)",
    "search": "search for the highest rate that meets the SLOs (bisection)",
}
CAPTIONS = {
    "pareto": "Each marker is one point, by its run's verdict: green, it met every SLO; red, it missed one; "
    "hollow amber, it was not valid (too short or too few samples to prove an SLO, or an overloaded "
    "generator: it proves nothing either way, the row says why); purple, the endpoint failed. "
    "The line joins the Pareto front: points no other point beats on both system output tokens/s and "
    "tokens/s per user (1000 / TPOT p90). Moving right trades system throughput for faster streams.",
    "pareto_ttft": "The same points against TTFT p90 from the scheduled time (log scale); the line is the "
    "front of points no other point beats on both higher throughput and lower TTFT.",
    "latency": "TTFT, TPOT and end-to-end p90 latency (log scale) against system output tokens/s, the "
    "ladder points joined in order of load (a search's points in order of rate), the offline point as "
    "grey diamonds of its own; dashed lines mark the knee and the best point under the SLOs.",
    "load": "System output tokens/s (left axis) and tokens/s per user (right axis, dotted) at each load "
    "level; the star marks the knee (docs/sweep.md), the dashed line the offline point's throughput.",
}


# The verdict cell's class: the colours of the charts' markers (sweep_charts.VERDICT_MARKERS).
VERDICT_CLASS = {
    "pass": "pass",
    "slo_missed": "fail",
    "invalid": "invalid",
    "error_rate": "failing",
    "quality_failed": "failing",
}


def _load_text(p: SweepPoint) -> str:
    if p.offline:
        return f"offline, {p.concurrency} streams"
    if p.concurrency is not None:
        return f"{p.concurrency} stream{'s' if p.concurrency != 1 else ''}"
    return f"{fmt_num(p.rate, 3)} req/s" if p.rate is not None else NA


def _notes(doc: SweepDocument, p: SweepPoint) -> str:
    notes = []
    if p.index == doc.knee:
        notes.append("knee")
    if p.index == doc.best_under_slo:
        notes.append("best under the SLOs")
    if p.offline:
        notes.append(f"offline: {p.concurrency} streams")
    if p.reason and _why(p) is None:
        notes.append(p.reason)
    if p.warm_cache:
        notes.append(f"warm prefix cache ({fmt_pct(p.prefix_cache_hit_rate)} of prompt tokens)")
    return "; ".join(notes)


def _why(p: SweepPoint) -> str | None:
    """Why a completed point did not pass (its verdict's first reason), shown on a line under its row."""
    return p.reason if p.status == "completed" and p.verdict not in (None, "pass") and p.reason else None


def _cells(p: SweepPoint) -> list[str]:
    """The figures' cells, in the table's column order."""
    return [
        fmt_num(p.output_tps),
        fmt_num(p.requests_per_s, 2),
        fmt_num(p.tps_per_user),
        fmt_ms(p.ttft_p50_ms),
        fmt_ms(p.ttft_p90_ms),
        fmt_ms(p.ttft_p99_ms),
        fmt_ms(p.tpot_p50_ms),
        fmt_ms(p.tpot_p90_ms),
        fmt_ms(p.e2e_p90_ms),
        fmt_num(p.goodput_rps, 2),
        fmt_pct(p.slo_attainment),
        fmt_pct(p.error_rate),
        fmt_pct(p.prefix_cache_hit_rate),
    ]


def _rows(doc: SweepDocument, root: Path) -> list[dict[str, Any]]:
    rows = []
    for p in doc.points:
        rel = p.dir
        report = f"{rel}/report.html" if rel and (root / rel / "report.html").is_file() else None
        verdict = p.verdict
        rows.append(
            {
                "index": p.index,
                "label": p.label,
                "load": _load_text(p),
                "status": p.status,
                "verdict": VERDICT_LABELS.get(verdict, verdict) if verdict else NA,
                "verdict_class": VERDICT_CLASS.get(verdict or "", "none"),
                "exit_code": NA if p.exit_code is None else str(p.exit_code),
                "report": report,
                "cells": _cells(p),
                "notes": _notes(doc, p),
                "why": _why(p),
            }
        )
    return rows


def _point_text(doc: SweepDocument, index: int | None) -> str:
    p = doc.point(index)
    if p is None:
        return "none"
    return (
        f"{p.label} ({_load_text(p)}): {fmt_num(p.output_tps)} output tok/s, "
        f"{fmt_num(p.tps_per_user)} tok/s per user, TTFT p90 {fmt_ms(p.ttft_p90_ms)} ms"
    )


def _endpoint_text(ep: SweepEndpoint) -> str:
    url = ep.url or "unknown"
    eng = ep.engine or {}  # the embedded engine's configuration: a JSON object
    if not ep.embedded:
        return f"{url} (external)"
    tp = eng.get("tp") or 1
    gpus = f"{tp}×{eng.get('gpu')}" if tp > 1 else str(eng.get("gpu"))
    extra = f", max_num_seqs {eng['max_num_seqs']}" if eng.get("max_num_seqs") else ""
    return f"{url} (embedded engine: {eng.get('model')} on {gpus}, speed-up {eng.get('speedup')}x{extra})"


def _slo_text(slo: dict[str, float | None]) -> str:
    if not slo:
        return "none (every valid run passes)"
    parts = []
    for key, limit in slo.items():
        if key == "error_rate" and isinstance(limit, int | float):
            parts.append(f"error rate ≤ {limit:.2%}")
        else:
            parts.append(f"{key} ≤ {fmt_ms(limit)} ms")
    return ", ".join(parts)


def render_html(doc: SweepDocument, root: Path) -> str:
    """The sweep page for a loaded sweep.json whose point folders lie under ``root``."""
    pts, knee, best = doc.points, doc.knee, doc.best_under_slo
    figs = {
        "pareto": sweep_charts.pareto_figure(pts, knee, best),
        "pareto_ttft": sweep_charts.pareto_figure(pts, knee, best, x_key="ttft_p90_ms"),
        "latency": sweep_charts.latency_figure(pts, knee, best),
        "load": sweep_charts.load_figure(pts, doc.mode, knee),
    }
    titles = {
        "pareto": sweep_charts.PARETO_TITLE,
        "pareto_ttft": sweep_charts.PARETO_TTFT_TITLE,
        "latency": sweep_charts.LATENCY_TITLE,
        "load": sweep_charts.LOAD_TITLE,
    }
    sections = [
        {
            "id": key,
            "title": titles[key],
            "html": Markup(charts.figure_html(fig)) if fig is not None else None,
            "caption": CAPTIONS[key],
        }
        for key, fig in figs.items()
    ]
    mode_text = MODE_TEXT.get(doc.mode, doc.mode)
    return (
        template_env()
        .get_template(TEMPLATE)
        .render(
            profile=doc.profile or "sweep",
            mode=doc.mode,
            mode_text=mode_text,
            interrupted=doc.status == "interrupted",
            interrupted_reason=doc.interrupted_reason,
            stopped_because=doc.stopped_because,
            warm_points=[p.label for p in pts if p.warm_cache],
            warm_threshold=f"{WARM_THRESHOLD:.0%}",
            knee_text=_point_text(doc, knee),
            best_text=_point_text(doc, best),
            summary=[
                ("Mode", mode_text),
                ("Points", f"{sum(p.status == 'completed' for p in pts)} completed of {len(pts)}"),
                ("SLOs", _slo_text(doc.slo)),
                ("Point duration", f"{fmt_num(doc.point_duration_s, 1)} s"),
                ("Endpoint", _endpoint_text(doc.endpoint)),
                ("Workload fingerprint", short_hash(doc.fingerprint)),
                ("Created", doc.created or NA),
            ],
            search=doc.search,
            sections=sections,
            columns=[
                "out tok/s",
                "req/s",
                "tok/s/user",
                "TTFT p50",
                "TTFT p90",
                "TTFT p99",
                "TPOT p50",
                "TPOT p90",
                "E2E p90",
                "goodput req/s",
                "SLO met",
                "errors",
                "prefix hit",
            ]
            + cost_columns(root),  # per-GPU and cost columns when the points carry them (economics/)
            rows=with_cost_cells(_rows(doc, root), root),
            plotly_js=Markup(charts.plotly_js()) if any(s["html"] for s in sections) else None,
        )
    )


def render_sweep_report(sweep_dir: Path) -> Path:
    """Write ``sweep_dir/sweep.html`` from its sweep.json and return its path (SweepFormatError if unreadable)."""
    doc = load_sweep(sweep_dir)
    root = sweep_root(sweep_dir)
    out = root / REPORT_FILE
    out.write_text(render_html(doc, root), encoding="utf-8")
    return out
