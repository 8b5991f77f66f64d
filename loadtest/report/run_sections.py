"""The run report's sections as template data: headline, charts with captions, tables from run.json and the log."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from markupsafe import Markup
from pydantic import TypeAdapter, ValidationError

from loadtest.contracts.run_document import RunDocument
from loadtest.fmt import NA, fmt_int, fmt_ms, fmt_num, fmt_pct
from loadtest.metrics import early_stopping as es
from loadtest.metrics import hdr
from loadtest.metrics.samples import EXACT_METRICS, LatencySamples
from loadtest.metrics.window import stands
from loadtest.profile.dists import Length
from loadtest.report import charts, facts
from loadtest.results.log_stats import LogSummary
from loadtest.results.percentiles import HEADLINE_METRICS, decode, percentile_table
from loadtest.results.record_log import read_lines
from loadtest.workload.lengths import sample_length

MAX_SERIES_POINTS = 1200
MAX_PROFILE_DRAWS = 20_000
MAX_ERROR_ROWS = 50
SAMPLE_BATCH = 10_000  # record-log lines per batch of the judged window's samples
_LENGTH = TypeAdapter(Length)


@dataclass
class Chart:
    """One chart of the page: a title with units, the figure (or why there is none) and a caption."""

    id: str
    title: str
    caption: str
    html: Markup | None = None
    nodata: str = "No data."


def series_width(run: RunDocument) -> float:
    """Bucket width (s) for time series: 1 s, coarser for long runs so a chart holds ≤ MAX_SERIES_POINTS."""
    duration = run.metrics.window.duration_s
    return float(max(1, math.ceil(duration / MAX_SERIES_POINTS)))


def html(fig: Any) -> Markup | None:
    """The figure for the page, whose heading carries the title (the chart keeps its axis titles)."""
    if fig is None:
        return None
    fig.update_layout(title=None, margin={"t": 40})
    return Markup(charts.figure_html(fig))


# ---- headline ----


def headline_cards(run: RunDocument) -> list[tuple[str, str, str]]:
    """(label, value, note) for the numbers at the top of the page: the judged window's."""
    judged = run.judged_metrics()
    req, thr, gp = judged.requests, judged.throughput, run.goodput
    duration = run.judged.window.duration_s if run.judged is not None else run.metrics.window.duration_s
    cards = [
        (
            "Output tokens/s",
            fmt_num(thr.output_tokens_per_s, 1),
            "client tokenizer, successful requests",
        ),
        ("Requests/s", fmt_num(thr.requests_per_s, 3), "successful requests per second"),
    ]
    if gp is not None:
        cards += [
            (
                "Goodput",
                f"{fmt_num(gp.good_requests_per_s, 3)} req/s",
                f"{fmt_num(gp.good_output_tokens_per_s, 1)} good output tokens/s",
            ),
            (
                "SLO attainment",
                fmt_pct(gp.attainment),
                f"{fmt_int(gp.good)} of {fmt_int(gp.judged)} requests good",
            ),
        ]
    else:
        cards += [
            ("Goodput", NA, "no per-request TTFT/TPOT SLO"),
            ("SLO attainment", NA, "no per-request SLO"),
        ]
    cards += [
        (
            "Error rate",
            fmt_pct(req.error_rate),
            f"{fmt_int(req.failed)} failed of {fmt_int(req.completed)}",
        ),
        (
            "Duration",
            f"{fmt_num(duration, 1)} s",
            "the judged window" if run.judged is not None else "first scheduled request to last answer",
        ),
    ]
    return cards


