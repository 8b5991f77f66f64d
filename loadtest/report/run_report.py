"""Render a run folder (run.json plus its record log) into one self-contained, offline, printable report.html."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import msgspec
from markupsafe import Markup

from loadtest.contracts.capture_line import CaptureLine
from loadtest.contracts.run_document import RunDocument, read_run_document, to_data
from loadtest.economics.html import extra_sections
from loadtest.fmt import NA, fmt_int, fmt_ms, fmt_num, fmt_pct, short_hash
from loadtest.metrics.samples import LatencySamples
from loadtest.metrics.verdict import headline
from loadtest.report import charts, facts
from loadtest.report import run_sections as sections
from loadtest.report.quality import load_samples, quality_sections
from loadtest.results.log_stats import LogSummary, summarize_log
from loadtest.results.mlperf_detail import write_loadgen_logs
from loadtest.results.record_log import record_files

REPORT_NAME = "report.html"
TEMPLATE = "run_report.html.j2"
_LATENCY_COLS: tuple[tuple[str, str], ...] = (
    ("mean", "mean"),
    ("p50", "p50"),
    ("p90", "p90"),
    ("p95", "p95"),
    ("p99", "p99"),
    ("p99_9", "p99.9"),
    ("max", "max"),
)


def template_env() -> jinja2.Environment:
    """The jinja2 environment of the report templates: autoescaped, strict, trimmed blocks."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _env() -> jinja2.Environment:
    env = template_env()
    env.filters.update(ms=fmt_ms, num=fmt_num, int=fmt_int, pct=fmt_pct)
    return env


def _summary_rows(run: RunDocument) -> list[tuple[str, str, str]]:
    """(label, value, title attribute) rows of the run-details table."""
    req, thr, tok = run.metrics.requests, run.metrics.throughput, run.metrics.tokens
    cfg, fp = run.config, run.workload.fingerprint
    # The counts the figures use (server usage where sent).
    out_t, in_t = tok.counted_output_total, tok.counted_input_total
    return [
        ("Requests completed", fmt_int(req.completed), ""),
        ("OK", fmt_int(req.ok), ""),
        ("Failed", fmt_int(req.failed), ""),
        ("Cancelled", fmt_int(req.cancelled), ""),
        ("Skipped arrivals", fmt_int(req.skipped_arrivals), "open-loop arrivals over max_in_flight"),
        ("Error rate", fmt_pct(req.error_rate), "failed / (completed − cancelled)"),
        ("Duration", f"{fmt_num(run.metrics.window.duration_s, 1)} s", ""),
        ("Output tokens/s", fmt_num(thr.output_tokens_per_s, 1), ""),
        ("Input tokens/s", fmt_num(thr.input_tokens_per_s, 1), ""),
        ("Requests/s", fmt_num(thr.requests_per_s, 3), "successful requests per second"),
        (
            "TPS per user",
            "not measurable (merged delivery)"
            if facts.delivery_diagnosis(run)
            else fmt_num(thr.tps_per_user, 1),
            "1000 / p90 TPOT (ms)",
        ),
        ("Total tokens", f"{fmt_int(out_t + in_t)} ({fmt_int(out_t)} output + {fmt_int(in_t)} input)", ""),
        ("Load", facts.load_text(run), ""),
        ("Seed", str(cfg.seed), ""),
        ("Processes", str(cfg.processes), ""),
        ("Model", cfg.model or NA, ""),
        ("API", cfg.api or NA, ""),
        ("Tokenizer", cfg.tokenizer or NA, ""),
        ("Endpoint", facts.endpoint_text(run), ""),
        ("Tool", f"{run.tool.name} {run.tool.version}".strip(), ""),
        ("Workload fingerprint", short_hash(fp), fp or ""),
        ("Profile file", cfg.profile_path or NA, ""),
        ("Created", run.created or NA, ""),
    ]


def _latency_rows(run: RunDocument) -> list[dict[str, Any]]:
    rows = []
    for key, label, definition in facts.LATENCY_ROWS:
        s = facts.latency_stats(run, key)
        unmeasurable = facts.not_measurable(run, key)  # tokens arrived merged: the cells time a buffer
        rows.append(
            {
                "label": label,
                "definition": f"{definition} {unmeasurable}" if unmeasurable else definition,
                "count": fmt_int(facts.stat(s, "count") or 0),
                "cells": ["n/m" if unmeasurable else fmt_ms(facts.stat(s, k)) for k, _ in _LATENCY_COLS],
            }
        )
    return rows


