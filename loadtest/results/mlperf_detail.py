"""``mlperf_log_detail.txt``: the run's settings and results as LoadGen's ``:::MLLOG`` JSON lines (its detail log)."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.contracts.run_document import RunDocument
from loadtest.metrics.samples import LatencySamples
from loadtest.results.mlperf_summary import (
    PERCENTILES,
    SS_PERCENTILE,
    SUMMARY_NAME,
    Distribution,
    LoadGenResult,
    load_samples,
    loadgen_result,
    render_summary,
)

DETAIL_NAME = "mlperf_log_detail.txt"
MARKER = ":::MLLOG "
Value = int | float | str | bool
# settings the summary prints as 0/1 and the detail log as JSON booleans
_BOOL_SETTINGS = {"print_timestamps", "performance_issue_unique", "performance_issue_same"}


def _six(v: float) -> float:
    """LoadGen logs a double with C++'s default six significant digits."""
    return float(f"{v:.6g}")


def _pct_key(p: float) -> str:
    return f"{p:.2f}"


def _latency_keys(dist: Distribution, prefix: str) -> list[tuple[str, Value]]:
    """min, max, mean and the percentiles of one metric under LoadGen's key names (``prefix``: the
    part after ``result_``: "" for latency, "first_token_" for TTFT)."""
    stats = dist.stats_ns()
    lo, hi, mean, pcts = stats if stats is not None else (0, 0, 0, [0] * len(PERCENTILES))
    out: list[tuple[str, Value]] = [
        (f"result_{prefix}min_latency_ns", lo),
        (f"result_{prefix}max_latency_ns", hi),
        (f"result_{prefix}mean_latency_ns", mean),
    ]
    out += [
        (f"result_{prefix}{_pct_key(p)}_percentile_latency_ns", v)
        for p, v in zip(PERCENTILES, pcts, strict=True)
    ]
    return out


def _tpot_keys(dist: Distribution) -> list[tuple[str, Value]]:
    stats = dist.stats_ns()
    lo, hi, mean, pcts = stats if stats is not None else (0, 0, 0, [0] * len(PERCENTILES))
    out: list[tuple[str, Value]] = [
        (f"result_time_per_output_token_{_pct_key(p)}_percentile_ns", v)
        for p, v in zip(PERCENTILES, pcts, strict=True)
    ]
    return out + [
        ("result_time_to_output_token_min", lo),
        ("result_time_to_output_token_max", hi),
        ("result_time_to_output_token_mean", mean),
    ]


def _settings(r: LoadGenResult) -> list[tuple[str, Value]]:
    params = {key: value for _, key, value in r.params}
    requested: list[tuple[str, Value]] = [
        ("requested_scenario", r.scenario),
        ("requested_test_mode", "PerformanceOnly"),
        ("requested_min_duration_ms", params["min_duration_ms"]),
        ("requested_max_duration_ms", params["max_duration_ms"]),
        ("requested_min_query_count", params["min_query_count"]),
        ("requested_max_query_count", params["max_query_count"]),
        ("requested_qsl_rng_seed", params["qsl_rng_seed"]),
        ("requested_sample_index_rng_seed", params["sample_index_rng_seed"]),
        ("requested_schedule_rng_seed", params["schedule_rng_seed"]),
        ("requested_use_token_latencies", True),
    ]
    if not r.offline:
        requested += [
            ("requested_server_ttft_latency", params["server_ttft_latency"]),
            ("requested_server_tpot_latency", params["server_tpot_latency"]),
        ]
    skip = {"server_ttft_latency", "server_tpot_latency"}
    effective: list[tuple[str, Value]] = [
        ("effective_scenario", r.scenario),
        ("effective_test_mode", "PerformanceOnly"),
        ("effective_target_latency_ns", 0),
        ("effective_target_latency_percentile", SS_PERCENTILE if r.single_stream else 0.99),
    ]
    effective += [
        (f"effective_{key}", bool(value) if key in _BOOL_SETTINGS else value)
        for _, key, value in r.params
        if key not in skip
    ]
    return requested + effective


