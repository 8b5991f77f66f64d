"""Render a run folder (run.json plus its record log) into one self-contained, offline, printable report.html."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from loadtest.economics.html import extra_sections
from loadtest.fmt import NA, fmt_int, fmt_ms, fmt_num, fmt_pct, short_hash
from loadtest.report import charts, facts
from loadtest.report import run_sections as sections
from loadtest.results.log_stats import LogSummary, summarize_log
from loadtest.results.mlperf_summary import write_summary
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


def _summary_rows(run: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, value, title attribute) rows of the run-details table."""
    m = facts.metrics_of(run)
    req, thr, tok = m.get("requests", {}), m.get("throughput", {}), m.get("tokens", {})
    cfg, tool = facts.section(run, "config"), facts.section(run, "tool")
    fp = facts.section(run, "workload").get("fingerprint")
    # The counts the figures use (server usage where sent); older run.json files have the client's only.
    out_t = tok.get("counted_output_total", tok.get("output_total"))
    in_t = tok.get("counted_input_total", tok.get("input_total"))
    total = (out_t or 0) + (in_t or 0) if out_t is not None or in_t is not None else None
    return [
        ("Requests completed", fmt_int(req.get("completed")), ""),
        ("OK", fmt_int(req.get("ok")), ""),
        ("Failed", fmt_int(req.get("failed")), ""),
        ("Cancelled", fmt_int(req.get("cancelled")), ""),
        (
            "Skipped arrivals",
            fmt_int(req.get("skipped_arrivals") or 0),
            "open-loop arrivals over max_in_flight",
        ),
        ("Error rate", fmt_pct(req.get("error_rate")), "failed / (completed − cancelled)"),
        ("Duration", f"{fmt_num(facts.section(run, 'metrics', 'window').get('duration_s'), 1)} s", ""),
        ("Output tokens/s", fmt_num(thr.get("output_tokens_per_s"), 1), ""),
        ("Input tokens/s", fmt_num(thr.get("input_tokens_per_s"), 1), ""),
        ("Requests/s", fmt_num(thr.get("requests_per_s"), 3), "successful requests per second"),
        ("TPS per user", fmt_num(thr.get("tps_per_user"), 1), "1000 / p90 TPOT (ms)"),
        ("Total tokens", f"{fmt_int(total)} ({fmt_int(out_t)} output + {fmt_int(in_t)} input)", ""),
        ("Load", facts.load_text(run), ""),
        ("Seed", str(cfg.get("seed", NA)), ""),
        ("Processes", str(cfg.get("processes", NA)), ""),
        ("Model", str(cfg.get("model") or NA), ""),
        ("API", str(cfg.get("api") or NA), ""),
        ("Tokenizer", str(cfg.get("tokenizer") or NA), ""),
        ("Endpoint", facts.endpoint_text(run), ""),
        ("Tool", f"{tool.get('name', 'loadtest')} {tool.get('version', '')}".strip(), ""),
        ("Workload fingerprint", short_hash(fp), fp or ""),
        ("Profile file", str(cfg.get("profile_path") or NA), ""),
        ("Created", str(run.get("created") or NA), ""),
    ]


def _latency_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, label, definition in facts.LATENCY_ROWS:
        s = facts.latency_stats(run, key)
        rows.append(
            {
                "label": label,
                "definition": definition,
                "count": fmt_int(s.get("count") or 0),
                "cells": [fmt_ms(s.get(k)) for k, _ in _LATENCY_COLS],
            }
        )
    return rows


def _token_rows(run: dict[str, Any]) -> dict[str, Any]:
    tok = facts.section(run, "metrics", "tokens")
    return {
        "has_usage": bool(tok.get("usage_reports")),
        "usage_reports": fmt_int(tok.get("usage_reports") or 0),
        "rows": [
            ("Output tokens", fmt_int(tok.get("output_total")), fmt_int(tok.get("usage_output_total"))),
            ("Input tokens", fmt_int(tok.get("input_total")), fmt_int(tok.get("usage_input_total"))),
        ],
        "reasoning": fmt_int(tok.get("reasoning_total")),
        "cached": fmt_int(tok.get("usage_cached_total")),
        "mismatched": fmt_int(tok.get("mismatched_requests") or 0),
        "counted_by": facts.section(run, "tokens").get("description"),
    }


def _outcome_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    samples = facts.section(run, "metrics").get("error_samples") or {}
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