def _token_rows(run: RunDocument) -> dict[str, Any]:
    tok = run.metrics.tokens
    return {
        "has_usage": bool(tok.usage_reports),
        "usage_reports": fmt_int(tok.usage_reports),
        "rows": [
            ("Output tokens", fmt_int(tok.output_total), fmt_int(tok.usage_output_total)),
            ("Input tokens", fmt_int(tok.input_total), fmt_int(tok.usage_input_total)),
        ],
        "reasoning": fmt_int(tok.reasoning_total),
        "cached": fmt_int(tok.usage_cached_total),
        "mismatched": fmt_int(tok.mismatched_requests),
        "counted_by": run.tokens.description if run.tokens is not None else None,
    }


def _outcome_rows(run: RunDocument) -> list[dict[str, Any]]:
    samples = run.metrics.error_samples
    return [
        {"outcome": o, "count": fmt_int(n), "samples": list(samples.get(o, []))}
        for o, n in facts.nonzero_outcomes(run)
    ]


def _log_info(run_dir: Path | None, paths: list[Path], log: LogSummary | None) -> str:
    if log is None:
        where = f" in {run_dir}" if run_dir else ""
        return f"No record log found{where}: the sections drawn from it are empty."
    names = ", ".join(p.name for p in paths)
    skipped = f"; {log.skipped_lines:,} unreadable or cut line(s) skipped" if log.skipped_lines else ""
    return f"{log.records:,} records read from {names}{skipped}."


def _context(
    run: RunDocument,
    log: LogSummary | None,
    log_info: str,
    samples: Sequence[CaptureLine] = (),
    judged: LatencySamples | None = None,
) -> dict[str, Any]:
    cfg = run.config
    cdf = charts.latency_cdf_figure(run.histograms)
    cdf_chart = sections.Chart(
        "latency-cdf",
        charts.CDF_TITLE + " (ms, log scale)",
        "Cumulative distribution of TTFT, ITL, TPOT and end-to-end latency over successful requests: for "
        "each latency on the x axis (milliseconds, log scale) the y axis gives the fraction of requests "
        "(for ITL, of inter-chunk gaps) that finished at or below it, from 0 to 1.",
        sections.html(cdf),
        "No data: no successful streamed request produced latency samples.",
    )
    series = sections.time_series_charts(run, log)
    lengths = sections.lengths_section(run, log)
    token_chart = sections.token_chart(log)
    telemetry = sections.telemetry_section(run)
    all_charts = [cdf_chart, *series, lengths["chart"], token_chart]
    if telemetry:
        all_charts.append(telemetry["chart"])
    resolved = cfg.profile_resolved or msgspec.to_builtins(cfg)
    return {
        "profile": cfg.profile or "run",
        "run_id": run.run_id or "",
        "interrupted": facts.is_interrupted(run),
        "status": facts.status_text(run),
        "cards": sections.headline_cards(run),
        "headline": sections.headline_latency(run, judged),
        "judged_label": facts.judged_label(run),
        "whole_run_label": facts.whole_run_label(run),
        "has_window": run.judged is not None,
        "summary_rows": _summary_rows(run),
        "latency_cols": [label for _, label in _LATENCY_COLS],
        "latency_rows": _latency_rows(run),
        "cdf_chart": cdf_chart,
        "series_charts": series,
        "scenario_rows": sections.scenario_rows(run),
        "scenario_names": [s.name for s in cfg.scenarios],
        "outcomes": _outcome_rows(run),
        "error_classes": sections.error_class_rows(log),
        "has_log": log is not None,
        "lengths": lengths,
        "tokens": _token_rows(run),
        "token_chart": token_chart,
        "telemetry": telemetry,
        "server_latency": sections.server_latency_section(run),
        "warm_cache": facts.warm_warning(run),
        "prefix_cache_text": sections.prefix_cache_text(run),
        "endpoints_window": sections.endpoints_window_section(run),
        "extra_sections": _extra_sections(run)
        + quality_sections(run, samples)
        + [s for s in (sections.connections_section(run),) if s],
        "engine_json": sections.engine_json(run),
        "notes": list(run.notes),
        "log_info": log_info,
        "config_json": json.dumps(resolved, indent=2, sort_keys=True, default=str, ensure_ascii=False),
        "plotly_js": Markup(charts.plotly_js()) if any(c and c.html for c in all_charts) else None,
    }


def _extra_sections(run: RunDocument) -> list[dict[str, Any]]:
    """Cost and per-endpoint sections (loadtest.economics.html, which reads run.json as JSON); none when
    the run lacks their inputs."""
    return extra_sections(to_data(run))


