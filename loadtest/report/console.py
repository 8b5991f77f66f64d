"""Plain-text run summary for the terminal: the judged window's figures in 80 columns, no colors."""

from __future__ import annotations

import textwrap

from loadtest.contracts.run_document import RunDocument
from loadtest.fmt import fmt_int, fmt_ms, fmt_num, fmt_pct
from loadtest.report import facts
from loadtest.report.run_sections import agentic_accuracy_text

WIDTH = 80
NA = "-"
_CONSOLE_LATENCY = ("ttft", "itl", "tpot", "e2e", "schedule_lag")
_COLS: tuple[tuple[str, str], ...] = (
    ("p50", "p50"),
    ("p90", "p90"),
    ("p99", "p99"),
    ("p99_9", "p99.9"),
    ("max", "max"),
)
_WHOLE_RUN_LATENCY = (("ttft", "TTFT"), ("e2e", "E2E"))


def _sig(v: float | None) -> str:
    """A rate with the precision a latency gets: three significant digits, whole numbers from 100."""
    return fmt_ms(v, NA)


def _kv(label: str, text: str) -> list[str]:
    """``label`` in a 12-wide column, ``text`` wrapped to the line width after it."""
    return textwrap.wrap(text, WIDTH, initial_indent=f"{label:<12}", subsequent_indent=" " * 12) or [label]


def _latency_table(run: RunDocument) -> list[str]:
    """The judged window's latency percentiles (the figures the verdict judged), 14 + 5 × 9 + 10 columns."""
    labels = {k: label for k, label, _ in facts.LATENCY_ROWS}
    lines = [f"{'Latency (ms)':<14}" + "".join(f"{h:>9}" for _, h in _COLS) + f"{'count':>10}"]
    for key in _CONSOLE_LATENCY:
        s = facts.judged_latency_stats(run, key)
        if facts.not_measurable(run, key):  # tokens arrived merged: the figures time a proxy's buffer
            lines.append(f"{labels[key]:<14}{'not measurable (merged delivery)':>45}")
            continue
        cells = "".join(f"{fmt_ms(facts.stat(s, k), NA):>9}" for k, _ in _COLS)
        lines.append(f"{labels[key]:<14}{cells}{fmt_int(facts.stat(s, 'count') or 0, NA):>10}")
    return lines


def _token_table(run: RunDocument) -> list[str]:
    tok = run.metrics.tokens
    has_usage = bool(tok.usage_reports)
    lines = [f"{'Tokens (whole run)':<20}{'client':>16}{'server usage':>16}"]
    for label, client, usage in (
        ("output", tok.output_total, tok.usage_output_total),
        ("input", tok.input_total, tok.usage_input_total),
    ):
        server = fmt_int(usage, NA) if has_usage else NA
        lines.append(f"{label:<20}{fmt_int(client, NA):>16}{server:>16}")
    if has_usage:
        lines += _kv(
            "",
            f"server usage on {fmt_int(tok.usage_reports)} requests; "
            f"{fmt_int(tok.mismatched_requests)} with a different output count",
        )
    else:
        lines.append("the server sent no usage")
    if run.tokens is not None and run.tokens.description:
        lines += textwrap.wrap(f"figures count tokens by {run.tokens.description}", WIDTH)
    return lines


