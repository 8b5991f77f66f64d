"""Plotly figures of a sweep: Pareto curves, throughput against latency and against load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from loadtest.contracts.sweep_document import SweepPoint
from loadtest.report import charts
from loadtest.sweep.analysis import ladder_points, measured, pareto_front

PARETO_TITLE = "Pareto curve: system throughput against tokens/s per user"
PARETO_TTFT_TITLE = "Pareto curve: system throughput against TTFT p90"
LATENCY_TITLE = "Throughput against latency"
LOAD_TITLE = "Throughput and tokens/s per user against load"
PASS_COLOR, FAIL_COLOR, FRONT_COLOR = "#1e7b34", "#b3261e", "#3056a0"
INVALID_COLOR, FAILING_COLOR = "#8a6d00", "#6a1b9a"
# A point's marker by its verdict: (legend name, colour, symbol). An invalid point proved nothing (too
# short, too few samples, an overloaded generator): hollow and amber, never the red of a missed SLO.
VERDICT_MARKERS: dict[str, tuple[str, str, str]] = {
    "pass": ("meets the SLOs", PASS_COLOR, "circle"),
    "slo_missed": ("misses an SLO", FAIL_COLOR, "circle"),
    "invalid": ("not valid: cannot be judged", INVALID_COLOR, "circle-open"),
    "error_rate": ("endpoint failing", FAILING_COLOR, "x"),
    "quality_failed": ("quality gate failed", FAILING_COLOR, "triangle-up"),
}
NO_VERDICT = ("no verdict", "#5f6368", "circle-open")
KNEE_STYLE = {
    "symbol": "star",
    "size": 20,
    "color": "rgba(0,0,0,0)",
    "line": {"color": "#c77700", "width": 2.5},
}
BEST_STYLE = {"symbol": "diamond-open", "size": 22, "color": "#1e7b34", "line": {"width": 3}}


def _layout(fig: go.Figure, title: str, height: int = 440) -> None:
    charts.layout(fig, title, height, margin={"l": 70, "r": 70, "t": 70, "b": 55}, hovermode=None)


def _by_index(points: Sequence[SweepPoint], idx: int | None) -> SweepPoint | None:
    return next((p for p in points if p.index == idx), None) if idx is not None else None


def _hover(p: SweepPoint) -> str:
    def f(v: float | None, unit: str, digits: int = 1) -> str:
        return f"{v:,.{digits}f} {unit}" if v is not None else "—"

    why = f"<br>{p.reason}" if p.reason and p.verdict != "pass" else ""
    return (
        f"<b>{p.label}</b> ({p.verdict or 'no verdict'}){why}<br>"
        f"output {f(p.output_tps, 'tok/s')}<br>per user {f(p.tps_per_user, 'tok/s')}<br>"
        f"TTFT p90 {f(p.ttft_p90_ms, 'ms', 2)}<br>TPOT p90 {f(p.tpot_p90_ms, 'ms', 2)}"
    )


def verdict_marker(verdict: str | None) -> tuple[str, str, str]:
    """(legend name, colour, symbol) of a point with this verdict (VERDICT_MARKERS)."""
    return VERDICT_MARKERS.get(verdict or "", NO_VERDICT)


def _scatter_points(fig: go.Figure, pts: list[SweepPoint], x_key: str, **kw: Any) -> None:
    """All measured points as markers, one trace per verdict (VERDICT_MARKERS)."""
    for verdict in [*VERDICT_MARKERS, None]:
        name, color, symbol = verdict_marker(verdict)
        sel = [
            p
            for p in pts
            if (p.verdict if p.verdict in VERDICT_MARKERS else None) == verdict
            and p.figure(x_key) is not None
        ]
        if not sel:
            continue
        fig.add_trace(
            go.Scatter(
                x=[p.figure(x_key) for p in sel],
                y=[p.output_tps for p in sel],
                mode="markers+text",
                text=[p.label for p in sel],
                textposition="top center",
                marker={"color": color, "size": 11, "symbol": symbol, "line": {"width": 2, "color": color}},
                name=name,
                hovertext=[_hover(p) for p in sel],
                hoverinfo="text",
                **kw,
            )
        )


def _marks(
    fig: go.Figure, points: Sequence[SweepPoint], x_key: str, knee: int | None, best: int | None
) -> None:
    for idx, name, style in ((knee, "knee", KNEE_STYLE), (best, "best under the SLOs", BEST_STYLE)):
        p = _by_index(points, idx)
        if p is None or p.figure(x_key) is None or p.output_tps is None:
            continue
        fig.add_trace(
            go.Scatter(
                x=[p.figure(x_key)],
                y=[p.output_tps],
                mode="markers",
                marker=style,
                name=f"{name}: {p.label}",
                hovertext=[_hover(p)],
                hoverinfo="text",
            )
        )


def pareto_figure(
    points: Sequence[SweepPoint],
    knee: int | None,
    best: int | None,
    x_key: str = "tps_per_user",
) -> go.Figure | None:
    """Output tokens/s against ``x_key`` (tokens/s per user, or TTFT p90), the Pareto front as a line."""
    pts = [p for p in measured(points) if p.figure(x_key) is not None]
    if not pts:
        return None
    per_user = x_key == "tps_per_user"
    fig = go.Figure()
    front_idx = pareto_front(points, x_key, higher_x_better=per_user)
    front = [p for i in front_idx if (p := _by_index(points, i)) is not None]
    fig.add_trace(
        go.Scatter(
            x=[p.figure(x_key) for p in front],
            y=[p.output_tps for p in front],
            mode="lines",
            line={"color": FRONT_COLOR, "width": 2, "shape": "hv" if not per_user else "linear"},
            name="Pareto front",
            hoverinfo="skip",
        )
    )
    _scatter_points(fig, pts, x_key)
    _marks(fig, points, x_key, knee, best)
    _layout(fig, PARETO_TITLE if per_user else PARETO_TTFT_TITLE)
    if per_user:
        fig.update_xaxes(title_text="tokens/s per user (1000 / TPOT p90 in ms)", rangemode="tozero")
    else:
        fig.update_xaxes(title_text="TTFT p90 (ms, log scale)", type="log")
    fig.update_yaxes(title_text="system output tokens/s", rangemode="tozero")
    return fig


def latency_figure(points: Sequence[SweepPoint], knee: int | None, best: int | None) -> go.Figure | None:
    """TTFT p90, TPOT p90 and E2E p90 (ms) against output tokens/s, ladder points in order of load; the
    offline point's as markers of their own."""
    pts = ladder_points(points)
    if not pts and not any(p.offline for p in measured(points)):
        return None
    fig = go.Figure()
    for key, name, dash in (
        ("ttft_p90_ms", "TTFT p90", "solid"),
        ("tpot_p90_ms", "TPOT p90", "dot"),
        ("e2e_p90_ms", "E2E p90", "dash"),
    ):
        sel = [(p, v) for p in pts if (v := p.figure(key)) is not None and v > 0]
        if not sel:
            continue
        fig.add_trace(
            go.Scatter(
                x=[p.output_tps for p, _ in sel],
                y=[v for _, v in sel],
                mode="lines+markers",
                line={"dash": dash},
                text=[p.label for p, _ in sel],
                name=name,
                hovertemplate=f"%{{text}}: {name} %{{y:.2f}} ms at %{{x:,.1f}} tok/s<extra></extra>",
            )
        )
    offline = [p for p in measured(points) if p.offline and p.output_tps is not None]
    for o in offline:  # the saturated closed loop: off the ladder's line, a marker per latency
        for key, name, symbol in (
            ("ttft_p90_ms", "TTFT p90", "diamond"),
            ("tpot_p90_ms", "TPOT p90", "diamond-open"),
            ("e2e_p90_ms", "E2E p90", "diamond-wide"),
        ):
            v = o.figure(key)
            if v is None or v <= 0:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[o.output_tps],
                    y=[v],
                    mode="markers+text",
                    text=[o.label if key == "ttft_p90_ms" else ""],
                    textposition="middle left",
                    marker={"symbol": symbol, "size": 12, "color": "#444"},
                    name=f"{o.label} (c{o.concurrency}): {name}",
                    hovertemplate=f"{o.label}: {name} %{{y:.2f}} ms at %{{x:,.1f}} tok/s<extra></extra>",
                )
            )
    for idx, name, color in ((knee, "knee", "#c77700"), (best, "best under the SLOs", PASS_COLOR)):
        p = _by_index(points, idx)
        if p is not None and p.output_tps is not None:
            fig.add_vline(
                x=p.output_tps,
                line={"color": color, "dash": "dash", "width": 1.5},
                annotation_text=f"{name}: {p.label}",
                annotation_position="top left",
            )
    _layout(fig, LATENCY_TITLE)
    fig.update_xaxes(title_text="system output tokens/s", rangemode="tozero")
    fig.update_yaxes(title_text="latency (ms, log scale)", type="log")
    return fig


