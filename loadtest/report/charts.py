"""Plotly figures for the run report: latency CDFs and the per-second throughput series."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import plotly.graph_objects as go
import plotly.offline
from hdrh.histogram import HdrHistogram
from plotly.subplots import make_subplots

from loadtest.metrics import hdr

CDF_METRICS: tuple[tuple[str, str], ...] = (
    ("ttft", "TTFT"),
    ("itl", "ITL"),
    ("tpot", "TPOT"),
    ("e2e", "E2E"),
)
CDF_TITLE = "Latency distribution (CDF)"
THROUGHPUT_TITLE = "Per-second throughput"
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}
# href="http... / src='//... inside plotly.js strings and code; a space after "=" keeps both meanings.
_URL_ATTR = re.compile(r"""\b(href|src)=(["'])(?=https?:|//)""")


@cache
def plotly_js() -> str:
    """plotly.js for inline embedding, with no literal external href/src attribute in its text."""
    return _URL_ATTR.sub(r"\1= \2", plotly.offline.get_plotlyjs())


def _layout(fig: go.Figure, title: str) -> None:
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left"},
        template="plotly_white",
        height=420,
        autosize=True,
        margin={"l": 60, "r": 60, "t": 60, "b": 50},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
    )


def latency_cdf_figure(histograms: dict[str, str]) -> go.Figure | None:
    """One CDF trace per latency metric that has samples; None when none has."""
    fig = go.Figure()
    for key, label in CDF_METRICS:
        enc = histograms.get(key)
        if not enc:
            continue
        pts = hdr.cdf_points(HdrHistogram.decode(enc.encode("ascii")))
        if not pts:
            continue
        fig.add_trace(
            go.Scatter(
                x=[v / 1000.0 for v, _ in pts],
                y=[f for _, f in pts],
                mode="lines",
                name=label,
                line={"shape": "hv"},
                hovertemplate=f"{label}: %{{x:.3f}} ms<br>fraction ≤ x: %{{y:.4f}}<extra></extra>",
            )
        )
    if not fig.data:
        return None
    _layout(fig, CDF_TITLE)
    fig.update_xaxes(type="log", title_text="latency (ms, log scale)")
    fig.update_yaxes(range=[0, 1.02], title_text="fraction of requests / gaps ≤ latency")
    return fig


def _filled(series: dict[str, list[Any]], col: str, n: int) -> list[float]:
    out = [0.0] * n
    for t, v in zip(series.get("t", []), series.get(col, []), strict=False):
        if 0 <= int(t) < n:
            out[int(t)] += v
    return out


def throughput_figure(series: dict[str, list[Any]]) -> go.Figure | None:
    """Output tokens/s (left axis), completed and failed requests/s (right axis) per second."""
    ts = [int(t) for t in series.get("t", [])]
    if not ts:
        return None
    n = max(ts) + 1
    x = list(range(n))
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(x=x, y=_filled(series, "output_tokens", n), name="output tokens/s", mode="lines"),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(x=x, y=_filled(series, "completed", n), name="completed requests/s", mode="lines"),
        secondary_y=True,
    )
    fig.add_trace(
        go.Scatter(x=x, y=_filled(series, "errors", n), name="errors/s", mode="lines", line={"dash": "dot"}),
        secondary_y=True,
    )
    _layout(fig, THROUGHPUT_TITLE)
    fig.update_xaxes(title_text="time since start (s)")
    fig.update_yaxes(title_text="output tokens/s", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(
        title_text="requests/s", rangemode="tozero", showgrid=False, tickmode="auto", secondary_y=True
    )
    return fig


def figure_html(fig: go.Figure) -> str:
    """A figure as an HTML fragment that uses the inline plotly.js loaded once in the page."""
    return fig.to_html(full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG, default_width="100%")
