"""Report sections for a run: the Cost table (with the GPUs' energy when polled) and the per-endpoint
breakdown, as ready HTML (empty when no data);
and the compare report's ranking by cost at equal SLO.

The run report's sections take the run.json it read as JSON (report/run_report.py); the ranking takes
the compared inputs' RunDocuments.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from markupsafe import Markup, escape

from loadtest.contracts.run_document import RunDocument
from loadtest.economics.cost import run_economics
from loadtest.economics.sweep import rank_by_cost


def _num(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.{digits}f}" if abs(v) >= 0.01 or v == 0 else f"{v:.3g}"


def money(v: float | None, currency: str, per: str) -> str:
    return "n/a" if v is None else f"{_num(v, 4 if v < 1 else 2)} {currency} {per}"


def price_text(price: dict[str, Any] | None) -> str:
    if not price:
        return "none given"
    cur = price.get("currency") or "USD"
    if price.get("per_gpu_hour") is not None:
        return f"{_num(price['per_gpu_hour'])} {cur} per GPU-hour"
    return f"{_num(price.get('per_m_input'))} {cur} / 1M input tokens, {_num(price.get('per_m_output'))} {cur} / 1M output tokens"


def cost_rows(run: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value with unit) rows of the Cost section; empty when the run has no hardware or price."""
    e = run_economics(run)
    if e is None:
        return []
    cur = e["currency"]
    gpus = f"{e['gpu_count']}× {e['gpu_kind']}" if e.get("gpu_count") else f"{e['gpu_kind']} (count unknown)"
    rows = [
        ("Hardware", gpus),
        ("Output tokens/s", f"{_num(e['output_tokens_per_s'], 1)} tok/s ({e['basis']})"),
    ]
    if e.get("output_tokens_per_s_per_gpu") is not None:
        rows.append(("Output tokens/s per GPU", f"{_num(e['output_tokens_per_s_per_gpu'], 1)} tok/s/GPU"))
        rows.append(("Input tokens/s per GPU", f"{_num(e['input_tokens_per_s_per_gpu'], 1)} tok/s/GPU"))
    if e.get("price"):
        rows.append(("Price", price_text(e["price"])))
        rows.append(("Cost of this load", money(e["cost_per_hour"], cur, "per hour")))
        rows.append(("Cost per 1M output tokens", money(e["cost_per_m_output"], cur, "/ 1M output tokens")))
        rows.append(("Cost per 1M input tokens", money(e["cost_per_m_input"], cur, "/ 1M input tokens")))
        share = e.get("input_share")
        mix = f" (profile mix: {share * 100:.0f}% input)" if share is not None else ""
        rows.append(("Blended cost per 1M tokens", money(e["cost_per_m_blended"], cur, "/ 1M tokens") + mix))
    return rows


def energy_rows(run: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the GPUs' energy (run.json telemetry.energy, from dcgm-exporter's power);
    empty when no power was polled."""
    en = (run.get("telemetry") or {}).get("energy")
    if not en:
        return []
    rows = [
        (
            "GPU power (mean of the polls)",
            f"{_num(en.get('power_w_mean'), 1)} W ({en.get('power_samples')} polls)",
        ),
        ("Energy per output token", f"{_num(en.get('j_per_output_token'), 4)} J / output token"),
    ]
    if en.get("output_tokens_per_s_per_w") is not None:
        rows.append(("Output tokens/s per watt", f"{_num(en['output_tokens_per_s_per_w'], 3)} tok/s/W"))
    return rows


def _table(head: list[str], rows: list[list[str]], cls: str) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def endpoint_rows(run: dict[str, Any]) -> list[list[str]]:
    """Rows of the per-endpoint table (run.json metrics.per_endpoint); empty for a one-endpoint run."""
    per = ((run.get("metrics") or {}).get("per_endpoint") or {}).get("endpoints") or []
    rows = []
    for p in per:
        rows.append(
            [
                str(p.get("index")),
                str(p.get("url")),
                f"{p.get('requests', 0):,}",
                f"{(p.get('share') or 0) * 100:.1f}%",
                f"{(p.get('error_rate') or 0) * 100:.1f}%",
                f"{_num(p.get('output_tokens_per_s'), 1)} tok/s",
                f"{_num(p.get('ttft_p50_ms'), 1)} / {_num(p.get('ttft_p99_ms'), 1)} ms",
                f"{_num(p.get('tpot_p50_ms'), 2)} / {_num(p.get('tpot_p99_ms'), 2)} ms",
            ]
        )
    return rows


def extra_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Sections the run report adds when the run has the data: ``{id, title, html}`` each."""
    out: list[dict[str, Any]] = []
    rows = cost_rows(run)
    energy = energy_rows(run)  # next to tok/s/GPU when the run has hardware, else on its own
    if rows:
        html = _table(["Figure", "Value"], [[a, b] for a, b in rows + energy], "cost")
        note = (
            '<p class="note">Costs divide the whole cost of serving the measured load by the tokens '
            "it produced (docs/economics.md).</p>"
        )
        out.append({"id": "cost", "title": "Cost", "html": Markup(html + note)})
    elif energy:
        html = _table(["Figure", "Value"], [[a, b] for a, b in energy], "cost")
        note = (
            '<p class="note">From the GPUs\' power polled from dcgm-exporter during the load '
            "(docs/telemetry.md).</p>"
        )
        out.append({"id": "energy", "title": "Energy", "html": Markup(html + note)})
    erows = endpoint_rows(run)
    if erows:
        per = (run.get("metrics") or {}).get("per_endpoint") or {}
        head = ["#", "Endpoint", "Requests", "Share", "Errors", "Output", "TTFT p50 / p99", "TPOT p50 / p99"]
        imb = per.get("imbalance")
        note = (
            f'<p class="note">Balance: {escape(str(per.get("balance")))}; imbalance (largest share ÷ '
            f"even share): {_num(imb, 2)}.</p>"
            if imb is not None
            else ""
        )
        out.append(
            {"id": "endpoints", "title": "Endpoints", "html": Markup(_table(head, erows, "endpoints") + note)}
        )
    return out


class ComparedInput(Protocol):
    """What the ranking needs of a compared input (compare.inputs.Side)."""

    name: str
    path: Path
    run: RunDocument


def cost_ranking_html(sides: Sequence[ComparedInput]) -> Markup | None:
    """The compare report's "Cost at equal SLO" table: each input's cost per million output tokens at its
    cheapest point meeting the SLOs (a sweep) or its own run (a passing run), cheapest first."""

    ranking = rank_by_cost([(s.name, s.path, s.run) for s in sides])
    if ranking is None:
        return None
    cur = ranking["currency"]
    rows = [
        [
            str(r["rank"] or "—"),
            r["name"],
            r.get("point") or "run",
            r.get("gpu") or "n/a",
            f"{_num(r.get('output_tokens_per_s_per_gpu'), 1)} tok/s/GPU",
            money(r.get("cost_per_m_output"), cur, "/ 1M output tokens") if r["cost_per_m_output"] else "—",
            money(r.get("cost_per_m_blended"), cur, "/ 1M tokens") if r.get("cost_per_m_blended") else "n/a",
            r.get("why") or "",
        ]
        for r in ranking["rows"]
    ]
    head = ["Rank", "Input", "Point", "Hardware", "Per GPU", "Cost per 1M output", "Blended", "Note"]
    note = (
        "All inputs were judged by the same SLOs."
        if ranking["slos_equal"]
        else "Warning: the inputs were judged by different SLOs, so their costs are not at equal SLO."
    )
    return Markup(_table(head, rows, "cost-ranking") + f'<p class="note">{escape(note)}</p>')