def _load_points(points: Sequence[SweepPoint], mode: str) -> list[SweepPoint]:
    """The points of the load chart: the ladder's in increasing load, a search's in increasing rate."""
    if mode != "search":
        return ladder_points(points)
    return sorted((p for p in measured(points) if p.rate is not None), key=lambda p: p.rate or 0.0)


def load_figure(points: Sequence[SweepPoint], mode: str, knee: int | None) -> go.Figure | None:
    """Output tokens/s (left axis) and tokens/s per user (right axis) against the offered load."""
    pts = _load_points(points, mode)
    if not pts:
        return None
    closed = mode == "concurrency"

    def load(p: SweepPoint) -> float | None:
        return p.concurrency if closed else p.rate

    x = [load(p) for p in pts]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.output_tps for p in pts],
            mode="lines+markers",
            name="output tokens/s",
            text=[p.label for p in pts],
            hovertemplate="%{text}: %{y:,.1f} output tok/s<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.tps_per_user for p in pts],
            mode="lines+markers",
            name="tokens/s per user",
            yaxis="y2",
            line={"dash": "dot"},
            text=[p.label for p in pts],
            hovertemplate="%{text}: %{y:,.1f} tok/s per user<extra></extra>",
        )
    )
    k = _by_index(points, knee)
    if k is not None and k in pts:
        fig.add_trace(
            go.Scatter(
                x=[load(k)],
                y=[k.output_tps],
                mode="markers",
                marker=KNEE_STYLE,
                name=f"knee: {k.label}",
                hoverinfo="skip",
            )
        )
    for p in measured(points):
        if p.offline:
            fig.add_hline(
                y=p.output_tps,
                line={"color": "#777", "dash": "dash", "width": 1},
                annotation_text=f"offline (c{p.concurrency}): {p.output_tps:,.0f} tok/s",
                annotation_position="bottom right",
            )
    _layout(fig, LOAD_TITLE)
    fig.update_layout(
        yaxis={"title": {"text": "system output tokens/s"}, "rangemode": "tozero"},
        yaxis2={
            "title": {"text": "tokens/s per user"},
            "overlaying": "y",
            "side": "right",
            **charts.RIGHT_AXIS,
        },
    )
    if closed:
        fig.update_xaxes(title_text="concurrency (streams, log2 scale)", type="log", dtick=0.30102999566)
    else:
        fig.update_xaxes(title_text="offered rate (requests/s)", rangemode="tozero")
    return fig
