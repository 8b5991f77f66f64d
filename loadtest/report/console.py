"""Plain-text run summary for the terminal: fixed-width columns, no colors, under 100 columns."""

from __future__ import annotations

import textwrap
from typing import Any

from loadtest.fmt import fmt_int, fmt_ms, fmt_num, fmt_pct
from loadtest.report import facts
from loadtest.telemetry.warm import warm_note

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


def _latency_table(run: dict[str, Any]) -> list[str]:
    labels = {k: label for k, label, _ in facts.LATENCY_ROWS}
    lines = [f"{'Latency (ms)':<16}" + "".join(f"{h:>11}" for _, h in _COLS)]
    for key in _CONSOLE_LATENCY:
        s = facts.latency_stats(run, key)
        cells = [fmt_int(s.get(k) or 0, NA) if k == "count" else fmt_ms(s.get(k), NA) for k, _ in _COLS]
        lines.append(f"{labels[key]:<16}" + "".join(f"{c:>11}" for c in cells))
    return lines


def _token_table(run: dict[str, Any]) -> list[str]:
    tok = facts.section(run, "metrics", "tokens")
    has_usage = bool(tok.get("usage_reports"))
    lines = [f"{'Tokens':<16}{'client':>16}{'server usage':>16}"]
    for label, ck, sk in (
        ("output", "output_total", "usage_output_total"),
        ("input", "input_total", "usage_input_total"),
    ):
        server = fmt_int(tok.get(sk), NA) if has_usage else NA
        lines.append(f"{label:<16}{fmt_int(tok.get(ck), NA):>16}{server:>16}")
    if has_usage:
        lines.append(
            f"server usage on {fmt_int(tok.get('usage_reports'))} requests; "
            f"{fmt_int(tok.get('mismatched_requests') or 0)} with a different output count"
        )
    else:
        lines.append("the server sent no usage")
    if described := facts.section(run, "tokens").get("description"):
        lines.append(f"figures count tokens by {described}")
    return lines


def _server_table(run: dict[str, Any]) -> list[str]:
    """Client against server percentiles (p50 / p90 / p99) for TTFT, ITL and E2E, when run.json has the
    server's histograms (bucket-interpolated, docs/telemetry.md)."""
    metrics = facts.section(run, "telemetry", "server_latency", "metrics")
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
        c = [cli.get(k) for k in ("p50", "p90", "p99")]
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


def _warm_lines(run: dict[str, Any]) -> list[str]:
    pc = run.get("prefix_cache")
    if not isinstance(pc, dict) or not pc.get("warm") or pc.get("hit_rate") is None:
        return []

    return ["", *_kv("WARNING", str(pc.get("warning") or warm_note(float(pc["hit_rate"]))))]


def format_summary(run: dict[str, Any]) -> str:
    """A readable fixed-width summary of a run.json dict (also for runs with no successful request)."""
    m = facts.metrics_of(run)
    req, thr = m.get("requests", {}), m.get("throughput", {})
    cfg = facts.section(run, "config")
    outcomes = facts.nonzero_outcomes(run)
    duration = facts.section(run, "metrics", "window").get("duration_s")
    lines = [
        f"loadtest run {run.get('run_id') or ''}  profile {cfg.get('profile') or NA}",
        *_kv("Status", facts.status_text(run)),
        *_kv("Load", f"{facts.load_text(run)}; model {cfg.get('model') or NA}; {fmt_num(duration, 1, NA)} s"),
        *_kv("Endpoint", facts.endpoint_text(run)),
        "",
        *_kv(
            "Requests",
            f"completed {fmt_int(req.get('completed'), NA)}  ok {fmt_int(req.get('ok'), NA)}  "
            f"failed {fmt_int(req.get('failed'), NA)}  cancelled {fmt_int(req.get('cancelled'), NA)}  "
            f"error rate {fmt_pct(req.get('error_rate'), NA)}",
        ),
        *_kv("Outcomes", ", ".join(f"{o} {n:,}" for o, n in outcomes) if outcomes else "none"),
        *_kv(
            "Throughput",
            f"{fmt_num(thr.get('output_tokens_per_s'), 1, NA)} output tok/s  "
            f"{fmt_num(thr.get('input_tokens_per_s'), 1, NA)} input tok/s  "
            f"{fmt_num(thr.get('requests_per_s'), 3, NA)} req/s  "
            f"{fmt_num(thr.get('tps_per_user'), 1, NA)} tok/s per user",
        ),
        *_goodput_lines(run),
        "",
        *_latency_table(run),
        *_server_table(run),
        "",
        *_token_table(run),
        *_warm_lines(run),
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _goodput_lines(run: dict[str, Any]) -> list[str]:
    """SLO attainment and goodput, when the run had per-request TTFT/TPOT limits."""
    gp = run.get("goodput")
    if not gp:
        return []
    rule = gp.get("rule", {})
    limits = ", ".join(f"{k[:-3].upper()} ≤ {v:g} ms" for k, v in rule.items() if v is not None)
    return _kv(
        "Goodput",
        f"{fmt_pct(gp.get('attainment'), NA)} of requests good ({limits}); "
        f"{fmt_num(gp.get('good_requests_per_s'), 3, NA)} good req/s, "
        f"{fmt_num(gp.get('good_output_tokens_per_s'), 1, NA)} good tok/s",
    )
