"""Plain-text run summary for the terminal: fixed-width columns, no colors, under 100 columns."""

from __future__ import annotations

import textwrap

from loadtest.contracts.run_document import RunDocument
from loadtest.fmt import fmt_int, fmt_ms, fmt_num, fmt_pct
from loadtest.report import facts

WIDTH = 96
NA = "-"
_CONSOLE_LATENCY = ("ttft", "itl", "tpot", "e2e", "schedule_lag")
_COLS: tuple[tuple[str, str], ...] = (
    ("p50", "p50"),
    ("p90", "p90"),
    ("p99", "p99"),
    ("p99_9", "p99.9"),
    ("max", "max"),
    ("count", "count"),
)


def _kv(label: str, text: str) -> list[str]:
    """``label`` in a 12-wide column, ``text`` wrapped to the line width after it."""
    return textwrap.wrap(text, WIDTH, initial_indent=f"{label:<12}", subsequent_indent=" " * 12) or [label]


def _latency_table(run: RunDocument) -> list[str]:
    labels = {k: label for k, label, _ in facts.LATENCY_ROWS}
    lines = [f"{'Latency (ms)':<16}" + "".join(f"{h:>11}" for _, h in _COLS)]
    for key in _CONSOLE_LATENCY:
        s = facts.latency_stats(run, key)
        cells = [
            fmt_int(facts.stat(s, k) or 0, NA) if k == "count" else fmt_ms(facts.stat(s, k), NA)
            for k, _ in _COLS
        ]
        lines.append(f"{labels[key]:<16}" + "".join(f"{c:>11}" for c in cells))
    return lines


def _token_table(run: RunDocument) -> list[str]:
    tok = run.metrics.tokens
    has_usage = bool(tok.usage_reports)
    lines = [f"{'Tokens':<16}{'client':>16}{'server usage':>16}"]
    for label, client, usage in (
        ("output", tok.output_total, tok.usage_output_total),
        ("input", tok.input_total, tok.usage_input_total),
    ):
        server = fmt_int(usage, NA) if has_usage else NA
        lines.append(f"{label:<16}{fmt_int(client, NA):>16}{server:>16}")
    if has_usage:
        lines.append(
            f"server usage on {fmt_int(tok.usage_reports)} requests; "
            f"{fmt_int(tok.mismatched_requests)} with a different output count"
        )
    else:
        lines.append("the server sent no usage")
    if run.tokens is not None and run.tokens.description:
        lines.append(f"figures count tokens by {run.tokens.description}")
    return lines


def _server_table(run: RunDocument) -> list[str]:
    """Client against server percentiles (p50 / p90 / p99) for TTFT, ITL and E2E, when run.json has the
    server's histograms (bucket-interpolated, docs/telemetry.md)."""
    metrics = facts.server_latency(run).get("metrics") or {}
    if not metrics:
        return []

    def trio(values: list[float | None]) -> str:
        return " / ".join(fmt_ms(v, NA) for v in values)

    lines = [
        "",
        f"{'Server vs client':<16}{'client p50/p90/p99':>26}{'server p50/p90/p99':>26}{'client - server':>26}",
    ]
    for ckey, skey, label in (("ttft", "ttft", "TTFT"), ("itl", "itl", "ITL"), ("e2e", "e2e", "E2E")):
        srv = metrics.get(skey)
        if not srv:
            continue
        cli = facts.latency_stats(run, ckey)
        c = [facts.stat(cli, k) for k in ("p50", "p90", "p99")]
        got = [facts.server_percentile(srv, k) for k in ("p50", "p90", "p99")]
        sv = " / ".join(
            fmt_ms(v, NA)
            if v is not None
            else f"≤{fmt_ms(b)}"
            if b is not None
            else f">{fmt_ms(a)}"
            if a
            else NA
            for v, b, a in got
        )
        d = [None if a is None or b[0] is None else a - b[0] for a, b in zip(c, got, strict=True)]
        lines.append(f"{label:<16}{trio(c):>26}{sv:>26}{trio(d):>26}")
    lines.append(
        "server: the engine's histograms, bucket-interpolated (the bucket bounds are the resolution)"
    )
    lines.append("≤B: within the histogram's first bucket, 0 to B ms; >B: past its last bound")
    return lines


def _warm_lines(run: RunDocument) -> list[str]:
    note = facts.warm_warning(run)
    return ["", *_kv("WARNING", note)] if note else []


def format_summary(run: RunDocument) -> str:
    """A readable fixed-width summary of a run.json document (also for runs with no successful request)."""
    req, thr, cfg = run.metrics.requests, run.metrics.throughput, run.config
    outcomes = facts.nonzero_outcomes(run)
    duration = run.metrics.window.duration_s
    lines = [
        f"loadtest run {run.run_id or ''}  profile {cfg.profile or NA}",
        *_kv("Status", facts.status_text(run)),
        *_kv("Load", f"{facts.load_text(run)}; model {cfg.model or NA}; {fmt_num(duration, 1, NA)} s"),
        *_kv("Endpoint", facts.endpoint_text(run)),
        "",
        *_kv(
            "Requests",
            f"completed {fmt_int(req.completed, NA)}  ok {fmt_int(req.ok, NA)}  "
            f"failed {fmt_int(req.failed, NA)}  cancelled {fmt_int(req.cancelled, NA)}  "
            f"error rate {fmt_pct(req.error_rate, NA)}",
        ),
        *_kv("Outcomes", ", ".join(f"{o} {n:,}" for o, n in outcomes) if outcomes else "none"),
        *_kv(
            "Throughput",
            f"{fmt_num(thr.output_tokens_per_s, 1, NA)} output tok/s  "
            f"{fmt_num(thr.input_tokens_per_s, 1, NA)} input tok/s  "
            f"{fmt_num(thr.requests_per_s, 3, NA)} req/s  "
            f"{fmt_num(thr.tps_per_user, 1, NA)} tok/s per user",
        ),
        *_goodput_lines(run),
        *_quality_lines(run),
        "",
        *_latency_table(run),
        *_server_table(run),
        "",
        *_token_table(run),
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
        f"{fmt_pct(q.pass_rate, NA)} of {fmt_int(q.checked)} ok answers passed every check "
        f"(gate ≥ {q.min * 100:g} %{'' if q.min_source == 'slo' else ', the default'})"
    )
    return _kv("Quality", text + (f"; failed: {', '.join(failed)}" if failed else ""))


def _goodput_lines(run: RunDocument) -> list[str]:
    """SLO attainment and goodput, when the run had per-request TTFT/TPOT limits."""
    gp = run.goodput
    if gp is None:
        return []
    limits = ", ".join(f"{name} ≤ {v:g} ms" for name, v in facts.goodput_limits(gp.rule))
    return _kv(
        "Goodput",
        f"{fmt_pct(gp.attainment, NA)} of requests good ({limits}); "
        f"{fmt_num(gp.good_requests_per_s, 3, NA)} good req/s, "
        f"{fmt_num(gp.good_output_tokens_per_s, 1, NA)} good tok/s",
    )