def _results(r: LoadGenResult) -> list[tuple[str, Value]]:
    dists, n = r.dists, r.completed
    issued = r.samples.issued if r.samples is not None else n
    out: list[tuple[str, Value]] = [("result_validity", "VALID" if r.valid else "INVALID")]
    if r.scenario == "Server":
        out.append(("result_perf_constraints_met", r.perf_ok))
    out += [
        ("result_min_duration_met", r.duration_ok),
        ("result_min_queries_met", r.queries_ok),
        ("early_stopping_met", r.es_ok),
    ]
    if not r.valid:
        reasons = [line.removeprefix(" * ").strip() for line in r.recommendations]
        out.append(("result_invalid_reason", " ".join(x for x in reasons if x) + " "))
    out += [
        ("early_stopping_ttft_result", " ".join(r.es_blocks.get("TTFT", [""]))),
        ("early_stopping_tpot_result", " ".join(r.es_blocks.get("TPOT", [""]))),
        ("result_query_count", 1 if r.offline else issued),  # Offline: one query of every sample
    ]
    mean_ns = (dists["e2e"].stats_ns() or (0, 0, 0, []))[2]
    if r.scenario == "Server":
        # LoadGen counts over-latency samples against a sample latency target, none with token latencies
        out.append(("result_overlatency_query_count", 0))
        out.append(("result_scheduled_samples_per_sec", _six(r.rate)))
        out.append(
            ("result_completed_samples_per_sec", _six((n - 1) / r.duration_s if r.duration_s and n else 0.0))
        )
    elif r.single_stream:
        out += [
            ("result_qps_with_loadgen_overhead", _six(r.rate)),
            ("result_qps_without_loadgen_overhead", _six(1e9 / mean_ns if mean_ns else 0.0)),
            ("early_stopping_latency_ss", r.es_latency_ss or 0),
            ("early_stopping_latency_ms", r.es_latency_ms or 0),
        ]
    else:
        out.append(("result_samples_per_second", _six(n / r.duration_s if r.duration_s else 0.0)))
    out += _latency_keys(dists["e2e"], "")
    if r.offline:
        out.append(("result_tokens_per_second", _six(r.tokens_per_s)))
    else:
        out += _latency_keys(dists["ttft"], "first_token_")
        out += [
            (
                "result_token_throughput_with_loadgen_overhead",
                _six(r.tokens / r.issue_span_s if r.issue_span_s else 0.0),
            ),
            # LoadGen divides by the mean latency in ns times the sample count (its own unit)
            ("result_token_throughput", _six(r.tokens / (mean_ns * n) if mean_ns and n else 0.0)),
        ]
        out += _tpot_keys(dists["tpot"])
        out.append(("result_completed_tokens_per_second", _six(r.tokens_per_s)))
    return out


def _line(key: str, value: Value, time_ms: float, *, error: bool = False, warning: bool = False) -> str:
    entry = {
        "key": key,
        "value": value,
        "time_ms": round(time_ms, 6),
        "namespace": "mlperf::logging",
        "event_type": "POINT_IN_TIME",
        "metadata": {
            "is_error": error,
            "is_warning": warning,
            "file": "loadtest/results/mlperf_detail.py",
            "line_no": 0,
            "pid": 0,
            "tid": 0,
        },
    }
    return MARKER + json.dumps(entry, ensure_ascii=False)


def format_detail(r: LoadGenResult) -> str:
    """LoadGen's detail log of the result: the run's identity, settings, warnings and errors, results."""
    run = r.run
    end_ms = round(r.duration_s * 1000, 6)
    head: list[tuple[str, Value]] = [
        ("loadtest_version", f"{run.tool.name or 'loadtest'} {run.tool.version or ''}".rstrip()),
        ("test_datetime", run.created),
        ("sut_name", f"{run.config.model or 'unknown model'} @ {run.endpoint.url or 'unknown endpoint'}"),
        ("qsl_reported_total_count", r.completed),
        ("qsl_reported_performance_count", r.completed),
        *_settings(r),
        ("generated_query_count", r.samples.issued if r.samples is not None else r.completed),
    ]
    lines = [_line(k, v, 0.0) for k, v in head]
    lines += [_line("warning_generic_message", w, end_ms, warning=True) for w in r.warnings]
    lines += [
        _line("error_runtime", f"{count} requests ended {outcome}", end_ms, error=True)
        for outcome, count in r.failed.items()
    ]
    lines += [_line(k, v, end_ms) for k, v in _results(r)]
    lines.append(_line("num_errors", sum(r.failed.values()), end_ms))
    return "\n".join(lines) + "\n"


def write_detail(run_dir: Path, r: LoadGenResult) -> Path:
    """Write ``run_dir/mlperf_log_detail.txt`` and return its path."""
    path = Path(run_dir) / DETAIL_NAME
    path.write_text(format_detail(r), encoding="utf-8")
    return path


def write_loadgen_logs(
    run_dir: Path, run: RunDocument, samples: LatencySamples | None = None
) -> tuple[Path, Path]:
    """Write LoadGen's summary and detail logs of the run into ``run_dir`` (exact from the record log
    when the folder has it: ``samples`` when the caller read it already, else read here)."""
    if samples is None:
        samples = load_samples(run_dir, run)
    result = loadgen_result(run, samples)
    summary = Path(run_dir) / SUMMARY_NAME
    summary.write_text(render_summary(result), encoding="utf-8")
    return summary, write_detail(run_dir, result)