def headline_latency(run: RunDocument, samples: LatencySamples | None = None) -> dict[str, Any]:
    """TTFT/TPOT/ITL/E2E at p50/p90/p99/p99.9 of the judged window (run.json's judged figures, the whole
    run's when no window was set) and the early-stopping estimate, in ms; ITL and TPOT ``n/m`` when the
    tokens arrived merged (metrics/delivery.py). ``samples``: the judged
    window's exact samples, for its estimates (without them, and for ITL, a window has none)."""
    rows = []
    pcts: list[float] = []
    for key, label in HEADLINE_METRICS:
        table = percentile_table(decode(run, key))
        summary = facts.judged_latency_stats(run, key)
        count = int(facts.stat(summary, "count") or 0)
        pcts = [c["p"] for c in table]
        cells = []
        for c in table:
            est_ms: float | None
            if run.judged is None:
                est_ms = None if c["estimate_us"] is None else c["estimate_us"] / 1000
            elif samples is not None and key in EXACT_METRICS:
                est_us = samples.estimate(key, c["p"] / 100.0)
                est_ms = None if est_us is None else est_us / 1000
            else:
                est_ms = None
            needs = es.min_queries_for_percentile(c["p"] / 100.0)
            cells.append(
                {
                    "value": fmt_ms(facts.stat(summary, hdr.percentile_key(c["p"]))),
                    "estimate": fmt_ms(est_ms) if est_ms is not None else None,
                    "needs": needs if count and count < needs else None,
                }
            )
        if facts.not_measurable(run, key):  # tokens arrived merged: the cells would time a proxy's buffer
            label = f"{label} (not measurable: merged delivery)"
            cells = [{"value": "n/m", "estimate": None, "needs": None} for _ in cells]
        rows.append({"label": label, "count": fmt_int(count), "cells": cells})
    return {"cols": [f"p{p:g}" for p in pcts], "rows": rows}


def judged_samples(run: RunDocument, paths: list[Path]) -> LatencySamples | None:
    """The exact TTFT, TPOT and E2E samples of the requests scheduled in the judged window, from the
    record log (None when the whole run is judged)."""
    if run.judged is None or not paths:
        return None
    w, samples, batch = run.judged.window, LatencySamples(), []
    for line in read_lines(paths):
        if w.start <= line.t < w.end:
            batch.append(line)
            if len(batch) >= SAMPLE_BATCH:
                samples.add(batch)
                batch = []
    samples.add(batch)
    return samples


def goodput_text(run: RunDocument) -> str | None:
    """SLO attainment and goodput in one sentence (None without a per-request SLO)."""
    gp = run.goodput
    if gp is None:
        return None
    limits = ", ".join(f"{name} ≤ {fmt_num(ms, 1)} ms" for name, ms in facts.goodput_limits(gp.rule))
    return (
        f"SLO attainment {fmt_pct(gp.attainment)} of {fmt_int(gp.judged)} requests"
        f"{f' ({limits})' if limits else ''}; goodput {fmt_num(gp.good_requests_per_s, 3)} req/s, "
        f"{fmt_num(gp.good_output_tokens_per_s, 1)} output tokens/s."
    )


def conversations_text(run: RunDocument) -> str | None:
    """The per-conversation figures in one sentence (None for a run without sessions)."""
    c = run.conversations
    if c is None:
        return None
    text = f"Conversations: {fmt_int(c.completed)} of {fmt_int(c.started)} completed"
    if c.per_s is not None:
        text += f", {fmt_num(c.per_s, 3)} per second"
    if c.latency_s is not None:
        text += f"; latency p50 {fmt_num(c.latency_s['p50'], 2)} s, p99 {fmt_num(c.latency_s['p99'], 2)} s"
    if c.calls_per_conversation is not None:
        text += f"; {fmt_num(c.calls_per_conversation['mean'], 1)} calls each"
    if c.e2e_interactivity is not None:
        text += f"; e2e interactivity {fmt_num(c.e2e_interactivity, 1)} tokens/s"
        if c.e2e_interactivity_with_tool_time is not None:
            text += f" ({fmt_num(c.e2e_interactivity_with_tool_time, 1)} with tool time)"
    if c.slo_attainment is not None:
        text += f"; every call within the SLOs in {fmt_pct(c.slo_attainment)} of {fmt_int(c.judged)} judged"
    return text + "."


def agentic_accuracy_text(run: RunDocument) -> str | None:
    """The MLPerf agentic inline accuracy in one sentence (None for a run without expected answers)."""
    a = run.agentic_accuracy
    if a is None:
        return None
    score = "no call to score" if a.score is None else f"{a.score:.4f}"
    text = (
        f"Agentic accuracy (MLPerf inline): {score} over {fmt_int(a.calls.scored)} scored of "
        f"{fmt_int(a.calls.issued)} recorded calls ({fmt_int(a.calls.answered)} answered)"
    )
    if a.domains:
        text += "; " + ", ".join(
            f"{d} {v.score:.4f} ({fmt_int(v.scored)})" for d, v in sorted(a.domains.items())
        )
    if a.target is not None:
        text += f"; target ≥ {a.target:g}"
    return text + "."


