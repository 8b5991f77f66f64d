"""``mlperf_log_summary.txt``: the run in MLPerf LoadGen's summary layout (field names as LoadGen prints them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

from loadtest.metrics import early_stopping as es
from loadtest.metrics import hdr
from loadtest.results.percentiles import decode

SUMMARY_NAME = "mlperf_log_summary.txt"
RULE = "=" * 48
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 97.0, 99.0, 99.9)
ESTIMATE_PERCENTILES: tuple[float, ...] = (90.0, 99.0, 99.9)
# (histogram, LoadGen's label for min/max/mean, its label in the percentile lines)
_STATS: tuple[tuple[str, str, str], ...] = (
    ("e2e", "latency", "latency"),
    ("ttft", "First Token latency", "first token latency"),
    ("tpot", "Time to Output Token", "time to output token"),
    ("itl", "Inter-token latency", "inter-token latency"),
)


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _yes(ok: bool) -> str:
    return "Yes" if ok else "NO"


def _num(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _ordinal(p: float) -> str:
    return f"{p:g}th"


def scenario_name(run: dict[str, Any]) -> str:
    """The LoadGen scenario the run's load corresponds to (Server, SingleStream), or our own name."""
    load = _get(run, "config", "load") or {}
    mode, arrival = load.get("mode"), load.get("arrival")
    if mode == "open" and load.get("rate") is not None:
        return "Server" if arrival in (None, "poisson") else f"Server ({arrival} arrivals)"
    if mode == "closed" and load.get("concurrency") is not None:
        n = load["concurrency"]
        return "SingleStream" if n == 1 else f"Concurrency ({n} streams)"
    if load.get("trace"):
        return "Trace replay"
    if load.get("stages"):
        return "Stages"
    return str(mode or "unknown")


def _checks(run: dict[str, Any]) -> list[dict[str, Any]]:
    return list(_get(run, "verdict", "checks") or [])


def _passed(run: dict[str, Any], pred: Any) -> bool:
    return all(c.get("passed") for c in _checks(run) if pred(c))


def _early_stopping(run: dict[str, Any], metric: str, label: str, hist: HdrHistogram | None) -> list[str]:
    lines = [f"{label} Early Stopping Result:"]
    for c in _checks(run):
        if c.get("name", "").startswith(f"early_stopping.{metric}_"):
            slo = c["name"].split(".", 1)[1]
            lines.append(
                f" * Run successful ({slo})."
                if c.get("passed")
                else f" * Run unsuccessful ({slo}): {c.get('detail', '')}."
            )
    n = int(hist.get_total_count()) if hist is not None else 0
    lines.append(f" * Processed {n} queries.")
    for p in ESTIMATE_PERCENTILES:
        est = es.percentile_estimate_from_histogram(hist, p / 100.0) if hist is not None else None
        if est is None:
            need = es.min_queries_for_percentile(p / 100.0)
            lines.append(
                f" * Early stopping {_ordinal(p)} percentile estimate: not enough queries (needs {need})"
            )
        else:
            lines.append(f" * Early stopping {_ordinal(p)} percentile estimate (ns): {est * 1000}")
    return lines


def _stats(hist: HdrHistogram | None, label: str, plabel: str) -> list[str]:
    if hist is None:
        return [f"{f'Min {label} (ns)':<44}: n/a"]
    s = hdr.summary(hist)
    lo, hi, mean = s["min"], s["max"], s["mean"]
    assert lo is not None and hi is not None and mean is not None  # decode() returns no empty histogram
    lines = [
        f"{f'Min {label} (ns)':<44}: {int(lo) * 1000}",
        f"{f'Max {label} (ns)':<44}: {int(hi) * 1000}",
        f"{f'Mean {label} (ns)':<44}: {round(float(mean) * 1000)}",
    ]
    for p, v in zip(PERCENTILES, hdr.fast_percentiles(hist, PERCENTILES), strict=True):
        lines.append(f"{f'{p:.2f} percentile {plabel} (ns)':<44}: {int(v or 0) * 1000}")
    return lines


def _limit(slos: dict[str, Any], metric: str) -> tuple[int, str]:
    """(limit in ns, judged percentile) of the metric's percentile SLO; (0, "n/a") without one."""
    for key, ms in sorted(slos.items()):
        if key.startswith(f"{metric}_p") and ms is not None:
            return round(float(ms) * 1e6), key.split("_p", 1)[1].replace("_", ".")
    return 0, "n/a"


