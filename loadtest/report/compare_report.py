"""Render a comparison document into one self-contained, offline, printable compare.html."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from hdrh.histogram import HdrHistogram
from markupsafe import Markup

from loadtest.compare.headline import BETTER, SAME, WORSE, change, headlines
from loadtest.compare.inputs import Side
from loadtest.economics.html import cost_ranking_html
from loadtest.fmt import NA, fmt_ms, fmt_num, short_hash
from loadtest.metrics import hdr
from loadtest.report import charts
from loadtest.report.run_report import VERDICT_LABELS, template_env

TEMPLATE = "compare.html.j2"
# One colour per compared input, the same in every chart.
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
CDF_CHARTS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("TTFT distribution (CDF), ms", ("ttft",), "Time to first token of every ok request, per input."),
    (
        "TPOT and ITL distributions (CDF), ms",
        ("tpot", "itl"),
        "Time per output token per request (solid) and every gap between token-carrying chunks (dotted).",
    ),
    ("E2E latency distribution (CDF), ms", ("e2e",), "Scheduled time to the last byte of each ok request."),
)
# A delta bar's colour by what the change means, the deltas table's green and red; grey: within noise.
CHANGE_COLOURS = {BETTER: "#1e7b34", WORSE: "#b3261e", SAME: "#9aa0a6"}
PATTERNS = ("", "/", "x", ".", "\\", "+")
DELTA_TITLE = "Change against the baseline with 95 % confidence intervals (%)"
PARETO_TITLE = "Pareto: system output tokens/s against tokens/s per user"


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _layout(fig: go.Figure, title: str, height: int = 420) -> None:
    charts.layout(fig, title, height, margin={"l": 60, "r": 30, "t": 60, "b": 50}, hovermode=None)


def _cdf(enc: str | None) -> list[tuple[float, float]]:
    if not enc:
        return []
    return [(v / 1000.0, f) for v, f in hdr.cdf_points(HdrHistogram.decode(enc.encode("ascii")))]


def cdf_figure(sides: list[Side], title: str, keys: tuple[str, ...]) -> go.Figure | None:
    """Overlaid CDFs of one or two latency metrics, one colour per input (from run.json histograms); the
    log x axis from where the data starts (charts.cdf_axis_range)."""
    fig = go.Figure()
    drawn: list[list[tuple[float, float]]] = []
    for i, side in enumerate(sides):
        hists = side.run.histograms  # metric → encoded HDR histogram
        for k, key in enumerate(keys):
            pts = _cdf(hists.get(key))
            if not pts:
                continue
            drawn.append(pts)
            label = f"{side.name} {key.upper()}" if len(keys) > 1 else side.name
            fig.add_trace(
                go.Scatter(
                    x=[v for v, _ in pts],
                    y=[f for _, f in pts],
                    mode="lines",
                    name=label,
                    line={"shape": "hv", "color": _colour(i), "dash": "dot" if k else "solid"},
                    hovertemplate=f"{label}: %{{x:.3f}} ms<br>fraction ≤ x: %{{y:.4f}}<extra></extra>",
                )
            )
    if not fig.data:
        return None
    _layout(fig, title)
    fig.update_xaxes(type="log", title_text="latency (ms, log scale)", range=charts.cdf_axis_range(drawn))
    fig.update_yaxes(range=[0, 1.02], title_text="fraction of requests ≤ latency")
    return fig


def delta_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Per metric, every other input's % change against the baseline, with its CI as error bars; each
    bar coloured by what the change means (CHANGE_COLOURS: better, worse, within noise), each input a
    pattern of its own when there are several."""
    fig = go.Figure()
    rows = [r for r in doc["metrics"] if any(d and d.get("pct") is not None for d in r["deltas"])]
    others = [i for i in range(len(doc["sides"])) if i != doc["baseline"]]
    for n, i in enumerate(others):
        side = doc["sides"][i]
        xs, ys, lo, hi, words = [], [], [], [], []
        for r in rows:
            d = r["deltas"][i]
            if not d or d.get("pct") is None:
                continue
            ys.append(f"{r['label']} ({'↑' if r['better'] == 'higher' else '↓'} better)")
            xs.append(d["pct"])
            lo.append(d["pct"] - d["pct_ci"][0])
            hi.append(d["pct_ci"][1] - d["pct"])
            words.append(change(d))
        if xs:
            fig.add_trace(
                go.Bar(
                    x=xs,
                    y=ys,
                    orientation="h",
                    name=side["name"],
                    customdata=words,
                    text=[f"{x:+.1f} % {w}" for x, w in zip(xs, words, strict=True)],
                    textposition="inside",
                    insidetextanchor="start",  # by the zero line, clear of the whiskers at the bar's end
                    marker={
                        "color": [CHANGE_COLOURS[w] for w in words],
                        "pattern": {"shape": PATTERNS[n % len(PATTERNS)], "fgcolor": "#ffffff"},
                        "line": {"color": _colour(i), "width": 2 if len(others) > 1 else 0},
                    },
                    error_x={
                        "type": "data",
                        "symmetric": False,
                        "array": hi,
                        "arrayminus": lo,
                        "color": "#333",
                    },
                    hovertemplate="%{y}: %{x:.1f} % (%{customdata})<extra>" + side["name"] + "</extra>",
                )
            )
    if not fig.data:
        return None
    _layout(fig, DELTA_TITLE, height=max(320, 40 + 34 * len(rows) * max(1, len(fig.data))))
    fig.update_layout(barmode="group", showlegend=len(others) > 1)
    fig.update_xaxes(title_text="change against the baseline (%)", zeroline=True, zerolinewidth=2)
    fig.update_yaxes(autorange="reversed")
    return fig


