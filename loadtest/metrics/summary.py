"""Run-level metrics from a merged aggregate: percentiles in ms, throughput, tokens, series."""

from __future__ import annotations

from typing import Any

from loadtest.client.record import OUTCOMES
from loadtest.metrics import hdr
from loadtest.metrics.delivery import whole_bursts
from loadtest.metrics.recorder import LATENCY_METRICS, SERIES_COLUMNS, Aggregate


def _ms(v: float | int | None) -> float | None:
    return None if v is None else round(v / 1000.0, 3)


def latency_summary_ms(agg: Aggregate, name: str) -> dict[str, Any]:
    """count, mean, min, max, stddev and p50/p90/p95/p99/p99.9 in milliseconds."""
    s = hdr.summary(agg.hists[name])
    return {k: (v if k == "count" else _ms(v)) for k, v in s.items()}


def build_metrics(agg: Aggregate) -> dict[str, Any]:
    """The ``metrics`` section of run.json (schema in docs/run-json.md)."""
    by_outcome = {o: int(agg.outcomes.get(o, 0)) for o in OUTCOMES}
    by_outcome.update({o: int(n) for o, n in agg.outcomes.items() if o not in by_outcome})
    completed = sum(by_outcome.values())
    ok = by_outcome["ok"]
    counted = completed - by_outcome["cancelled"]
    first, last = agg.first_scheduled, agg.last_done
    duration = (last - first) if first is not None and last is not None else 0.0
    t = agg.totals
    latency = {name: latency_summary_ms(agg, name) for name in LATENCY_METRICS}
    tpot_p90 = latency["tpot"]["p90"]
    tps_hist = hdr.summary(agg.hists["output_tps"])
    per_request_tps = {
        k: (v if k == "count" else (None if v is None else round(v / 1000.0, 3))) for k, v in tps_hist.items()
    }
    series_t0 = int(first) if first is not None else 0
    secs = sorted(agg.series)
    series: dict[str, list[Any]] = {"t": [s - series_t0 for s in secs]}
    for i, col in enumerate(SERIES_COLUMNS):
        series[col] = [agg.series[s][i] for s in secs]
    usage_reports = int(t.get("usage_reports", 0))
    counted_by = _counted_by(ok, usage_reports)
    return {
        "requests": {
            "completed": completed,
            "ok": ok,
            "failed": counted - ok,
            "cancelled": by_outcome["cancelled"],
            "error_rate": round((counted - ok) / counted, 6) if counted else 0.0,
            "skipped_arrivals": int(t.get("skipped_arrivals", 0)),
            "by_outcome": by_outcome,
        },
        "window": {"first_scheduled": first, "last_done": last, "duration_s": round(duration, 3)},
        "throughput": {
            "output_tokens_per_s": round(t.get("output_tokens", 0) / duration, 3) if duration > 0 else 0.0,
            "input_tokens_per_s": round(t.get("input_tokens", 0) / duration, 3) if duration > 0 else 0.0,
            "requests_per_s": round(ok / duration, 4) if duration > 0 else 0.0,
            "tps_per_user": round(1000.0 / tpot_p90, 3) if tpot_p90 else None,
        },
        "tokens": {
            # What the throughput, TPOT and goodput figures count: the server's usage on the requests
            # that carried one, the client tokenizer on the rest (docs/metrics.md).
            "counted_by": counted_by,
            "counted_output_total": int(t.get("output_tokens", 0)),
            "counted_input_total": int(t.get("input_tokens", 0)),
            # The client tokenizer's counts (the cross-check), and the server's usage.
            "output_total": int(t.get("client_output_tokens", 0)),
            "input_total": int(t.get("client_input_tokens", 0)),
            "reasoning_total": int(t.get("reasoning_tokens", 0)),
            "usage_reports": usage_reports,
            "usage_output_total": int(t.get("usage_output_tokens", 0)) if usage_reports else None,
            "usage_input_total": int(t.get("usage_input_tokens", 0)) if usage_reports else None,
            "usage_cached_total": int(t.get("usage_cached_tokens", 0)) if usage_reports else None,
            "mismatched_requests": int(t.get("token_mismatch_requests", 0)),
            "input_mismatched_requests": int(t.get("token_input_mismatch_requests", 0)),
        },
        "latency_ms": latency,
        "itl_merged": itl_merged(
            int(t.get("itl_merged_gaps", 0)),
            latency["itl"]["count"],
            int(t.get("delivery_streams", 0)),
            int(t.get("delivery_merged_streams", 0)),
            int(t.get("itl_burst_gaps", 0)),
            int(t.get("delivery_burst_streams", 0)),
            whole_bursts(agg.hists["stream_gap"], agg.hists["stream_gap_unflagged"]),
        ),
        "tokens_per_chunk": tokens_per_chunk(
            int(t.get("stream_chunk_tokens", 0)), int(t.get("stream_chunks", 0))
        ),
        "output_tps_per_request": per_request_tps,
        "series": series,
        "error_samples": agg.error_samples,
        "generator": _generator_health(agg),
        # Counted live against the per-request SLO (what the web UI shows); run.json's `goodput` is
        # the same rule applied to the record log, and also covers a judged window.
        "slo_live": {
            "judged": int(t.get("slo_judged", 0)),
            "good": int(t.get("slo_good", 0)),
            "good_output_tokens": int(t.get("slo_good_output_tokens", 0)),
        }
        if t.get("slo_judged")
        else None,
    }


