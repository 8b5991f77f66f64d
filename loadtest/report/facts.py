"""Run facts in words (status, load, endpoint, outcomes, latency rows) from a RunDocument, shared by the
console summary and the run report."""

from __future__ import annotations

from typing import Any

import msgspec

from loadtest.contracts.run_document import GoodputRule, JsonObject, RunDocument, Summary
from loadtest.fmt import fmt_ms
from loadtest.metrics import delivery
from loadtest.metrics.verdict import MERGED_DELIVERY
from loadtest.telemetry.warm import warm_note

# (metric key, label, one-line definition) in the order both reports show them.
LATENCY_ROWS: tuple[tuple[str, str, str], ...] = (
    ("ttft", "TTFT", "Time to first token, from the scheduled time (MLPerf LoadGen definition)."),
    ("ttft_send", "TTFT (from send)", "Time to first token, from the moment the request was actually sent."),
    ("ttfa", "Time to first answer token", "Scheduled time to the first non-reasoning (answer) token."),
    ("itl", "ITL", "Inter-token latency: the gap between consecutive token-carrying chunks."),
    ("tpot", "TPOT", "Time per output token: (latency − TTFT) / (output tokens − 1), per request."),
    ("e2e", "E2E", "End-to-end latency, from the scheduled time to the last byte of the answer."),
    ("schedule_lag", "Schedule lag", "Send time − scheduled time: how late the load generator sent."),
)
INTERRUPTED_NOTE = "results cover the requests finished before the stop"


def is_interrupted(run: RunDocument) -> bool:
    return run.status == "interrupted"


def status_text(run: RunDocument) -> str:
    """The status line: completed, or INTERRUPTED (reason) with what the results cover."""
    if not is_interrupted(run):
        return run.status or "completed"
    reason = run.interrupted_reason
    head = f"INTERRUPTED ({reason})" if reason else "INTERRUPTED"
    return f"{head}: {INTERRUPTED_NOTE}"


def load_text(run: RunDocument) -> str:
    """The offered load in words: closed-loop concurrency or open-loop rate and arrival process."""
    load = run.config.load
    if load.stages or load.trace:  # stages or a replayed trace: the profile's own words
        return load.description or load.mode or "unknown"
    if load.mode == "closed":
        return f"closed loop, concurrency {load.concurrency}"
    if load.mode == "open":
        arrival_txt = f", {load.arrival.capitalize()} arrivals" if load.arrival else ""
        return f"open loop, {load.rate:g} req/s{arrival_txt}" if load.rate is not None else "open loop"
    return load.mode or "unknown"


def endpoint_text(run: RunDocument) -> str:
    """The endpoint URL and whether it was the embedded simulator."""
    ep = run.endpoint
    return f"{ep.url or 'unknown'} ({'embedded simulator' if ep.embedded else 'external'})"


def nonzero_outcomes(run: RunDocument) -> list[tuple[str, int]]:
    """(outcome, count) for every outcome that happened, in run.json order."""
    return [(o, n) for o, n in run.metrics.requests.by_outcome.items() if n]


def latency_stats(run: RunDocument, key: str) -> Summary | None:
    """The whole run's latency summary of one metric (ms); None when absent."""
    return run.metrics.latency_ms.get(key)


def stat(s: Summary | None, field: str) -> float | None:
    """One figure of a summary by field name (``count``, ``mean``, ``p50`` ... ``max``); None without one."""
    value: float | None = getattr(s, field) if s is not None else None
    return value


def goodput_limits(rule: GoodputRule) -> list[tuple[str, float]]:
    """(metric label, limit in ms) of the per-request SLO's TTFT and TPOT limits that are set."""
    limits = (("TTFT", rule.ttft_ms), ("TPOT", rule.tpot_ms))
    return [(name, ms) for name, ms in limits if ms is not None]


def delivery_diagnosis(run: RunDocument) -> str | None:
    """The merged-delivery diagnosis of the judged figures (metrics/delivery.py), None when the streams
    were not mostly delivered merged; the verdict's own sentence where it has one (it names a generator
    that fell behind instead of a proxy)."""
    checks = run.verdict.checks if run.verdict is not None else []
    judged = next((c.detail for c in checks if c.name == MERGED_DELIVERY and not c.passed), None)
    return judged or delivery.diagnosis(msgspec.structs.asdict(run.judged_metrics().itl_merged))