def pareto_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Sweeps as curves and single runs as points: output tokens/s against tokens/s per user."""
    if not any(p["kind"] == "sweep" for p in doc["pareto"]):
        return None
    fig = go.Figure()
    for i, series in enumerate(doc["pareto"]):
        pts = sorted(series["points"], key=lambda p: p["tps_per_user"])
        if not pts:
            continue
        fig.add_trace(
            go.Scatter(
                x=[p["tps_per_user"] for p in pts],
                y=[p["output_tps"] for p in pts],
                text=[p["label"] for p in pts],
                mode="lines+markers" if series["kind"] == "sweep" else "markers",
                name=series["name"],
                marker={"color": _colour(i), "size": 9},
                line={"color": _colour(i)},
                hovertemplate="%{text}<br>%{x:.1f} tok/s per user<br>%{y:.1f} tok/s<extra>"
                + series["name"]
                + "</extra>",
            )
        )
        for flag, symbol, what in (("knee", "diamond-open", "knee"), ("best", "star", "best under SLO")):
            marked = [p for p in pts if p.get(flag)]
            if marked:
                fig.add_trace(
                    go.Scatter(
                        x=[p["tps_per_user"] for p in marked],
                        y=[p["output_tps"] for p in marked],
                        mode="markers",
                        name=f"{series['name']} {what}",
                        marker={"color": _colour(i), "size": 16, "symbol": symbol, "line": {"width": 2}},
                        hoverinfo="name",
                    )
                )
    if not fig.data:
        return None
    _layout(fig, PARETO_TITLE)
    unit = doc["tokens"]["unit"] if doc["tokens"]["active"] else "tokens"
    fig.update_xaxes(title_text=f"tokens/s per user ({unit}/s per stream)", rangemode="tozero")
    fig.update_yaxes(title_text=f"system output tokens/s ({unit}/s)", rangemode="tozero")
    return fig


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return NA
    if unit == "ms":
        return fmt_ms(v)
    if unit == "%":
        return f"{v:.2f}"
    return fmt_num(v, 3 if abs(v) < 10 else 1)


def _table(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The deltas table: per metric, each input's value and CI, and its delta against the baseline."""
    out = []
    for r in doc["metrics"]:
        cells = []
        for v, d in zip(r["values"], r["deltas"], strict=True):
            cell: dict[str, Any] = {"value": NA, "ci": "", "delta": "", "pct": "", "cls": "", "sig": ""}
            if v is not None:
                cell["value"] = _fmt(v["value"], r["unit"])
                cell["ci"] = f"[{_fmt(v['ci_lo'], r['unit'])}, {_fmt(v['ci_hi'], r['unit'])}]"
            if d is not None:
                cell["delta"] = f"{d['abs']:+.4g} [{d['abs_ci'][0]:+.4g}, {d['abs_ci'][1]:+.4g}]"
                if d["pct"] is not None:
                    cell["pct"] = f"{d['pct']:+.1f} % [{d['pct_ci'][0]:+.1f}, {d['pct_ci'][1]:+.1f}]"
                if d["significant"]:
                    cell["sig"] = "significant"
                    cell["cls"] = "better" if d["better"] else "worse"
                else:
                    cell["sig"] = "not significant"
            cells.append(cell)
        out.append({**r, "cells": cells})
    return out


