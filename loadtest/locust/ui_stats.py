"""The web UI's numbers: live counts, percentiles, SLO rows of a recorder, and the LLM tab's formatted rows."""

from __future__ import annotations

from typing import Any

from loadtest.contracts.run_document import RunDocument
from loadtest.fmt import fmt_int, fmt_ms, fmt_num, fmt_pct
from loadtest.metrics.conversations import (
    LIVE_COMPLETED,
    LIVE_FAILED,
    LIVE_GOOD,
    LIVE_LATENCY,
    LIVE_STARTED,
)
from loadtest.metrics.hdr import fast_percentiles
from loadtest.metrics.recorder import Aggregate
from loadtest.metrics.slo import AnySlo, ConversationSlo, ErrorRateSlo, QualitySlo

LATENCIES: tuple[tuple[str, str], ...] = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E"))
RECENT_S = 5  # output tokens/s over the last few complete seconds
DASHBOARD_PATH = "/llm"


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v / 1000.0, 3)


def request_counts(agg: Aggregate) -> dict[str, Any]:
    """ok / failed / cancelled and the error rate (cancelled requests excluded), as run.json counts them."""
    completed = sum(agg.outcomes.values())
    ok = int(agg.outcomes.get("ok", 0))
    cancelled = int(agg.outcomes.get("cancelled", 0))
    counted = completed - cancelled
    return {
        "completed": completed,
        "ok": ok,
        "failed": counted - ok,
        "cancelled": cancelled,
        "error_rate": round((counted - ok) / counted, 6) if counted else 0.0,
    }


def slo_rows(slos: list[AnySlo], agg: Aggregate, requests: dict[str, Any]) -> list[dict[str, Any]]:
    """Each SLO with its measured value so far and whether it is met (no early-stopping evidence here)."""
    rows = []
    for s in slos:
        if isinstance(s, ErrorRateSlo):
            value = requests["error_rate"]
            counted = requests["completed"] - requests["cancelled"]
            met = None if not counted else value <= s.limit
            rows.append({"key": s.key, "limit": s.limit, "value": value, "unit": "fraction", "met": met})
            continue
        if isinstance(s, QualitySlo):  # judged from the record log at the end of the run
            rows.append({"key": s.key, "limit": s.limit, "value": None, "unit": "fraction", "met": None})
            continue
        if isinstance(s, ConversationSlo):  # so far; early stopping is applied at the end
            conv = conversation_stats(agg)
            share = None if conv is None else conv["slo_attainment"]
            met = None if share is None else share >= s.limit
            rows.append({"key": s.key, "limit": s.limit, "value": share, "unit": "fraction", "met": met})
            continue
        (us,) = fast_percentiles(agg.hists[s.metric], (s.percentile,))
        value = _ms(us)
        met = None if value is None else value <= s.limit_ms
        rows.append({"key": s.key, "limit": s.limit_ms, "value": value, "unit": "ms", "met": met})
    return rows


def conversation_stats(agg: Aggregate) -> dict[str, Any] | None:
    """The live conversation figures (metrics/conversations.LiveConversations: the whole run's only), None
    before a conversation started: counts, completed per second, latency p50/p90/p99 in s, attainment."""
    started = int(agg.totals.get(LIVE_STARTED, 0))
    if not started:
        return None
    done, good = int(agg.totals.get(LIVE_COMPLETED, 0)), int(agg.totals.get(LIVE_GOOD, 0))
    judged = done + int(agg.totals.get(LIVE_FAILED, 0))
    first, last = agg.first_scheduled, agg.last_done
    duration = (last - first) if first is not None and last is not None else 0.0
    p50, p90, p99 = (
        None if v is None else round(v / 1e6, 3)
        for v in fast_percentiles(agg.hists[LIVE_LATENCY], (50.0, 90.0, 99.0))
    )
    return {
        "started": started,
        "completed": done,
        "judged": judged,
        "good": good,
        "per_s": round(done / duration, 4) if duration > 0 else 0.0,
        "latency_s": {"p50": p50, "p90": p90, "p99": p99},
        "slo_attainment": round(good / judged, 4) if judged else None,
    }


def recent_output_tps(agg: Aggregate, now: float, seconds: int = RECENT_S) -> float:
    """Output tokens/s over the last ``seconds`` complete seconds of the run (counted when requests end)."""
    end = int(now)
    start = max(end - seconds, int(agg.first_scheduled or end))
    if end <= start:
        return 0.0
    total = sum(agg.series[s][3] for s in range(start, end) if s in agg.series)
    return round(total / (end - start), 3)