def format_summary(run: dict[str, Any]) -> str:
    """The summary text for a loaded run.json."""
    m = run.get("metrics") or {}
    req, thr = m.get("requests") or {}, m.get("throughput") or {}
    cfg, load = run.get("config") or {}, _get(run, "config", "load") or {}
    verdict = run.get("verdict") or {}
    interrupted = run.get("status") == "interrupted"
    duration = float(_get(m, "window", "duration_s") or 0.0)
    valid = verdict.get("status") == "pass" and not interrupted
    hists = {name: decode(run, name) for name, _, _ in _STATS}
    endpoint = run.get("endpoint") or {}
    sut = f"{cfg.get('model') or 'unknown model'} @ {endpoint.get('url') or 'unknown endpoint'}"
    if endpoint.get("embedded"):
        sut += " (embedded simulator)"
    lines = [
        RULE,
        "MLPerf Results Summary",
        RULE,
        f"SUT name : {sut}",
        f"Scenario : {scenario_name(run)}",
        "Mode     : PerformanceOnly",
        f"Completed samples per second    : {_num(thr.get('requests_per_s'))}",
        f"Completed tokens per second: {_num(thr.get('output_tokens_per_s'))}",
        f"Result is : {'VALID' if valid else 'INVALID'}",
        f"  Performance constraints satisfied : {_yes(_passed(run, lambda c: c.get('kind') == 'slo'))}",
        f"  Min duration satisfied : {_yes(_passed(run, lambda c: c.get('name') == 'min_duration'))}",
        f"  Min queries satisfied : {_yes(_passed(run, lambda c: c.get('name') == 'min_queries'))}",
        "  Early stopping satisfied: "
        + _yes(_passed(run, lambda c: str(c.get("name", "")).startswith("early_stopping."))),
        f"  Generator health satisfied : {_yes(_passed(run, lambda c: c.get('kind') == 'health'))}",
        "  Run completed (not interrupted) : "
        + ("Yes" if not interrupted else f"NO ({run.get('interrupted_reason') or 'interrupted'})"),
        f"loadtest verdict : {verdict.get('status', 'none')} (exit {verdict.get('exit_code', 'n/a')})",
        *_early_stopping(run, "ttft", "TTFT", hists["ttft"]),
        *_early_stopping(run, "tpot", "TPOT", hists["tpot"]),
        "",
        RULE,
        "Additional Stats",
        RULE,
        f"Scheduled samples per second : {_num(req.get('completed', 0) / duration if duration else None)}",
        *_stats(hists["e2e"], "latency", "latency"),
        "",
        f"{'Completed tokens per second':<44}: {_num(thr.get('output_tokens_per_s'))}",
    ]
    for name, label, plabel in _STATS[1:]:
        lines += [*_stats(hists[name], label, plabel), ""]
    slos = cfg.get("slos") or {}
    judging = _get(cfg, "profile_resolved", "judging") or {}
    lines += [
        RULE,
        "Test Parameters Used",
        RULE,
        "samples_per_query : 1",
        f"target_qps : {load.get('rate') if load.get('rate') is not None else 0}",
        f"target_concurrency : {load.get('concurrency') if load.get('concurrency') is not None else 0}",
        f"arrival : {load.get('arrival') or 'n/a'}",
        f"ttft_latency (ns): {_limit(slos, 'ttft')[0]}",
        f"ttft_percentile : {_limit(slos, 'ttft')[1]}",
        f"tpot_latency (ns): {_limit(slos, 'tpot')[0]}",
        f"tpot_percentile : {_limit(slos, 'tpot')[1]}",
        f"min_duration (ms): {round(float(judging.get('min_duration_s') or 0) * 1000)}",
        f"max_duration (ms): {round(float(cfg.get('duration_s') or 0) * 1000)}",
        f"min_query_count : {judging.get('min_queries') or 0}",
        "max_query_count : 0",
        f"schedule_rng_seed : {cfg.get('seed', 'n/a')}",
        f"profile : {cfg.get('profile') or 'n/a'}",
        f"workload_fingerprint : {_get(run, 'workload', 'fingerprint') or 'n/a'}",
        f"tool : {_get(run, 'tool', 'name') or 'loadtest'} {_get(run, 'tool', 'version') or ''}".rstrip(),
        f"endpoint : {endpoint.get('url') or 'n/a'}",
        f"run_id : {run.get('run_id') or 'n/a'}",
        "",
    ]
    warnings = [c["detail"] for c in _checks(run) if not c.get("passed") and not c.get("blocking", True)]
    warnings += list(run.get("notes") or [])
    if interrupted:
        warnings.insert(0, f"the run was interrupted ({run.get('interrupted_reason') or 'unknown reason'})")
    if warnings:
        lines.append(f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''} encountered during test:")
        lines += [f" * {w}" for w in warnings]
    else:
        lines.append("No warnings encountered during test.")
    lines.append("")
    failed = {o: n for o, n in (req.get("by_outcome") or {}).items() if n and o != "ok"}
    if failed:
        total = sum(failed.values())
        what = ", ".join(f"{o} {n}" for o, n in failed.items())
        lines.append(f"{total} error{'s' if total != 1 else ''} encountered during test: {what}.")
    else:
        lines.append("No errors encountered during test.")
    return "\n".join(lines) + "\n"


def write_summary(run_dir: Path, run: dict[str, Any]) -> Path:
    """Write ``run_dir/mlperf_log_summary.txt`` and return its path."""
    path = Path(run_dir) / SUMMARY_NAME
    path.write_text(format_summary(run), encoding="utf-8")
    return path
