"""Cost at every sweep point, the cheapest point that meets the SLOs, and vendors ranked by cost at equal SLO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from loadtest.contracts.run_document import Economics, RunDocument, to_data
from loadtest.contracts.sweep_document import SweepDocument
from loadtest.economics.cost import run_economics
from loadtest.sweep.model import SWEEP_FILE, SweepFormatError, load_sweep, read_run_json, sweep_root


def _economics(run: RunDocument) -> Economics | None:
    """``run_economics`` (economics/cost.py, which reads run.json as JSON) of a finished run, as
    run.json's ``economics`` section."""
    econ = run_economics(to_data(run))
    return msgspec.convert(econ, Economics) if econ is not None else None


def point_economics(sweep: SweepDocument, root: Path) -> list[Economics | None]:
    """Per point of a sweep (``dir`` relative to ``root``): its run's economics, or None."""
    out: list[Economics | None] = []
    for p in sweep.points:
        run = read_run_json(root / p.dir) if p.dir else None
        out.append(_economics(run) if run is not None else None)
    return out


def cheapest_under_slo(sweep: SweepDocument, econ: list[Economics | None]) -> int | None:
    """Index of the point with the lowest cost per million output tokens among those whose verdict passed."""
    best: tuple[float, int] | None = None
    for p, e in zip(sweep.points, econ, strict=False):
        cost = e.cost_per_m_output if e is not None else None
        if p.verdict != "pass" or p.offline or cost is None:
            continue
        if best is None or cost < best[0]:
            best = (cost, p.index)
    return None if best is None else best[1]


def _summary(sweep: SweepDocument, root: Path) -> dict[str, Any] | None:
    econ = point_economics(sweep, root)
    if not any(econ):
        return None
    return {"points": econ, "cheapest_under_slo": cheapest_under_slo(sweep, econ)}


def sweep_economics(sweep_dir: str | Path) -> dict[str, Any] | None:
    """``{points: [economics|None], cheapest_under_slo}`` of a sweep folder; None when no point has any."""
    root = sweep_root(sweep_dir)
    try:
        sweep = load_sweep(root)
    except SweepFormatError:
        return None
    return _summary(sweep, root)


def _sweep_row(folder: Path) -> dict[str, Any]:
    """A sweep's figures in the ranking: its cheapest point that meets the SLOs, or why it has none."""
    sweep = load_sweep(folder)
    sw = _summary(sweep, folder)
    if sw is None or sw["cheapest_under_slo"] is None:
        return {"why": "no point met the SLOs with a price" if sw else "no price recorded"}
    idx = sw["cheapest_under_slo"]
    return {**_row_figures(sw["points"][idx]), "point": sweep.points[idx].label}


def _run_row(run: RunDocument) -> dict[str, Any]:
    """A run's figures in the ranking: its own, with no cost when its verdict did not pass."""
    e = _economics(run)
    status = run.verdict.status if run.verdict is not None else None
    if e is None or e.cost_per_m_output is None:
        return {"why": "no price recorded"}
    if status != "pass":
        why = f"verdict {status}: did not meet the SLOs"
        return {**_row_figures(e), "cost_per_m_output": None, "why": why}
    return _row_figures(e)


def rank_by_cost(entries: list[tuple[str, Path, RunDocument]]) -> dict[str, Any] | None:
    """Vendors ranked by cost per million output tokens at equal SLO.

    ``entries``: (name, folder, run.json) per compared input; a sweep folder contributes its cheapest
    point that meets the SLOs, a run folder itself when its verdict passed. Returns ``{rows, slos_equal,
    currency}`` (rows cheapest first; inputs without a price or without a passing point last, with why)
    or None when no input has a price."""
    rows: list[dict[str, Any]] = []
    slo_sets = []
    for name, folder, run in entries:
        slo_sets.append(json.dumps(run.config.slos or {}, sort_keys=True))
        part = _sweep_row(folder) if (folder / SWEEP_FILE).is_file() else _run_row(run)
        rows.append({"name": name, "cost_per_m_output": None, "point": None, "why": "", **part})
    if not any(r.get("currency") for r in rows):
        return None
    ranked = sorted(rows, key=lambda r: (r["cost_per_m_output"] is None, r["cost_per_m_output"] or 0.0))
    rank = 0
    for r in ranked:
        r["rank"] = (rank := rank + 1) if r["cost_per_m_output"] is not None else None
    currencies = {r.get("currency") for r in ranked if r.get("currency")}
    return {
        "rows": ranked,
        "slos_equal": len(set(slo_sets)) <= 1,
        "currency": currencies.pop() if len(currencies) == 1 else "mixed",
    }


def _row_figures(e: Economics) -> dict[str, Any]:
    return {
        "cost_per_m_output": e.cost_per_m_output,
        "cost_per_m_blended": e.cost_per_m_blended,
        "output_tokens_per_s_per_gpu": e.output_tokens_per_s_per_gpu,
        "gpu": f"{e.gpu_count or '?'}× {e.gpu_kind}",
        "currency": e.currency if e.price else None,
    }


def cost_columns(root: Path) -> list[str]:
    """Extra sweep-table columns when the sweep's points carry hardware or a price (none otherwise)."""
    sw = sweep_economics(root)
    if sw is None:
        return []
    cur = next((e.currency for e in sw["points"] if e is not None and e.price), None)
    cols = ["out tok/s/GPU"]
    return cols + ([f"{cur} / 1M out", f"{cur} / 1M blended"] if cur else [])


def with_cost_cells(rows: list[dict[str, Any]], root: Path) -> list[dict[str, Any]]:
    """The sweep table's rows with per-GPU throughput and cost cells, the cheapest passing point noted."""
    sw = sweep_economics(root)
    if sw is None:
        return rows
    priced = any(e is not None and e.price for e in sw["points"])
    for row, e in zip(rows, sw["points"], strict=False):
        row["cells"] = [*row["cells"], *_cost_cells(e, priced)]
        if row.get("index") == sw["cheapest_under_slo"] and row.get("index") is not None:
            row["notes"] = "; ".join(n for n in (row.get("notes"), "cheapest meeting the SLOs") if n)
    return rows


def _cost_cells(e: Economics | None, priced: bool) -> list[str]:
    """A point's per-GPU throughput cell, and its two cost cells when any point has a price."""
    per_gpu, out, blended = (
        (e.output_tokens_per_s_per_gpu, e.cost_per_m_output, e.cost_per_m_blended)
        if e
        else (None, None, None)
    )
    return [_fmt(per_gpu, 1)] + ([_fmt(out, 4), _fmt(blended, 4)] if priced else [])


def _fmt(v: float | None, digits: int) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"