def _server_table(run: RunDocument) -> list[str]:
    """Client against server percentiles (p50 / p90 / p99) for TTFT, ITL and E2E, one row each, when
    run.json has the server's histograms (bucket-interpolated, docs/telemetry.md): the judged window's
    on both sides when the server has them, else the whole run's. A difference within the width of the
    server's bucket has no sign."""
    metrics, judged = facts.server_judged(run)
    if not metrics:
        return []
    where = "judged window" if judged else "whole run"
    lines = [
        "",
        f"{'Server vs client':<17}{'client':>9}{'server':>9}  {'server bucket':<15}client − server",
        f"(ms, {where})",
    ]
    for key, label in (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E")):
        srv = metrics.get(key)
        if not srv:
            continue
        cli = facts.judged_latency_stats(run, key) if judged else facts.latency_stats(run, key)
        for p in ("p50", "p90", "p99"):
            c = facts.stat(cli, p)
            v, below, above = facts.server_percentile(srv, p)
            sv = (
                fmt_ms(v)
                if v is not None
                else f"≤{fmt_ms(below)}"
                if below
                else f">{fmt_ms(above)}"
                if above
                else NA
            )
            bucket = facts.server_bucket(srv, p) or NA
            diff = facts.server_difference(c, srv, p) or NA
            lines.append(f"{label + ' ' + p:<17}{fmt_ms(c, NA):>9}{sv:>9}  {bucket:<15}{diff}")
    lines += textwrap.wrap(
        "server: the engine's histograms, bucket-interpolated; a difference within the server "
        "bucket's width has no sign (resolution, not signal). ≤B: in the first bucket, 0 to B ms; "
        ">B: past the last bound",
        WIDTH,
    )
    return lines


def _replica_lines(run: RunDocument) -> list[str]:
    """Each replica's own figures (run.json ``telemetry.replicas``), one line each, for several metrics URLs."""
    replicas = (run.telemetry.replicas if run.telemetry is not None else None) or []
    if len(replicas) < 2:
        return []
    lines = ["", "Replicas (each one's own /metrics)"]
    for r in replicas:
        lines += _kv(
            "",
            f"{r.get('url')}: {fmt_int(r.get('requests'), NA)} requests, "
            f"{fmt_num(r.get('generation_tokens_per_s'), 1, NA)} output tok/s, "
            f"prefix-cache hit {fmt_pct(r.get('prefix_cache_hit_rate'), NA)}, "
            f"KV usage mean {fmt_pct(r.get('kv_cache_usage_mean'), NA)}",
        )
    return lines


def _warm_lines(run: RunDocument) -> list[str]:
    note = facts.warm_warning(run)
    return ["", *_kv("WARNING", note)] if note else []


def _whole_run_lines(run: RunDocument) -> list[str]:
    """The whole run's figures, labelled, under the judged ones (nothing when the whole run is judged)."""
    if run.judged is None:
        return []
    m = run.metrics
    lat = ", ".join(
        f"{label} p99 {fmt_ms(facts.stat(facts.latency_stats(run, key), 'p99'), NA)} ms"
        for key, label in _WHOLE_RUN_LATENCY
    )
    return _kv(
        "Whole run",
        f"{facts.whole_run_label(run)[len('whole run: ') :]} (warm-up included): {lat}; "
        f"{_sig(m.throughput.output_tokens_per_s)} output tok/s; "
        f"error rate {fmt_pct(m.requests.error_rate, NA)}",
    )


def format_summary(run: RunDocument) -> str:
    """A readable summary of a run.json document in 80 columns (also for runs with no successful
    request): the judged window's figures, labelled, the whole run's under them."""
    cfg, judged = run.config, run.judged_metrics()
    req, thr = judged.requests, judged.throughput
    outcomes = [(o, n) for o, n in judged.requests.by_outcome.items() if n]
    duration = run.metrics.window.duration_s
    merged = facts.delivery_diagnosis(run)
    per_user = "tok/s per user not measurable" if merged else f"{_sig(thr.tps_per_user)} tok/s per user"
    lines = [
        f"loadtest run {run.run_id or ''}  profile {cfg.profile or NA}",
        *_kv("Status", facts.status_text(run)),
        *_kv("Load", f"{facts.load_text(run)}; model {cfg.model or NA}; {fmt_num(duration, 1, NA)} s"),
        *_kv("Endpoint", facts.endpoint_text(run)),
        *(_kv("DELIVERY", merged) if merged else []),
        "",
        *textwrap.wrap(facts.judged_label(run) + " (the figures the verdict judged)", WIDTH),
        *_kv(
            "Requests",
            f"completed {fmt_int(req.completed, NA)}  ok {fmt_int(req.ok, NA)}  "
            f"failed {fmt_int(req.failed, NA)}  cancelled {fmt_int(req.cancelled, NA)}  "
            f"error rate {fmt_pct(req.error_rate, NA)}",
        ),
        *_kv("Outcomes", ", ".join(f"{o} {n:,}" for o, n in outcomes) if outcomes else "none"),
        *_kv(
            "Throughput",
            f"{_sig(thr.output_tokens_per_s)} output tok/s  "
            f"{_sig(thr.input_tokens_per_s)} input tok/s  "
            f"{_sig(thr.requests_per_s)} req/s  {per_user}",
        ),
        *_goodput_lines(run),
        *_quality_lines(run),
        *_conversation_lines(run),
        *_agentic_lines(run),
        "",
        *_latency_table(run),
        *_whole_run_lines(run),
        *_server_table(run),
        "",
        *_token_table(run),
        *_replica_lines(run),
        *_warm_lines(run),
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _quality_lines(run: RunDocument) -> list[str]:
    """The quality gate's pass rate and each check that failed, when run.json has a quality section."""
    q = run.quality
    if q is None or not q.checked:
        return []
    failed = [f"{name} {c.failed:,}" for name, c in q.checks.items() if c.failed]
    text = (
        f"{fmt_pct(q.pass_rate, NA)} of {fmt_int(q.checked)} ok answers (the whole run's) passed every check "
        f"(gate ≥ {q.min * 100:g} %{'' if q.min_source == 'slo' else ', the default'})"
    )
    return _kv("Quality", text + (f"; failed: {', '.join(failed)}" if failed else ""))


def _goodput_lines(run: RunDocument) -> list[str]:
    """SLO attainment and goodput, when the run had per-request TTFT/TPOT limits."""
    gp = run.goodput
    if gp is None:
        return []
    rule = facts.goodput_limits(gp.rule)
    limits = ", ".join(f"{name} ≤ {v:g} ms" for name, v in rule)
    # Merged delivery (metrics/delivery.py): a TPOT limit judged a TPOT that times a proxy's buffer.
    meaningless = any(name == "TPOT" for name, _ in rule) and facts.not_measurable(run, "tpot")
    return _kv(
        "Goodput",
        f"{fmt_pct(gp.attainment, NA)} of requests good ({limits}); "
        f"{_sig(gp.good_requests_per_s)} good req/s, "
        f"{_sig(gp.good_output_tokens_per_s)} good tok/s"
        + ("; not measurable: its TPOT limit judged merged tokens" if meaningless else ""),
    )


def _agentic_lines(run: RunDocument) -> list[str]:
    """The agentic inline accuracy, when the run replayed recorded calls with expected answers."""
    text = agentic_accuracy_text(run)
    return ["", text] if text else []


def _conversation_lines(run: RunDocument) -> list[str]:
    """The whole run's conversations, when it had sessions: counts and rate, latency, calls each,
    interactivity with and without tool time, SLO attainment (three significant digits)."""
    c = run.conversations
    if c is None:
        return []
    lat, calls = c.latency_s or {}, c.calls_per_conversation or {}
    return [
        "",
        "Conversations (whole run)",
        *_kv(
            "Completed",
            f"{fmt_int(c.completed)} of {fmt_int(c.started)} started, {_sig(c.per_s)} per s; "
            f"{_sig(calls.get('mean'))} calls each",
        ),
        *_kv("Latency (s)", "  ".join(f"{p} {_sig(lat.get(p))}" for p in ("p50", "p90", "p99", "mean"))),
        *_kv(
            "Interactiv.",
            f"{_sig(c.e2e_interactivity)} tok/s without tool time, "
            f"{_sig(c.e2e_interactivity_with_tool_time)} with",
        ),
        *_kv(
            "SLO",
            f"{fmt_pct(c.slo_attainment, NA)} of {fmt_int(c.judged)} judged had every call within the SLOs",
        ),
    ]
