"""Cost at every sweep point, the cheapest point that meets the SLOs, and vendors ranked by cost at equal SLO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadtest.economics.cost import run_economics
from loadtest.sweep.model import read_run_json


def point_economics(sweep: dict[str, Any], root: Path) -> list[dict[str, Any] | None]:
    """Per point of a sweep.json (``dir`` relative to ``root``): its run's economics, or None."""
    out: list[dict[str, Any] | None] = []
    for p in sweep.get("points") or []:
        run = read_run_json(root / str(p.get("dir") or "")) if p.get("dir") else None
        out.append(run_economics(run) if run else None)
    return out


def cheapest_under_slo(sweep: dict[str, Any], econ: list[dict[str, Any] | None]) -> int | None:
    """Index of the point with the lowest cost per million output tokens among those whose verdict passed."""
    best: tuple[float, int] | None = None
    for p, e in zip(sweep.get("points") or [], econ, strict=False):
        cost = (e or {}).get("cost_per_m_output")
        if p.get("verdict") != "pass" or p.get("offline") or cost is None:
            continue
        if best is None or cost < best[0]:
            best = (cost, int(p.get("index", 0)))
    return None if best is None else best[1]


def sweep_economics(sweep_dir: str | Path) -> dict[str, Any] | None:
    """``{points: [economics|None], cheapest_under_slo}`` of a sweep folder; None when no point has any."""
    root = Path(sweep_dir)
    root = root.parent if root.is_file() else root
    try:
        sweep = json.loads((root / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    econ = point_economics(sweep, root)
    if not any(econ):
        return None
    return {"points": econ, "cheapest_under_slo": cheapest_under_slo(sweep, econ)}


def rank_by_cost(entries: list[tuple[str, Path, dict[str, Any]]]) -> dict[str, Any] | None:
    """Vendors ranked by cost per million output tokens at equal SLO.

    ``entries``: (name, folder, run.json) per compared input; a sweep folder contributes its cheapest
    point that meets the SLOs, a run folder itself when its verdict passed. Returns ``{rows, slos_equal,
    currency}`` (rows cheapest first; inputs without a price or without a passing point last, with why)
    or None when no input has a price."""
    rows: list[dict[str, Any]] = []
    slo_sets = []
    for name, folder, run in entries:
        slo_sets.append(json.dumps(((run.get("config") or {}).get("slos") or {}), sort_keys=True))
        row: dict[str, Any] = {"name": name, "cost_per_m_output": None, "point": None, "why": ""}
        if (folder / "sweep.json").is_file():
            sw = sweep_economics(folder)
            sweep = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
            idx = sw["cheapest_under_slo"] if sw else None
            if idx is None:
                row["why"] = "no point met the SLOs with a price" if sw else "no price recorded"
            else:
                assert sw is not None  # idx came from it
                e = sw["points"][idx]
                row.update(_row_figures(e))
                row["point"] = (sweep["points"][idx] or {}).get("label")
        else:
            e = run_economics(run)
            status = (run.get("verdict") or {}).get("status")
            if not e or e.get("cost_per_m_output") is None:
                row["why"] = "no price recorded"
            elif status != "pass":
                row["why"] = f"verdict {status}: did not meet the SLOs"
                row.update(_row_figures(e))
                row["cost_per_m_output"] = None
            else:
                row.update(_row_figures(e))
        rows.append(row)
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


def _row_figures(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "cost_per_m_output": e.get("cost_per_m_output"),
        "cost_per_m_blended": e.get("cost_per_m_blended"),
        "output_tokens_per_s_per_gpu": e.get("output_tokens_per_s_per_gpu"),
        "gpu": f"{e.get('gpu_count') or '?'}× {e.get('gpu_kind')}",
        "currency": e.get("currency") if e.get("price") else None,
    }


def cost_columns(root: Path) -> list[str]:
    """Extra sweep-table columns when the sweep's points carry hardware or a price (none otherwise)."""
    sw = sweep_economics(root)
    if sw is None:
        return []
    cur = next((e["currency"] for e in sw["points"] if e and e.get("price")), None)
    cols = ["out tok/s/GPU"]
    return cols + ([f"{cur} / 1M out", f"{cur} / 1M blended"] if cur else [])


def with_cost_cells(rows: list[dict[str, Any]], root: Path) -> list[dict[str, Any]]:
    """The sweep table's rows with per-GPU throughput and cost cells, the cheapest passing point noted."""
    sw = sweep_economics(root)
    if sw is None:
        return rows
    priced = any(e and e.get("price") for e in sw["points"])
    for row, e in zip(rows, sw["points"], strict=False):
        e = e or {}
        cells = [_fmt(e.get("output_tokens_per_s_per_gpu"), 1)]
        if priced:
            cells += [_fmt(e.get("cost_per_m_output"), 4), _fmt(e.get("cost_per_m_blended"), 4)]
        row["cells"] = [*row["cells"], *cells]
        if row.get("index") == sw["cheapest_under_slo"] and row.get("index") is not None:
            row["notes"] = "; ".join(n for n in (row.get("notes"), "cheapest meeting the SLOs") if n)
    return rows


def _fmt(v: float | None, digits: int) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"