def conversations_rows(run: RunDocument) -> list[tuple[str, str]]:
    """The Conversations section's rows (label, figure; three significant digits), empty without sessions."""
    c = run.conversations
    if c is None:
        return []

    def pcts(d: dict[str, float] | None, unit: str) -> str:
        if d is None:
            return "—"
        return (
            " · ".join(f"{k} {fmt_ms(d[k])}" for k in ("p50", "p90", "p95", "p99", "mean") if k in d) + unit
        )

    tok = " tokens/s"
    return [
        ("started", fmt_int(c.started)),
        ("completed (planned end, every call ok)", fmt_int(c.completed)),
        ("completed per second", fmt_ms(c.per_s)),
        ("latency: first send to last call's end", pcts(c.latency_s, " s")),
        ("calls per conversation", pcts(c.calls_per_conversation, "")),
        ("e2e interactivity, tool time excluded", fmt_ms(c.e2e_interactivity) + tok),
        ("e2e interactivity, tool time included", fmt_ms(c.e2e_interactivity_with_tool_time) + tok),
        (
            "SLO attainment (every call within the SLOs)",
            f"{fmt_pct(c.slo_attainment)} of {fmt_int(c.judged)} judged ({fmt_int(c.good)} good)",
        ),
    ]


def judged_text(run: RunDocument) -> str:
    """What the verdict judged, next to it: the window and its requests (``judged window: 12.0–60.0 s,
    1,043 requests``), or once that the whole run is judged."""
    if run.judged is None:
        return f"{_sentence(facts.judged_label(run))}; the figures below are the verdict's."
    w = run.judged.window
    auto = ", steady state detected" if w.automatic else ""
    return (
        f"{_sentence(facts.judged_label(run))} (warm-up {fmt_num(w.warmup_s, 1)} s, cool-down "
        f"{fmt_num(w.cooldown_s, 1)} s{auto}): the headline numbers below are the verdict's figures; "
        f"the whole run's ({facts.whole_run_label(run).removeprefix('whole run: ')}) are labelled “whole run”."
    )


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


# ---- time series ----


def time_series_charts(run: RunDocument, log: LogSummary | None) -> list[Chart]:
    if log is None or not log.records:
        fig = charts.throughput_figure(run.metrics.series)
        return [
            Chart(
                "throughput",
                charts.THROUGHPUT_TITLE + " (tokens/s, requests/s)",
                "From run.json alone (no record log): output tokens per second (left axis) and completed "
                "requests and errors per second (right axis), per wall-clock second since the start.",
                html(fig),
                "No data: no request finished during the run.",
            )
        ]
    s, w, x = log.series, log.width_s, log.series["t"]
    per = "second" if w == 1 else f"{w:g}-second bucket"
    xt = charts.x_title(w)
    no_ok = "No data: no successful streamed request."
    return [
        Chart(
            "throughput",
            "Throughput over time (output tokens/s, requests/s)",
            f"For each {per} since the first scheduled request: output tokens per second counted in the "
            "bucket their chunks arrived in (left axis) and successful requests per second by the bucket "
            "they completed in (right axis). The last bucket's rates use the part of it the run covered.",
            html(charts.log_throughput_figure(s, w, "Throughput over time")),
        ),
        Chart(
            "in-flight",
            "Requests in flight (requests)",
            f"Time-averaged number of requests sent and not yet finished over each {per}: the concurrency "
            "the endpoint actually saw.",
            html(
                charts.lines_figure(x, [("in flight", s["in_flight"])], "Requests in flight", "requests", xt)
            ),
        ),
        Chart(
            "ttft-series",
            "TTFT percentiles over time (ms)",
            f"p50, p90 and p99 time to first token (from the scheduled time) of the successful requests whose "
            f"first token arrived in each {per}; exact percentiles at LoadGen's rank; gaps mean no such request.",
            html(
                charts.lines_figure(
                    x,
                    [(f"TTFT {p}", s[f"ttft_{p}_ms"]) for p in ("p50", "p90", "p99")],
                    "TTFT percentiles over time",
                    "TTFT (ms)",
                    xt,
                    "ms",
                )
            ),
            no_ok,
        ),
        Chart(
            "itl-series",
            "ITL percentiles over time (ms)",
            f"p50, p90 and p99 of the gaps between consecutive token-carrying chunks that arrived in each {per} "
            "(successful requests), from log-spaced bins (each value within ±3 %).",
            html(
                charts.lines_figure(
                    x,
                    [(f"ITL {p}", s[f"itl_{p}_ms"]) for p in ("p50", "p90", "p99")],
                    "ITL percentiles over time",
                    "inter-token latency (ms)",
                    xt,
                    "ms",
                )
            ),
            no_ok,
        ),
        Chart(
            "errors-series",
            "Failed requests over time (requests/s)",
            f"Requests that ended in each {per} with an outcome other than ok, per second and stacked by "
            "outcome class (cancelled requests are those the generator stopped at the end of the run).",
            html(
                charts.errors_figure(x, log.errors_by_outcome, s["bucket_s"], w, "Failed requests over time")
            ),
            "No failed or cancelled request.",
        ),
        Chart(
            "lag-series",
            "Load generator lag over time (ms)",
            f"Schedule lag (send time − scheduled time) of the requests scheduled in each {per}: p50, p99 "
            "and max. A rising lag means the generator, not the endpoint, was falling behind.",
            html(
                charts.lines_figure(
                    x,
                    [
                        ("lag p50", s["schedule_lag_p50_ms"]),
                        ("lag p99", s["schedule_lag_p99_ms"]),
                        ("lag max", s["schedule_lag_max_ms"]),
                    ],
                    "Load generator lag over time",
                    "schedule lag (ms)",
                    xt,
                    "ms",
                )
            ),
            "No request was sent.",
        ),
    ]


