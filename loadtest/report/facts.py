"""Run facts in words (status, load, endpoint, outcomes, latency rows) shared by both reports."""

from __future__ import annotations

from typing import Any

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


def metrics_of(run: dict[str, Any]) -> dict[str, Any]:
    """``run["metrics"]`` or an empty dict."""
    return run.get("metrics") or {}


def section(run: dict[str, Any], *keys: str) -> dict[str, Any]:
    """A nested dict of run.json by key path, empty where absent."""
    node: Any = run
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def is_interrupted(run: dict[str, Any]) -> bool:
    return run.get("status") == "interrupted"


def status_text(run: dict[str, Any]) -> str:
    """The status line: completed, or INTERRUPTED (reason) with what the results cover."""
    if not is_interrupted(run):
        return str(run.get("status") or "completed")
    reason = run.get("interrupted_reason")
    head = f"INTERRUPTED ({reason})" if reason else "INTERRUPTED"
    return f"{head}: {INTERRUPTED_NOTE}"


def load_text(run: dict[str, Any]) -> str:
    """The offered load in words: closed-loop concurrency or open-loop rate and arrival process."""
    load = section(run, "config", "load")
    mode = load.get("mode")
    if mode == "closed":
        return f"closed loop, concurrency {load.get('concurrency')}"
    if mode == "open":
        rate = load.get("rate")
        arrival = load.get("arrival")
        arrival_txt = f", {str(arrival).capitalize()} arrivals" if arrival else ""
        return f"open loop, {rate:g} req/s{arrival_txt}" if isinstance(rate, int | float) else "open loop"
    return str(mode or "unknown")


def endpoint_text(run: dict[str, Any]) -> str:
    """The endpoint URL and whether it was the embedded simulator."""
    ep = section(run, "endpoint")
    url = ep.get("url") or "unknown"
    return f"{url} ({'embedded simulator' if ep.get('embedded') else 'external'})"


def nonzero_outcomes(run: dict[str, Any]) -> list[tuple[str, int]]:
    """(outcome, count) for every outcome that happened, in run.json order."""
    by = section(run, "metrics", "requests", "by_outcome")
    return [(o, int(n)) for o, n in by.items() if n]


def latency_stats(run: dict[str, Any], key: str) -> dict[str, Any]:
    """The latency summary of one metric (ms); empty when absent."""
    return section(run, "metrics", "latency_ms", key)


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