def _context(run: dict[str, Any], log: LogSummary | None, log_info: str) -> dict[str, Any]:
    cfg = facts.section(run, "config")
    cdf = charts.latency_cdf_figure(run.get("histograms") or {})
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
    resolved = cfg.get("profile_resolved") or cfg
    return {
        "profile": cfg.get("profile") or "run",
        "run_id": run.get("run_id") or "",
        "interrupted": facts.is_interrupted(run),
        "status": facts.status_text(run),
        "cards": sections.headline_cards(run),
        "headline": sections.headline_latency(run),
        "summary_rows": _summary_rows(run),
        "latency_cols": [label for _, label in _LATENCY_COLS],
        "latency_rows": _latency_rows(run),
        "cdf_chart": cdf_chart,
        "series_charts": series,
        "scenario_rows": sections.scenario_rows(run),
        "scenario_names": [s.get("name") for s in cfg.get("scenarios") or []],
        "outcomes": _outcome_rows(run),
        "error_classes": sections.error_class_rows(log),
        "has_log": log is not None,
        "lengths": lengths,
        "tokens": _token_rows(run),
        "token_chart": token_chart,
        "telemetry": telemetry,
        "server_latency": sections.server_latency_section(run),
        "warm_cache": sections.warm_cache_warning(run),
        "prefix_cache_text": sections.prefix_cache_text(run),
        "extra_sections": _extra_sections(run),
        "engine_json": sections.engine_json(run),
        "notes": list(run.get("notes") or []),
        "log_info": log_info,
        "config_json": json.dumps(resolved, indent=2, sort_keys=True, default=str, ensure_ascii=False),
        "plotly_js": Markup(charts.plotly_js()) if any(c and c.html for c in all_charts) else None,
    }


def _extra_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Cost and per-endpoint sections (loadtest.economics.html); none when the run lacks their inputs."""

    return extra_sections(run)


VERDICT_LABELS = {
    "pass": "PASS",
    "slo_missed": "SLO MISSED",
    "invalid": "RUN INVALID",
    "error_rate": "ENDPOINT FAILING",  # exit 12: no success, error rate over its limit, or stopped early
}


def verdict_reasons(run: dict[str, Any]) -> list[str]:
    """The verdict's reasons; an interrupted run says so first."""
    reasons = list((run.get("verdict") or {}).get("reasons") or [])
    if facts.is_interrupted(run):
        reasons.insert(0, facts.status_text(run))
    return reasons


def render_html(run: dict[str, Any], log: LogSummary | None = None, log_info: str = "") -> str:
    """The report page for a loaded run.json and (optionally) its summarized record log."""
    verdict = run.get("verdict")
    label = VERDICT_LABELS.get(verdict["status"], verdict["status"]) if verdict else ""
    if verdict and facts.is_interrupted(run):
        label = f"INTERRUPTED · {label}"
    return (
        _env()
        .get_template(TEMPLATE)
        .render(
            **_context(run, log, log_info or _log_info(None, [], log)),
            verdict=verdict,
            verdict_label=label,
            verdict_reasons=verdict_reasons(run),
            goodput_text=sections.goodput_text(run),
            judged_text=sections.judged_text(run),
        )
    )


def log_paths(run_dir: Path, run: dict[str, Any]) -> list[Path]:
    """The run's record logs: those run.json names that exist, else every records*.jsonl in the folder."""
    named = [run_dir / Path(n).name for n in (run.get("files") or {}).get("records") or []]
    found = [p for p in named if p.is_file()]
    return found or record_files(run_dir)


def load_log(run_dir: Path, run: dict[str, Any]) -> tuple[LogSummary | None, str]:
    """The summarized record log (None when the folder has none) and a line saying what was read."""
    paths = log_paths(run_dir, run)
    if not paths:
        return None, _log_info(run_dir, paths, None)
    t0 = facts.section(run, "metrics", "window").get("first_scheduled")
    log = summarize_log(paths, t0, sections.series_width(run))
    return log, _log_info(run_dir, paths, log)


def render_run_report(run_dir: Path) -> Path:
    """Write ``run_dir/report.html`` and ``run_dir/mlperf_log_summary.txt`` from run.json and the
    record log; return the report's path."""
    run_dir = Path(run_dir)
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    log, info = load_log(run_dir, run)
    name = (run.get("files") or {}).get("report") or REPORT_NAME
    out = run_dir / Path(name).name
    out.write_text(render_html(run, log, info), encoding="utf-8")
    write_summary(run_dir, run)
    return out