# ---- per scenario ----


def scenario_rows(run: RunDocument) -> list[dict[str, Any]]:
    """One row per scenario from run.json's ``scenarios`` (present when the profile mixes several)."""
    declared = {s.name: s for s in run.config.scenarios}
    goodput = (run.goodput.scenarios if run.goodput is not None else None) or {}
    rows = []
    for name, m in run.scenarios.items():
        req, thr, d, gp = m.requests, m.throughput, declared.get(name), goodput.get(name)
        rows.append(
            {
                "name": name,
                "kind": d.kind if d is not None else NA,
                "weight": fmt_num(d.weight, 1) if d is not None else NA,
                "completed": fmt_int(req.completed),
                "ok": fmt_int(req.ok),
                "error_rate": fmt_pct(req.error_rate),
                "rps": fmt_num(thr.requests_per_s, 3),
                "tps": fmt_num(thr.output_tokens_per_s, 1),
                "lat": [
                    f"{fmt_ms(facts.stat(lat, 'p50'))} / {fmt_ms(facts.stat(lat, 'p99'))}"
                    for lat in (m.latency_ms.get(k) for k in ("ttft", "tpot", "e2e"))
                ],
                "attainment": fmt_pct(gp.attainment if gp is not None else None),
            }
        )
    return rows


# ---- errors ----


def error_class_rows(log: LogSummary | None) -> dict[str, Any]:
    if log is None:
        return {"rows": [], "more": 0, "total": 0}
    total = sum(c.count for c in log.error_classes)
    rows = [
        {
            "outcome": c.outcome,
            "status": str(c.status) if c.status else NA,
            "message": c.message,
            "count": fmt_int(c.count),
            "share": fmt_pct(c.count / total) if total else NA,
            "seen": f"{fmt_num(c.first_s, 1)} – {fmt_num(c.last_s, 1)} s",
            "samples": c.samples,
        }
        for c in log.error_classes[:MAX_ERROR_ROWS]
    ]
    return {"rows": rows, "more": max(0, len(log.error_classes) - MAX_ERROR_ROWS), "total": total}


# ---- lengths ----


def _scenario_specs(run: RunDocument) -> dict[str | None, dict[str, Any]]:  # keyed by name (None: unnamed)
    scs = run.config.profile_resolved.get("scenarios") or []
    return {s.get("name"): s for s in scs if isinstance(s, dict)}


def profile_input_draws(run: RunDocument, log: LogSummary) -> dict[str, np.ndarray]:
    """Per single-request scenario: input lengths drawn from the profile's spec, as many as were sent
    (at most MAX_PROFILE_DRAWS in all, keeping the scenarios' proportions)."""
    specs = _scenario_specs(run)
    sent = {name: int(v["input"].size) for name, v in log.lengths.items()}
    total = sum(sent.values())
    scale = min(1.0, MAX_PROFILE_DRAWS / total) if total else 0.0
    seed = run.config.seed
    out = {}
    for name, n in sent.items():
        spec = specs.get(name) or {}
        if spec.get("kind", "chat") != "chat" or not spec.get("input_tokens"):
            continue
        try:
            length = _LENGTH.validate_python(spec["input_tokens"])
        except ValidationError:
            continue
        rng = random.Random(f"report:{seed}:{name}")
        k = max(1, round(n * scale)) if n else 0
        out[name] = np.array([sample_length(length, rng) for _ in range(k)], dtype=np.float64)
    return out