def scope_stats(agg: Aggregate, now: float) -> dict[str, Any]:
    """Latency percentiles, throughput, request counts and error classes of one aggregate."""
    req = request_counts(agg)
    latency = {}
    for key, _ in LATENCIES:
        hist = agg.hists[key]
        p50, p90, p99 = (_ms(v) for v in fast_percentiles(hist, (50.0, 90.0, 99.0)))
        latency[key] = {"p50": p50, "p90": p90, "p99": p99, "count": hist.get_total_count()}
    first, last = agg.first_scheduled, agg.last_done
    duration = (last - first) if first is not None and last is not None else 0.0
    out_tokens = agg.totals.get("output_tokens", 0)
    errors = [
        {"outcome": o, "count": int(n), "sample": (agg.error_samples.get(o) or [""])[0]}
        for o, n in sorted(agg.outcomes.items(), key=lambda kv: -kv[1])
        if o != "ok" and n
    ]
    judged, good = agg.totals.get("slo_judged", 0), agg.totals.get("slo_good", 0)
    goodput = {
        "judged": int(judged),
        "good": int(good),
        "attainment": round(good / judged, 4) if judged else None,
        "good_requests_per_s": round(good / duration, 4) if duration > 0 else 0.0,
        "good_output_tokens_per_s": round(agg.totals.get("slo_good_output_tokens", 0) / duration, 3)
        if duration > 0
        else 0.0,
    }
    return {
        "latency_ms": latency,
        "goodput": goodput,
        "output_tokens_per_s_recent": recent_output_tps(agg, now),
        "output_tokens_per_s_avg": round(out_tokens / duration, 3) if duration > 0 else 0.0,
        "requests_per_s": round(req["ok"] / duration, 4) if duration > 0 else 0.0,
        "requests": req,
        "errors": errors,
        "conversations": conversation_stats(agg),
    }


def judged_figures(run: RunDocument) -> dict[str, Any]:
    """A finished run's judged figures as run.json has them, for the page next to the verdict: the label
    (``judged window: 12.0–60.0 s, 1,043 requests``, or the whole run once), TTFT/ITL/TPOT/E2E p50, p90
    and p99 (ms), the requests and the throughput the verdict judged."""
    from loadtest.report import facts  # the report's imports (plotly) only once a run has finished

    m = run.judged_metrics()
    latency = {}
    for key, _ in LATENCIES:
        s = m.latency_ms.get(key)
        latency[key] = {p: facts.stat(s, p) for p in ("p50", "p90", "p99")} | {
            "count": int(facts.stat(s, "count") or 0)
        }
    req = m.requests
    return {
        "label": facts.judged_label(run),
        "window": run.judged is not None,
        "whole_run_label": facts.whole_run_label(run),
        "latency_ms": latency,
        "requests": {
            "completed": req.completed,
            "ok": req.ok,
            "failed": req.failed,
            "error_rate": req.error_rate,
        },
        "output_tokens_per_s": m.throughput.output_tokens_per_s,
        "requests_per_s": m.throughput.requests_per_s,
    }


def slo_value_text(row: dict[str, Any]) -> str:
    """An SLO row's measured value and limit for people: ``412 ms ≤ 2,000 ms`` or ``0.50 % ≤ 1.00 %``."""
    if row["unit"] == "fraction":
        op = "≥" if row["key"] in ("quality_min", "conversation_attainment") else "≤"
        return f"{fmt_pct(row['value'])} {op} {fmt_pct(row['limit'])}"
    return f"{fmt_ms(row['value'])} ms ≤ {fmt_ms(row['limit'])} ms"


def slos_text(slos: list[AnySlo]) -> str:
    """The SLOs for people, with their units: ``ttft_p99 ≤ 2,000 ms, error_rate ≤ 1.00%``."""
    parts = []
    for s in slos:
        if isinstance(s, QualitySlo | ConversationSlo):  # a share that must be reached
            parts.append(f"{s.key} ≥ {fmt_pct(s.limit)}")
        elif isinstance(s, ErrorRateSlo):
            parts.append(f"{s.key} ≤ {fmt_pct(s.limit)}")
        else:
            parts.append(f"{s.key} ≤ {fmt_ms(s.limit_ms)} ms")
    return ", ".join(parts) or "none"


def verdict_lines(verdict: dict[str, Any]) -> list[str]:
    """The verdict's reasons, then each failed or flagged check that no reason already tells, with its
    detail (what the UI shows under the verdict)."""
    reasons = [str(r) for r in verdict.get("reasons") or []]
    lines = list(reasons)
    for c in verdict.get("checks") or []:
        if c["passed"]:
            continue
        detail = c.get("detail") or ""
        if detail and any(detail in r for r in reasons):
            continue
        kind = "fails the verdict" if c["blocking"] else "flagged, not blocking"
        lines.append(f"{c['name']} ({kind}): {detail}" if detail else f"{c['name']} ({kind})")
    return lines