VERDICT_LABELS = {
    "pass": "PASS",
    "slo_missed": "SLO MISSED",
    "invalid": "RUN INVALID",
    "error_rate": "ENDPOINT FAILING",  # exit 12: no success, error rate over its limit, or stopped early
    "quality_failed": "QUALITY FAILED",  # exit 13: the answers failed the quality gate (quality_min)
}


def verdict_reasons(run: RunDocument) -> list[str]:
    """The verdict's reasons; an interrupted run says so first."""
    reasons = list(run.verdict.reasons) if run.verdict is not None else []
    if facts.is_interrupted(run):
        reasons.insert(0, facts.status_text(run))
    return reasons


def tested_rows(run: RunDocument) -> list[tuple[str, str]]:
    """What was tested, for the report's first screen: endpoint, model, load, how long, when, the tool."""
    cfg, req = run.config, run.metrics.requests
    ran = f"{fmt_num(run.metrics.window.duration_s, 1)} s, {fmt_int(req.completed)} requests"
    ran += " (whole run)" if run.judged is not None else ""
    rows = [
        ("Endpoint", facts.endpoint_text(run)),
        ("Model", cfg.model or NA),
        ("Load", facts.load_text(run)),
        ("Ran", ran + ("" if not facts.is_interrupted(run) else " (interrupted)")),
        ("API", cfg.api or NA),
        ("Date", created_text(run.created)),
    ]
    merged = facts.delivery_diagnosis(run)
    if merged:  # what stands between client and server changes what every other figure means
        rows.insert(1, ("Delivery", merged))
    return rows


def created_text(created: str | None) -> str:
    """run.json's ``created`` (``2026-11-30T12:15:00Z``) as ``2026-11-30 12:15 UTC``."""
    if not created:
        return NA
    try:
        when = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return created
    return when.strftime("%Y-%m-%d %H:%M UTC")


def render_html(
    run: RunDocument,
    log: LogSummary | None = None,
    log_info: str = "",
    samples: Sequence[CaptureLine] = (),
    judged: LatencySamples | None = None,
) -> str:
    """The report page for a run.json document and (optionally) its summarized record log, captured
    samples and the judged window's exact latency samples (its early-stopping estimates)."""
    verdict = run.verdict
    label = VERDICT_LABELS.get(verdict.status, verdict.status) if verdict else ""
    if verdict and facts.is_interrupted(run):
        label = f"INTERRUPTED · {label}"
    return (
        _env()
        .get_template(TEMPLATE)
        .render(
            **_context(run, log, log_info or _log_info(None, [], log), samples, judged),
            verdict=verdict,
            verdict_label=label,
            verdict_headline=headline(verdict.status, verdict.checks) if verdict else "",
            failed_checks=sum(1 for c in verdict.checks if not c.passed) if verdict else 0,
            tested=tested_rows(run),
            verdict_reasons=verdict_reasons(run),
            goodput_text=sections.goodput_text(run),
            conversations_text=sections.conversations_text(run),
            conversations_rows=sections.conversations_rows(run),
            agentic_accuracy_text=sections.agentic_accuracy_text(run),
            judged_text=sections.judged_text(run),
        )
    )


def log_paths(run_dir: Path, run: RunDocument) -> list[Path]:
    """The run's record logs: those run.json names that exist, else every records*.jsonl in the folder."""
    named = [run_dir / Path(n).name for n in run.files.records]
    found = [p for p in named if p.is_file()]
    return found or record_files(run_dir)


def load_log(run_dir: Path, run: RunDocument) -> tuple[LogSummary | None, str]:
    """The summarized record log (None when the folder has none) and a line saying what was read."""
    paths = log_paths(run_dir, run)
    if not paths:
        return None, _log_info(run_dir, paths, None)
    log = summarize_log(paths, run.metrics.window.first_scheduled, sections.series_width(run))
    return log, _log_info(run_dir, paths, log)


def render_run_report(run_dir: Path) -> Path:
    """Write ``run_dir/report.html`` and ``run_dir/mlperf_log_summary.txt`` from run.json (read through
    loadtest/contracts/run_document.py) and the record log; return the report's path."""
    run_dir = Path(run_dir)
    run = read_run_document(run_dir)
    log, info = load_log(run_dir, run)
    out = run_dir / Path(run.files.report or REPORT_NAME).name
    judged = sections.judged_samples(run, log_paths(run_dir, run))
    out.write_text(render_html(run, log, info, load_samples(run_dir), judged), encoding="utf-8")
    write_loadgen_logs(run_dir, run, log.samples if log is not None else None)
    return out