def _stats(v: np.ndarray) -> str:
    v = v[~np.isnan(v)]
    if not v.size:
        return NA
    return f"{np.median(v):,.0f} / {v.mean():,.1f} / {np.percentile(v, 99):,.0f}"


def lengths_section(run: RunDocument, log: LogSummary | None) -> dict[str, Any]:
    if log is None or not log.records:
        return {"chart": None, "rows": []}
    draws = profile_input_draws(run, log)
    specs = _scenario_specs(run)

    def cat(key: str) -> np.ndarray:
        parts = [v[key] for v in log.lengths.values()]
        return np.concatenate(parts) if parts else np.zeros(0)

    drawn = np.concatenate(list(draws.values())) if draws else np.zeros(0)
    fig = charts.lengths_figure(
        [
            (
                "Input tokens per request",
                [("sent (client tokenizer)", cat("input")), ("profile's distribution", drawn)],
            ),
            (
                "Output tokens per successful request",
                [
                    ("received (client tokenizer)", cat("output")),
                    ("requested (max_tokens)", cat("requested")),
                ],
            ),
        ],
        "Input and output lengths against the profile",
    )
    rows = []
    for name, v in log.lengths.items():
        out, req = v["output"], v["requested"]
        both = ~np.isnan(out) & ~np.isnan(req)
        exact = fmt_pct(float(np.mean(out[both] == req[both]))) if both.any() else NA
        kind = (specs.get(name) or {}).get("kind", NA)
        rows.append(
            {
                "name": name,
                "kind": kind,
                "profile_input": _stats(draws[name])
                if name in draws
                else "per turn; context grows"
                if kind in ("multi_turn", "agent", "agent_trace")
                else NA,
                "sent_input": _stats(v["input"]),
                "requested_output": _stats(req),
                "received_output": _stats(out),
                "exact": exact,
            }
        )
    chart = Chart(
        "lengths",
        "Input and output lengths against the profile (tokens)",
        "Left: the input length of every sent request (client tokenizer, chat template included) against "
        "lengths drawn from the profile's input distribution for single-request chat scenarios (sessions "
        "and agents add their growing context, so they have no drawn curve). Right: output tokens received by "
        "each successful request against the max_tokens it asked for. Each curve is the fraction of its "
        "requests per length bin (bins shared within a panel).",
        html(fig),
        "No data: no request was sent.",
    )
    return {"chart": chart, "rows": rows}


# ---- tokens, telemetry, configuration ----


def token_chart(log: LogSummary | None) -> Chart:
    fig = (
        charts.token_diff_figure(log.token_diff, log.token_diff_labels, "Server usage vs client tokenizer")
        if log
        else None
    )
    return Chart(
        "token-diff",
        "Server usage vs client tokenizer (requests per token difference)",
        "For every successful request that carried server usage: the server's count minus the client "
        "tokenizer's, for output tokens and for input tokens (log-scale request counts). A single bar at 0 "
        "means the two agree; differences beyond ±10 tokens are pooled in the end bins.",
        html(fig),
        "No data: the server sent no usage.",
    )


def telemetry_section(run: RunDocument) -> dict[str, Any] | None:
    tel = run.telemetry
    if tel is None:
        return None
    fig = charts.telemetry_figure(tel, "Server telemetry")
    panels = [p[0].lower() for p in charts.TELEMETRY_PANELS]
    return {
        "source": f"{tel.engine or 'unknown engine'} metrics from {tel.url or 'unknown URL'}, "
        f"every {fmt_num(tel.interval_s, 1)} s",
        "chart": Chart(
            "telemetry",
            "Server telemetry (requests, percent, tokens/s, preemptions)",
            "The engine's own metrics, polled during the run: " + ", ".join(panels) + " (panels without "
            "data are left out; gaps are polls the engine did not answer). Preemptions are counted per "
            "polling interval.",
            html(fig),
            "No data: the telemetry block holds no values.",
        ),
        "replicas": replica_rows(tel.replicas or []),
    }