def table_rows(st: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of Locust's LLM tab (one flat table: section, metric, p50/p90/p99, value), formatted."""
    p = st["profile"]
    slos = p["slos_text"]
    rows: list[dict[str, Any]] = [
        {"section": "profile", "metric": p["name"], "value": p["load"]},
        {"section": "profile", "metric": "SLOs", "value": slos},
        {
            "section": "dashboard",
            "metric": "live LLM dashboard",
            "value": f"{DASHBOARD_PATH} (the “LLM dashboard” link at the bottom left): charts, every run, reports",
        },
    ]
    scopes = [("all, live", st["overall"])] + [(f"scenario {n}", s) for n, s in st["scenarios"].items()]
    for label, sc in scopes:
        if sc is None:
            continue
        rows += _latency_rows(label, sc["latency_ms"])
        r = sc["requests"]
        rows.append(
            {
                "section": label,
                "metric": "output tokens/s",
                "value": f"{fmt_num(sc['output_tokens_per_s_recent'])} (last {RECENT_S} s), "
                f"{fmt_num(sc['output_tokens_per_s_avg'])} (run)",
            }
        )
        rows.append(
            {
                "section": label,
                "metric": "requests ok / failed / cancelled",
                "value": f"{fmt_int(r['ok'])} / {fmt_int(r['failed'])} / {fmt_int(r['cancelled'])}"
                f" (error rate {fmt_pct(r['error_rate'])})",
            }
        )
        c = sc.get("conversations")
        if c is not None:
            lat = c["latency_s"]
            rows.append(
                {
                    "section": label,
                    "metric": "conversations completed / started",
                    "value": f"{fmt_int(c['completed'])} / {fmt_int(c['started'])}, "
                    f"latency p50 {fmt_ms(lat['p50'])} s p99 {fmt_ms(lat['p99'])} s, "
                    f"{fmt_pct(c['slo_attainment'])} of {fmt_int(c['judged'])} judged within the SLOs",
                }
            )
        for e in sc["errors"]:
            rows.append(
                {
                    "section": label,
                    "metric": f"error {e['outcome']}",
                    "value": f"{fmt_int(e['count'])}: {e['sample']}",
                }
            )
    for s in st["slos"]:
        met = "n/a" if s["met"] is None else ("met" if s["met"] else "MISSED")
        rows.append({"section": "SLO", "metric": s["key"], "value": f"{slo_value_text(s)}: {met}"})
    if st["verdict"] is not None:
        report = f" · report: {st['report_url']}" if st["report_url"] else ""
        rows.append({"section": "verdict", "metric": st["verdict"]["status"], "value": report.lstrip(" ·")})
        for line in verdict_lines(st["verdict"]):
            rows.append({"section": "verdict", "metric": "reason", "value": line})
        rows += _judged_rows(st.get("judged"))
    if st["run"] is not None:
        rows.append({"section": "run", "metric": st["run"]["id"], "value": st["run"]["phase"]})
    runs = len(st.get("runs", []))
    rows.append(
        {
            "section": "runs",
            "metric": "this session",
            "value": f"{runs}, each with its report on {DASHBOARD_PATH}",
        }
    )
    # The React table sorts by "name" first: a hidden zero-padded index keeps this order.
    return [{"name": f"{i:04d}", **row} for i, row in enumerate(rows)]


def _latency_rows(section: str, latency_ms: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per latency metric (p50, p90, p99 and its count) of a stats scope."""
    rows = []
    for key, title in LATENCIES:
        lat = latency_ms[key]
        rows.append(
            {
                "section": section,
                "metric": f"{title} ms",
                "p50": fmt_ms(lat["p50"]),
                "p90": fmt_ms(lat["p90"]),
                "p99": fmt_ms(lat["p99"]),
                "value": f"{fmt_int(lat['count'])} {'gaps' if key == 'itl' else 'requests'}",
            }
        )
    return rows


def _judged_rows(judged: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The LLM tab's rows of the figures the verdict judged (run.json's), under the verdict."""
    if not judged:
        return []
    section = "judged" if not judged["window"] else "judged window"
    rows: list[dict[str, Any]] = [{"section": section, "metric": "span", "value": judged["label"]}]
    rows += _latency_rows(section, judged["latency_ms"])
    r = judged["requests"]
    rows.append(
        {
            "section": section,
            "metric": "output tokens/s · requests ok / failed",
            "value": f"{fmt_num(judged['output_tokens_per_s'])} · {fmt_int(r['ok'])} / {fmt_int(r['failed'])}"
            f" (error rate {fmt_pct(r['error_rate'])})",
        }
    )
    return rows
