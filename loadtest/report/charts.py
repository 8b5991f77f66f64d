"""Plotly figures for the run report (latency CDFs, time series, lengths, tokens, telemetry) and embedding."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.offline
from hdrh.histogram import HdrHistogram
from plotly.subplots import make_subplots

from loadtest.contracts.run_document import Telemetry

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
MAX_LENGTH_BINS = 60
# A right-hand axis over a left one: its own round ticks (plotly.js would otherwise place them at the
# left axis's gridlines, "sync": 1.5, 3.01, 4.51), no gridlines of its own, from zero.
RIGHT_AXIS: dict[str, Any] = {"tickmode": "auto", "nticks": 8, "rangemode": "tozero", "showgrid": False}
ERROR_COLORS = ("#b3261e", "#e8710a", "#9334e6", "#1a73e8", "#12b5cb", "#5f6368", "#f9ab00", "#188038")


@cache
def plotly_js() -> str:
    """plotly.js for inline embedding, with no literal external href/src attribute in its text."""
    return _URL_ATTR.sub(r"\1= \2", plotly.offline.get_plotlyjs())


def layout(
    fig: go.Figure,
    title: str,
    height: int = 420,
    margin: dict[str, int] | None = None,
    hovermode: str | None = "x unified",
) -> None:
    """The reports' figure layout: title on the left, white template, legend above the plot on the left
    (plotly's modebar sits at the top right, where a legend there would be hidden under it).

    ``margin`` defaults to 60 px (50 at the bottom); ``hovermode`` None leaves plotly's default.
    """
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left"},
        template="plotly_white",
        height=height,
        autosize=True,
        margin=margin or {"l": 60, "r": 60, "t": 60, "b": 50},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "left", "x": 0.0},
        **({"hovermode": hovermode} if hovermode else {}),
    )


def cdf_points(hist: HdrHistogram, max_points: int = 400) -> list[tuple[float, float]]:
    """(value, cumulative fraction) at the recorded buckets, thinned to about ``max_points``.

    The same points as ``hdr.cdf_points`` (each bucket's highest equivalent value), from one numpy pass
    over the counts instead of hdrh's per-bucket iterator.
    """
    n = hist.get_total_count()
    if not n:
        return []
    counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
    nz = np.flatnonzero(counts)
    frac = np.cumsum(counts[nz]) / n
    keep = np.unique(
        np.r_[np.linspace(0, nz.size - 1, min(nz.size, max_points)).astype(np.int64), nz.size - 1]
    )
    return [
        (float(hist.get_highest_equivalent_value(hist.get_value_from_index(int(nz[k])))), float(frac[k]))
        for k in keep
    ]


# The CDF's x axis starts at the smallest latency at or above this fraction of any metric's samples: a
# few near-zero gaps (chunks read together) would otherwise stretch a log axis over empty decades.
CDF_AXIS_FROM = 0.001


def cdf_axis_range(traces: Sequence[Sequence[tuple[float, float]]]) -> list[float] | None:
    """The log x range (log10 of ms) from where the data starts to where it ends, a little padded."""
    starts = [next((v for v, f in pts if f >= CDF_AXIS_FROM and v > 0), None) for pts in traces]
    ends = [max(v for v, _ in pts) for pts in traces if pts]
    lo = min((v for v in starts if v is not None), default=None)
    hi = max(ends, default=None)
    if lo is None or hi is None or hi <= 0:
        return None
    pad = 0.05
    return [math.log10(lo) - pad, math.log10(max(hi, lo)) + pad]


def latency_cdf_figure(histograms: dict[str, str]) -> go.Figure | None:
    """One CDF trace per latency metric that has samples; None when none has. The log x axis runs from
    where the data starts (``CDF_AXIS_FROM``) to the largest latency."""
    fig = go.Figure()
    drawn: list[list[tuple[float, float]]] = []
    for key, label in CDF_METRICS:
        enc = histograms.get(key)
        if not enc:
            continue
        pts = [(v / 1000.0, f) for v, f in cdf_points(HdrHistogram.decode(enc.encode("ascii")))]
        if not pts:
            continue
        drawn.append(pts)
        fig.add_trace(
            go.Scatter(
                x=[v for v, _ in pts],
                y=[f for _, f in pts],
                mode="lines",
                name=label,
                line={"shape": "hv"},
                hovertemplate=f"{label}: %{{x:.3f}} ms<br>fraction ≤ x: %{{y:.4f}}<extra></extra>",
            )
        )
    if not fig.data:
        return None
    layout(fig, CDF_TITLE)
    fig.update_layout(hovermode="closest")
    fig.update_xaxes(type="log", title_text="latency (ms, log scale)", range=cdf_axis_range(drawn))
    fig.update_yaxes(range=[0, 1.02], title_text="fraction of requests / gaps ≤ latency")
    return fig


def _filled(series: dict[str, list[Any]], col: str, n: int) -> list[float]:
    out = [0.0] * n
    for t, v in zip(series.get("t", []), series.get(col, []), strict=False):
        if 0 <= int(t) < n:
            out[int(t)] += v
    return out


def throughput_figure(series: dict[str, list[Any]]) -> go.Figure | None:
    """run.json's per-second series: output tokens/s (left axis), completed and failed requests/s (right)."""
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
    layout(fig, THROUGHPUT_TITLE)
    fig.update_xaxes(title_text="time since start (s)")
    fig.update_yaxes(title_text="output tokens/s", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(secondary_y=True, **RIGHT_AXIS, title_text="requests/s")
    return fig


# ---- time series from the record log (buckets of width_s seconds since the first scheduled request) ----


def x_title(width_s: float) -> str:
    per = "second" if width_s == 1 else f"{width_s:g} s bucket"
    return f"time since the first scheduled request (s; one point per {per})"


def log_throughput_figure(series: dict[str, list[Any]], width_s: float, title: str) -> go.Figure | None:
    """Output tokens/s (left axis) and successful requests/s (right axis) per bucket."""
    x = series.get("t") or []
    if not x:
        return None
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(x=x, y=series["output_tokens_per_s"], name="output tokens/s", mode="lines"),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(x=x, y=series["requests_per_s"], name="successful requests/s", mode="lines"),
        secondary_y=True,
    )
    layout(fig, title)
    fig.update_xaxes(title_text=x_title(width_s))
    fig.update_yaxes(title_text="output tokens/s", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(secondary_y=True, **RIGHT_AXIS, title_text="requests/s")
    return fig


def lines_figure(
    x: Sequence[float],
    traces: Sequence[tuple[str, Sequence[Any]]],
    title: str,
    y_title: str,
    x_label: str,
    unit: str = "",
    log_y: bool = False,
) -> go.Figure | None:
    """Several named lines over one x axis; None when every trace is empty."""
    if not x or not any(any(v is not None for v in ys) for _, ys in traces):
        return None
    fig = go.Figure()
    for name, ys in traces:
        fig.add_trace(
            go.Scatter(
                x=list(x),
                y=list(ys),
                name=name,
                mode="lines",
                connectgaps=False,
                hovertemplate=f"%{{y:.4g}}{(' ' + unit) if unit else ''}",
            )
        )
    layout(fig, title)
    fig.update_xaxes(title_text=x_label)
    fig.update_yaxes(title_text=y_title, type="log" if log_y else "linear", rangemode="tozero")
    return fig


def errors_figure(
    x: Sequence[float],
    by_outcome: dict[str, list[int]],
    widths: Sequence[float],
    width_s: float,
    title: str,
) -> go.Figure | None:
    """Failed (and cancelled) requests per second in each bucket, stacked by outcome class."""
    if not x or not by_outcome:
        return None
    fig = go.Figure()
    for i, (outcome, counts) in enumerate(sorted(by_outcome.items(), key=lambda kv: -sum(kv[1]))):
        fig.add_trace(
            go.Bar(
                x=list(x),
                y=[c / b for c, b in zip(counts, widths, strict=True)],
                name=outcome,
                marker_color=ERROR_COLORS[i % len(ERROR_COLORS)],
                hovertemplate="%{y:.3g} requests/s",
            )
        )
    layout(fig, title)
    fig.update_layout(barmode="stack", bargap=0)
    fig.update_xaxes(title_text=x_title(width_s))
    fig.update_yaxes(title_text="requests/s ending in this class", rangemode="tozero")
    return fig


def _edges(values: list[np.ndarray]) -> tuple[np.ndarray, bool]:
    """Shared bin edges for the given samples: log-spaced when they span a wide range."""
    allv = np.concatenate([v[~np.isnan(v)] for v in values]) if values else np.zeros(0)
    lo, hi = (float(allv.min()), float(allv.max())) if allv.size else (0.0, 1.0)
    if lo >= 1 and hi / lo > 20:
        return np.unique(np.round(np.geomspace(lo, hi + 1, MAX_LENGTH_BINS + 1))), True
    step = max(1.0, np.ceil((hi + 1 - lo) / MAX_LENGTH_BINS))
    return np.arange(lo, hi + step + 1, step), False


def _step_trace(v: np.ndarray, edges: np.ndarray, name: str, dash: str | None) -> go.Scatter:
    v = v[~np.isnan(v)]
    counts, _ = np.histogram(v, bins=edges)
    frac = counts / max(v.size, 1)
    return go.Scatter(
        x=edges.tolist(),
        y=[*frac.tolist(), 0.0],
        name=f"{name} (n={v.size:,})",
        mode="lines",
        line={"shape": "hv", "dash": dash},
        hovertemplate="from %{x:.0f} tokens: %{y:.2%}<extra>" + name + "</extra>",
    )


def lengths_figure(
    panels: Sequence[tuple[str, Sequence[tuple[str, np.ndarray]]]], title: str
) -> go.Figure | None:
    """Side-by-side step histograms (fraction of requests per token-length bin), one panel per quantity."""
    panels = [(t, [(n, v) for n, v in tr if v.size]) for t, tr in panels]
    panels = [(t, tr) for t, tr in panels if tr]
    if not panels:
        return None
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _ in panels])
    for col, (_, traces) in enumerate(panels, start=1):
        edges, log_x = _edges([v for _, v in traces])
        for i, (name, v) in enumerate(traces):
            fig.add_trace(_step_trace(v, edges, name, None if i == 0 else "dash"), row=1, col=col)
        fig.update_xaxes(
            title_text="tokens" + (" (log scale)" if log_x else ""),
            type="log" if log_x else "linear",
            row=1,
            col=col,
        )
        fig.update_yaxes(
            title_text="fraction of requests", tickformat=".0%", rangemode="tozero", row=1, col=col
        )
    layout(fig, title)
    fig.update_layout(hovermode="closest", legend={"y": -0.25, "yanchor": "top", "x": 0.0, "xanchor": "left"})
    fig.update_layout(margin={"b": 110})
    return fig


def token_diff_figure(diffs: dict[str, list[int]], labels: list[str], title: str) -> go.Figure | None:
    """Requests by (server usage − client tokenizer) token count difference, output and input."""
    if not any(sum(v) for v in diffs.values()):
        return None
    fig = go.Figure()
    for key, counts in diffs.items():
        fig.add_trace(
            go.Bar(
                x=labels, y=counts, name=f"{key} tokens", hovertemplate="%{y:,} requests<extra>%{x}</extra>"
            )
        )
    layout(fig, title)
    fig.update_layout(barmode="group", hovermode="closest")
    fig.update_xaxes(title_text="server usage − client tokenizer (tokens per request)", type="category")
    fig.update_yaxes(title_text="requests (log scale)", type="log")
    return fig


TELEMETRY_PANELS: tuple[tuple[str, tuple[tuple[str, str], ...], str, float], ...] = (
    (
        "Requests in the engine",
        (("requests_running", "running"), ("requests_waiting", "waiting")),
        "requests",
        1.0,
    ),
    (
        "Cache use",
        (("kv_cache_usage", "KV cache used"), ("prefix_cache_hit_rate", "prefix cache hit rate")),
        "percent",
        100.0,
    ),
    (
        "Token rates",
        (("generation_tokens_per_s", "generation"), ("prompt_tokens_per_s", "prompt")),
        "tokens/s",
        1.0,
    ),
    ("Preemptions", (("preemptions", "preemptions per interval"),), "preemptions", 1.0),
    ("GPU utilization (dcgm-exporter)", (("gpu_utilization", "GPU utilization, mean"),), "percent", 100.0),
    ("GPU power (dcgm-exporter)", (("gpu_power_w", "power, all GPUs"),), "W", 1.0),
)


def telemetry_figure(tel: Telemetry, title: str) -> go.Figure | None:
    """The server's own metrics over the run, one panel per kind (only panels with data)."""
    t, series = tel.t, tel.series

    def has(key: str) -> bool:
        return any(v is not None for v in (series.get(key) or []))

    panels = [p for p in TELEMETRY_PANELS if any(has(k) for k, _ in p[1])]
    if not t or not panels:
        return None
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        subplot_titles=[p[0] for p in panels],
        vertical_spacing=0.08,
    )
    for row, (_, keys, unit, scale) in enumerate(panels, start=1):
        for key, name in keys:
            if not has(key):
                continue
            ys = [None if v is None else v * scale for v in series[key]]
            fig.add_trace(
                go.Scatter(
                    x=list(t),
                    y=ys,
                    name=name,
                    mode="lines",
                    connectgaps=False,
                    hovertemplate=f"%{{y:.4g}} {unit}",
                ),
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="time since the run started (s)", row=len(panels), col=1)
    layout(fig, title, height=240 * len(panels) + 120)
    fig.update_layout(legend={"y": -0.04, "yanchor": "top", "x": 0.0, "xanchor": "left"}, margin={"b": 120})
    return fig


def figure_html(fig: go.Figure) -> str:
    """A figure as an HTML fragment that uses the inline plotly.js loaded once in the page."""
    return fig.to_html(full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG, default_width="100%")