# (run.json telemetry.replicas[] key, column, formatter): one row per replica, side by side
REPLICA_COLUMNS = (
    ("requests", "requests", fmt_int),
    ("generation_tokens_per_s", "output tok/s", fmt_num),
    ("prompt_tokens_per_s", "input tok/s", fmt_num),
    ("prefix_cache_hit_rate", "prefix-cache hit rate", fmt_pct),
    ("kv_cache_usage_mean", "KV usage (mean)", fmt_pct),
    ("kv_cache_usage_max", "KV usage (max)", fmt_pct),
    ("requests_running_mean", "running (mean)", fmt_num),
    ("requests_waiting_mean", "waiting (mean)", fmt_num),
)


def replica_rows(replicas: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The per-replica table of the telemetry section (each polled replica's own figures and the sum of
    its requests and token rates); None for a single metrics URL."""
    if len(replicas) < 2:
        return None
    rows = [
        {"url": r.get("url", ""), "cells": [fmt(r.get(key)) for key, _, fmt in REPLICA_COLUMNS]}
        for r in replicas
    ]
    summed = ("requests", "generation_tokens_per_s", "prompt_tokens_per_s")
    total = []
    for key, _, fmt in REPLICA_COLUMNS:
        values = [r.get(key) for r in replicas]
        known = [v for v in values if v is not None]
        total.append(fmt(sum(known)) if key in summed and known else "")
    return {"columns": [label for _, label, _ in REPLICA_COLUMNS], "rows": rows, "total": total}


def engine_json(run: RunDocument) -> str | None:
    engine = run.endpoint.engine
    return json.dumps(engine, indent=2, sort_keys=True, default=str, ensure_ascii=False) if engine else None


# ---- server-side vs client-side latency, prefix cache ----

# (client metric, server metric, label): the client's HDR figures against the server's histograms
SERVER_VS_CLIENT = (
    ("ttft", "ttft", "TTFT"),
    ("ttft_send", "ttft", "TTFT (from send)"),
    ("itl", "itl", "ITL"),
    ("tpot", "tpot", "TPOT"),
    ("e2e", "e2e", "E2E"),
)
SERVER_PHASES = (("queue", "Queue time"), ("prefill", "Prefill time"), ("decode", "Decode time"))
SERVER_PCTS = ("p50", "p90", "p99")


def server_cell(s: dict[str, Any], key: str) -> tuple[str, str, str]:
    """(value, hover text, bucket bounds) of one bucket-interpolated server percentile; a rank in the
    first bucket reads as ``≤ bound``, past the last finite bound as ``> bound``."""
    v, below, above = facts.server_percentile(s, key)
    bucket = facts.server_bucket(s, key) or ""
    if above is not None:
        return f"> {fmt_ms(above)}", f"in the +Inf bucket (above {fmt_ms(above)} ms)", bucket
    if below is not None:
        return (
            f"≤ {fmt_ms(below)}",
            f"in the first bucket (0–{fmt_ms(below)} ms): finer than the histogram",
            bucket,
        )
    if v is None:
        return NA, "", ""
    return fmt_ms(v), f"bucket {bucket} ms", bucket


def server_latency_section(run: RunDocument) -> dict[str, Any] | None:
    """The server-side vs client-side table (client percentiles, the server's bucket-interpolated ones
    with their bucket, client − server signed only beyond the bucket's width), the judged window's on
    both sides when the server has them, and the server-only phases; None when run.json has no server
    histograms."""
    tel = run.telemetry
    sl = facts.server_latency(run)
    metrics, judged = facts.server_judged(run)
    if tel is None or not metrics:
        return None
    rows = []
    for ckey, skey, label in SERVER_VS_CLIENT:
        srv = metrics.get(skey)
        if not srv:
            continue
        cli = facts.judged_latency_stats(run, ckey) if judged else facts.latency_stats(run, ckey)
        rows.append(
            {
                "label": label,
                "name": srv.get("name", ""),
                "counts": f"{fmt_int(facts.stat(cli, 'count') or 0)} / {fmt_int(srv.get('count'))}",
                "client": [fmt_ms(facts.stat(cli, p)) for p in SERVER_PCTS],
                "server": [server_cell(srv, p) for p in SERVER_PCTS],
                "diff": [facts.server_difference(facts.stat(cli, p), srv, p) or NA for p in SERVER_PCTS],
            }
        )
    phases = [
        {
            "label": label,
            "name": metrics[key].get("name", ""),
            "count": fmt_int(metrics[key].get("count")),
            "mean": fmt_ms(metrics[key].get("mean_ms")),
            "server": [server_cell(metrics[key], p) for p in SERVER_PCTS],
        }
        for key, label in SERVER_PHASES
        if metrics.get(key)
    ]
    span = (sl.get("judged") or {}) if judged else sl
    where = "the judged window" if judged else "the whole run"
    return {
        "rows": rows,
        "phases": phases,
        "source": f"{tel.engine or 'unknown engine'} histograms from {tel.url or 'unknown URL'}, "
        f"{fmt_num(span.get('from_s'), 1)} s to {fmt_num(span.get('to_s'), 1)} s since the load started "
        f"({where}; the client's figures are {where}'s too)",
        "judged": judged,
    }


def prefix_cache_text(run: RunDocument) -> str | None:
    """The run's prefix-cache hit rate and where it came from, in one line (None when unknown)."""
    pc = run.prefix_cache
    if pc is None or pc.hit_rate is None:
        return None
    expected = f"; the profile expects reuse ({pc.expected_reuse})" if pc.expected_reuse else ""
    return f"Prefix-cache hit rate {fmt_pct(pc.hit_rate)} of prompt tokens ({pc.source}){expected}."


def endpoints_window_section(run: RunDocument) -> dict[str, Any] | None:
    """The "MLPerf Endpoints reporting window" rows: status, verdict, bounds, passes, system_tps beside ``total``."""
    w = run.reporting_window
    if w is None:
        return None
    total = run.metrics.throughput.output_tokens_per_s
    start = run.metrics.window.first_scheduled or 0.0
    bounds = (
        f"{w.start - start:,.1f} s – {w.end - start:,.1f} s after the first scheduled request "
        f"(super-passes {w.first_super_pass}–{(w.first_super_pass or 0) + w.passes - 1})"
        if w.start is not None and w.end is not None
        else NA
    )
    rows = [
        ("Status", w.status),
        ("Verdict", w.verdict + (f" ({w.reason})" if w.reason else "")),
        ("Window (issue time)", bounds),
        (
            "Duration",
            NA if w.duration_s is None else f"{w.duration_s:,.1f} s (minimum {w.min_duration_s:g} s)",
        ),
        (
            "Super-passes",
            f"{w.passes} in the window of {w.super_passes} issued ({fmt_int(w.super_pass_size)} requests each, "
            f"the first {w.warmup_super_passes} cropped as ramp)",
        ),
        ("system_tps: window / total", f"{fmt_num(w.system_tps)} / {fmt_num(total)}"),
    ]
    if w.level_shift_at is not None:
        rows.append(("Level shift", f"at super-pass {w.level_shift_at}: TPOT {w.level_shift_pct:+.1f} %"))
    return {"rows": rows, "uses": "window" if stands(w.status, w.verdict) else "total"}


_CONNECTION_ROWS = (
    ("dns_ms", "name resolution"),
    ("connect_ms", "TCP connect"),
    ("tunnel_ms", "proxy tunnel (CONNECT)"),
    ("tls_ms", "TLS handshake"),
    ("headers_ms", "send → response headers"),
)


def connections_section(run: RunDocument) -> dict[str, Any] | None:
    """How requests reached the server: connections opened and reused, each phase's p50 / p99 / max
    (run.json ``metrics.connections``); None when the run sent nothing."""
    c = run.metrics.connections if run.metrics is not None else None
    if c is None or not c.requests:
        return None
    rows = []
    for key, label in _CONNECTION_ROWS:
        f = getattr(c, key)
        if f.get("p50") is None:
            continue
        cells = "".join(f"<td>{fmt_ms(f.get(q))}</td>" for q in ("p50", "p99", "max"))
        rows.append(f"<tr><th scope='row'>{Markup.escape(label)}</th>{cells}</tr>")
    lead = (
        f"<p class='sub'>{fmt_int(c.requests)} requests: {fmt_int(c.opened)} opened a connection, "
        f"{fmt_int(c.reused)} went on a kept-alive one ({fmt_pct(c.reused / c.requests)}).</p>"
    )
    table = (
        "<table class='small'><tr><th></th><th>p50</th><th>p99</th><th>max</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    return {"id": "connections", "title": "Connections", "html": Markup(lead + table)}