def not_measurable(run: RunDocument, key: str) -> str | None:
    """Why the judged ``key`` latency (itl, tpot) means nothing in this run, or None when it does."""
    if key not in delivery.UNMEASURABLE or delivery_diagnosis(run) is None:
        return None
    return delivery.not_measurable(key)


def warm_warning(run: RunDocument) -> str | None:
    """The warm-cache warning (docs/reports.md) when the run was warm and its profile asks for no reuse."""
    pc = run.prefix_cache
    if pc is None or not pc.warm or pc.hit_rate is None:
        return None
    return pc.warning or warm_note(pc.hit_rate)


def server_latency(run: RunDocument) -> JsonObject:
    """run.json ``telemetry.server_latency`` (the server's histograms), empty when the run has none."""
    return (run.telemetry.server_latency if run.telemetry is not None else None) or {}


def server_percentile(s: dict[str, Any], key: str) -> tuple[float | None, float | None, float | None]:
    """One server percentile from run.json ``telemetry.server_latency.metrics.<m>``: (value, below, above).

    ``value`` is the bucket-interpolated figure when the histogram resolves it; ``None`` with ``below``
    set when the rank falls in the first bucket (0 to its bound: interpolation there says nothing), and
    with ``above`` set when it falls in the +Inf bucket (past the last finite bound)."""
    v = s.get(f"{key}_ms")
    lo, hi = ((s.get(f"{key}_bucket_ms") or [None, None]) + [None, None])[:2]
    if v is None:
        return None, None, None
    if hi is None:
        return None, None, lo
    if not lo:
        return None, hi, None
    return v, None, None


def judged_label(run: RunDocument) -> str:
    """What the verdict judged, in words: ``judged window: 12.0–60.0 s, 1,043 requests``, or the whole run
    once when no window was set."""
    m = run.judged_metrics()
    n = f"{m.requests.completed:,} requests"
    if run.judged is None:
        return f"judged: the whole run, {n} (no warm-up or cool-down window)"
    w = run.judged.window
    start = w.warmup_s
    ramp = run.config.judging.ramp if run.config.judging is not None else None
    after = ""
    if ramp is not None and ramp.planned_s > 0:
        held = f", {ramp.held_s:.1f} s of it waiting for the host's CPU" if ramp.held_s > 0 else ""
        after = f", after a {ramp.took_s:.1f} s start ramp{held}"
    return f"judged window: {start:.1f}–{start + w.duration_s:.1f} s, {n}{after}"


def whole_run_label(run: RunDocument) -> str:
    """The whole run's span and requests: ``whole run: 0.0–60.0 s, 1,200 requests``."""
    m = run.metrics
    return f"whole run: 0.0–{m.window.duration_s:.1f} s, {m.requests.completed:,} requests"


def judged_latency_stats(run: RunDocument, key: str) -> Summary | None:
    """The judged window's latency summary of one metric (ms), the whole run's when no window was set."""
    return run.judged_metrics().latency_ms.get(key)


def server_judged(run: RunDocument) -> tuple[JsonObject, bool]:
    """The server's histogram summaries to set against the judged client figures, and whether they are
    the judged window's (else the whole run's, to set against the whole run's client figures)."""
    sl = server_latency(run)
    judged = (sl.get("judged") or {}).get("metrics") if run.judged is not None else None
    if judged:
        return judged, True
    return sl.get("metrics") or {}, False


def server_difference(client: float | None, s: dict[str, Any], key: str) -> str | None:
    """Client − server for one percentile, signed only when it exceeds the width of the server bucket
    that holds the server's figure (within that width the difference is resolution, not signal):
    ``+12.3``, ``within bucket (±150)``; None when either figure is missing or unresolved."""
    v, _, _ = server_percentile(s, key)
    lo, hi = ((s.get(f"{key}_bucket_ms") or [None, None]) + [None, None])[:2]
    if client is None or v is None or lo is None or hi is None:
        return None
    d, width = client - v, hi - lo
    if abs(d) <= width:
        return f"within bucket (±{fmt_ms(width)})"
    return f"{'+' if d > 0 else '−'}{fmt_ms(abs(d))}"


def server_bucket(s: dict[str, Any], key: str) -> str | None:
    """The bounds of the bucket the server's percentile lies in, ``100–250``; None when unknown."""
    lo, hi = ((s.get(f"{key}_bucket_ms") or [None, None]) + [None, None])[:2]
    if lo is None:
        return None
    low = fmt_ms(lo) if lo else "0"
    return f"{low}–{fmt_ms(hi)}" if hi is not None else f">{low}"