def itl_merged(
    merged: int,
    timed: int,
    streams: int = 0,
    merged_streams: int = 0,
    burst: int = 0,
    burst_streams: int = 0,
    whole_streams: int = 0,
) -> dict[str, Any]:
    """Token gaps left out of ITL because their event arrived in one read with another (``gaps``), and
    their share of all token gaps (null without any); the streams judged for merged delivery and those
    delivered merged (metrics/delivery.py); the burst gaps left out of the streams delivered in bursts,
    and those streams with the ones re-sent whole (``whole_streams`` of them, their gaps kept in ITL);
    docs/metrics.md, "Merged gaps", "Merged delivery" and "Burst delivery"."""
    total = merged + burst + timed
    return {
        "gaps": merged,
        "share": round(merged / total, 6) if total else None,
        "streams": streams,
        "merged_streams": merged_streams,
        "burst_gaps": burst,
        "burst_streams": burst_streams + whole_streams,
        "whole_streams": whole_streams,
    }


def tokens_per_chunk(tokens: int, chunks: int) -> dict[str, Any]:
    """Output tokens of the ok streamed answers over their output-bearing chunks: 1 when every chunk
    carries one token, more with speculative decoding or batched chunks (docs/metrics.md)."""
    return {"tokens": tokens, "chunks": chunks, "mean": round(tokens / chunks, 4) if chunks else None}


def _counted_by(ok: int, usage_reports: int) -> str | None:
    """Whose output token count the figures use: every ok request's usage, none's, or some's."""
    if not ok:
        return None
    if usage_reports >= ok:
        return "server_usage"
    return "mixed" if usage_reports else "client_tokenizer"


def _generator_health(agg: Aggregate) -> dict[str, Any]:
    """How busy the generator itself was: CPU per process (percent of a core), a master's local processes
    together per core they may use, and schedule lag."""
    cpu = agg.hists["generator_cpu"]
    host = agg.hists["generator_host_cpu"]
    lag = agg.hists["schedule_lag"]
    has_cpu = cpu.get_total_count() > 0
    return {
        "cpu_samples": int(cpu.get_total_count()),
        "cpu_p50_percent": round((hdr.value_at(cpu, 50) or 0) / 10, 1) if has_cpu else None,
        "cpu_p90_percent": round((hdr.value_at(cpu, 90) or 0) / 10, 1) if has_cpu else None,
        "cpu_max_percent": round(cpu.get_max_value() / 10, 1) if has_cpu else None,
        "host_cpu_p90_percent": round((hdr.value_at(host, 90) or 0) / 10, 1)
        if host.get_total_count()
        else None,
        "schedule_lag_p99_ms": _ms(hdr.value_at(lag, 99)) if lag.get_total_count() else None,
    }