def _cards(doc: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    cards = []
    for i, s in enumerate(doc["sides"]):
        v = s["verdict"]
        status = v.get("status")
        engine = s["engine"]
        report = Path(s["report"])
        cards.append(
            {
                **s,
                "colour": _colour(i),
                "is_baseline": i == doc["baseline"],
                "verdict_label": VERDICT_LABELS.get(status, status or "no verdict"),
                "verdict_class": status or "none",
                "engine_text": f"{engine['gpu']} × {engine['tp']}, {engine['model']}, speedup {engine['speedup']:g}"
                if engine and engine.get("gpu")
                else "",
                "fp_short": short_hash(s["fingerprint"]),
                "report_href": os.path.relpath(report, out_dir) if report.is_file() else None,
            }
        )
    return cards


def render_compare_html(doc: dict[str, Any], sides: list[Side], out_dir: Path) -> str:
    """The comparison page for a comparison document and its inputs (for the histograms)."""
    figures: list[dict[str, Any]] = []
    pareto = pareto_figure(doc)
    if pareto is not None:
        figures.append(
            {
                "id": "pareto",
                "fig": pareto,
                "caption": "Each sweep point is one run at one load level; up and to the right is better. "
                "Diamonds mark each sweep's knee, stars its best point under the SLOs; a single run is one dot."
                + (" Token counts are normalized (see Token units)." if doc["tokens"]["active"] else ""),
            }
        )
    delta = delta_figure(doc)
    if delta is not None:
        figures.append(
            {
                "id": "delta-chart",
                "fig": delta,
                "caption": "Bars: the relative change of each metric against the baseline, green when it is "
                "better, red when it is worse (its 95 % bootstrap confidence interval excludes 0; the arrow says "
                "which direction is better), grey within noise; whiskers: that interval."
                + (" Each input has its own pattern and outline." if len(doc["sides"]) > 2 else ""),
            }
        )
    for n, (title, keys, caption) in enumerate(CDF_CHARTS):
        fig = cdf_figure(sides, title, keys)
        if fig is not None:
            figures.append({"id": f"cdf-{n}", "fig": fig, "caption": caption + " Log x axis."})
    for f in figures:
        f["title"] = f["fig"].layout.title.text
        f["html"] = Markup(charts.figure_html(f["fig"]))
    base = doc["sides"][doc["baseline"]]["name"]
    return (
        template_env()
        .get_template(TEMPLATE)
        .render(
            doc=doc,
            base_name=base,
            names=[s["name"] for s in doc["sides"]],
            cards=_cards(doc, out_dir),
            headlines=headlines(doc),
            table=_table(doc),
            figures=figures,
            cost_ranking=_cost_ranking(sides),
            plotly_js=Markup(charts.plotly_js()) if figures else None,
        )
    )


def _cost_ranking(sides: list[Side]) -> Markup | None:
    """Inputs ranked by cost at equal SLO (loadtest.economics); None when no input carries a price."""

    return cost_ranking_html(sides)


def write_compare_html(doc: dict[str, Any], sides: list[Side], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_compare_html(doc, sides, path.parent.resolve()), encoding="utf-8")
    return path
