"""Render a run directory's run.json into one self-contained, offline, printable report.html."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from loadtest.report import charts, facts
from loadtest.report.fmt import NA, fmt_int, fmt_ms, fmt_num, fmt_pct, short_hash

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


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ms=fmt_ms, num=fmt_num, int=fmt_int, pct=fmt_pct)
    return env


def _summary_rows(run: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, value, title attribute) rows of the summary table."""
    m = facts.metrics_of(run)
    req, thr, tok = m.get("requests", {}), m.get("throughput", {}), m.get("tokens", {})
    cfg, tool = facts.section(run, "config"), facts.section(run, "tool")
    fp = facts.section(run, "workload").get("fingerprint")
    out_t, in_t = tok.get("output_total"), tok.get("input_total")
    total = (out_t or 0) + (in_t or 0) if out_t is not None or in_t is not None else None
    return [
        ("Requests completed", fmt_int(req.get("completed")), ""),
        ("OK", fmt_int(req.get("ok")), ""),
        ("Failed", fmt_int(req.get("failed")), ""),
        ("Cancelled", fmt_int(req.get("cancelled")), ""),
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
        ("Endpoint", facts.endpoint_text(run), ""),
        ("Tool", f"{tool.get('name', 'loadtest')} {tool.get('version', '')}".strip(), ""),
        ("Workload fingerprint", short_hash(fp), fp or ""),
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
    }


def _outcome_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    samples = facts.section(run, "metrics").get("error_samples") or {}
    return [
        {"outcome": o, "count": fmt_int(n), "samples": list(samples.get(o, []))}
        for o, n in facts.nonzero_outcomes(run)
    ]


def _context(run: dict[str, Any]) -> dict[str, Any]:
    m = facts.metrics_of(run)
    cfg = facts.section(run, "config")
    cdf = charts.latency_cdf_figure(run.get("histograms") or {})
    thr = charts.throughput_figure(m.get("series") or {})
    resolved = cfg.get("profile_resolved") or cfg
    return {
        "profile": cfg.get("profile") or "run",
        "run_id": run.get("run_id") or "",
        "interrupted": facts.is_interrupted(run),
        "status": facts.status_text(run),
        "summary_rows": _summary_rows(run),
        "latency_cols": [label for _, label in _LATENCY_COLS],
        "latency_rows": _latency_rows(run),
        "cdf_title": charts.CDF_TITLE,
        "cdf_html": Markup(charts.figure_html(cdf)) if cdf else None,
        "throughput_title": charts.THROUGHPUT_TITLE,
        "throughput_html": Markup(charts.figure_html(thr)) if thr else None,
        "outcomes": _outcome_rows(run),
        "tokens": _token_rows(run),
        "config_json": json.dumps(resolved, indent=2, sort_keys=True, default=str, ensure_ascii=False),
        "plotly_js": Markup(charts.plotly_js()) if (cdf or thr) else None,
    }


VERDICT_LABELS = {
    "pass": "PASS",
    "slo_missed": "SLO MISSED",
    "invalid": "RUN INVALID",
    "error_rate": "ERROR RATE OVER LIMIT",
}


def render_html(run: dict[str, Any]) -> str:
    """The report page for a loaded run.json."""
    verdict = run.get("verdict")
    label = VERDICT_LABELS.get(verdict["status"], verdict["status"]) if verdict else ""
    return (
        _env()
        .get_template(TEMPLATE)
        .render(
            **_context(run),
            verdict=verdict,
            verdict_label=label,
            goodput=run.get("goodput"),
            judged=run.get("judged"),
        )
    )


def render_run_report(run_dir: Path) -> Path:
    """Write ``run_dir/report.html`` from ``run_dir/run.json`` and return its path."""
    run_dir = Path(run_dir)
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    name = (run.get("files") or {}).get("report") or REPORT_NAME
    out = run_dir / Path(name).name
    out.write_text(render_html(run), encoding="utf-8")
    return out
