"""``mlperf_log_summary.txt``: the run in MLPerf LoadGen's summary layout (field names as LoadGen prints them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hdrh.histogram import HdrHistogram

from loadtest.contracts.run_document import Check, RunDocument
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


def _yes(ok: bool) -> str:
    return "Yes" if ok else "NO"


def _num(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _ordinal(p: float) -> str:
    return f"{p:g}th"


def scenario_name(run: RunDocument) -> str:
    """The LoadGen scenario the run's load corresponds to (Server, SingleStream), or our own name."""
    load = run.config.load
    if load.mode == "open" and load.rate is not None:
        return "Server" if load.arrival in (None, "poisson") else f"Server ({load.arrival} arrivals)"
    if load.mode == "closed" and load.concurrency is not None:
        n = load.concurrency
        return "SingleStream" if n == 1 else f"Concurrency ({n} streams)"
    if load.trace:
        return "Trace replay"
    if load.stages:
        return "Stages"
    return load.mode or "unknown"


def _checks(run: RunDocument) -> list[Check]:
    return list(run.verdict.checks) if run.verdict is not None else []


def _passed(run: RunDocument, pred: Callable[[Check], bool]) -> bool:
    return all(c.passed for c in _checks(run) if pred(c))


def _early_stopping(run: RunDocument, metric: str, label: str, hist: HdrHistogram | None) -> list[str]:
    lines = [f"{label} Early Stopping Result:"]
    for c in _checks(run):
        if c.name.startswith(f"early_stopping.{metric}_"):
            slo = c.name.split(".", 1)[1]
            lines.append(
                f" * Run successful ({slo})." if c.passed else f" * Run unsuccessful ({slo}): {c.detail}."
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


def _limit(slos: dict[str, float | None], metric: str) -> tuple[int, str]:
    """(limit in ns, judged percentile) of the metric's percentile SLO; (0, "n/a") without one."""
    for key, ms in sorted(slos.items()):
        if key.startswith(f"{metric}_p") and ms is not None:
            return round(float(ms) * 1e6), key.split("_p", 1)[1].replace("_", ".")
    return 0, "n/a"


def format_summary(run: RunDocument) -> str:
    """The summary text for a run.json document."""
    req, thr = run.metrics.requests, run.metrics.throughput
    cfg, load, verdict, endpoint = run.config, run.config.load, run.verdict, run.endpoint
    interrupted = run.status == "interrupted"
    duration = run.metrics.window.duration_s
    # LoadGen's validity: a smoke run's minimums are reported, not applied, but LoadGen applies them.
    valid = (
        verdict is not None
        and verdict.status == "pass"
        and not interrupted
        and _passed(run, lambda c: c.kind == "validity")
    )
    hists = {name: decode(run, name) for name, _, _ in _STATS}
    sut = f"{cfg.model or 'unknown model'} @ {endpoint.url or 'unknown endpoint'}"
    if endpoint.embedded:
        sut += " (embedded simulator)"
    lines = [
        RULE,
        "MLPerf Results Summary",
        RULE,
        f"SUT name : {sut}",
        f"Scenario : {scenario_name(run)}",
        "Mode     : PerformanceOnly",
        f"Completed samples per second    : {_num(thr.requests_per_s)}",
        f"Completed tokens per second: {_num(thr.output_tokens_per_s)}",
        f"Result is : {'VALID' if valid else 'INVALID'}",
        f"  Performance constraints satisfied : {_yes(_passed(run, lambda c: c.kind == 'slo'))}",
        f"  Min duration satisfied : {_yes(_passed(run, lambda c: c.name == 'min_duration'))}",
        f"  Min queries satisfied : {_yes(_passed(run, lambda c: c.name == 'min_queries'))}",
        "  Early stopping satisfied: " + _yes(_passed(run, lambda c: c.name.startswith("early_stopping."))),
        f"  Generator health satisfied : {_yes(_passed(run, lambda c: c.kind == 'health'))}",
        "  Run completed (not interrupted) : "
        + ("Yes" if not interrupted else f"NO ({run.interrupted_reason or 'interrupted'})"),
        f"loadtest verdict : {_verdict_text(run)}",
        *_early_stopping(run, "ttft", "TTFT", hists["ttft"]),
        *_early_stopping(run, "tpot", "TPOT", hists["tpot"]),
        "",
        RULE,
        "Additional Stats",
        RULE,
        f"Scheduled samples per second : {_num(req.completed / duration if duration else None)}",
        *_stats(hists["e2e"], "latency", "latency"),
        "",
        f"{'Completed tokens per second':<44}: {_num(thr.output_tokens_per_s)}",
    ]
    for name, label, plabel in _STATS[1:]:
        lines += [*_stats(hists[name], label, plabel), ""]
    slos = cfg.slos or {}
    judging = cfg.profile_resolved.get("judging") or {}
    lines += [
        RULE,
        "Test Parameters Used",
        RULE,
        "samples_per_query : 1",
        f"target_qps : {load.rate if load.rate is not None else 0}",
        f"target_concurrency : {load.concurrency if load.concurrency is not None else 0}",
        f"arrival : {load.arrival or 'n/a'}",
        f"ttft_latency (ns): {_limit(slos, 'ttft')[0]}",
        f"ttft_percentile : {_limit(slos, 'ttft')[1]}",
        f"tpot_latency (ns): {_limit(slos, 'tpot')[0]}",
        f"tpot_percentile : {_limit(slos, 'tpot')[1]}",
        f"min_duration (ms): {round(float(judging.get('min_duration_s') or 0) * 1000)}",
        f"max_duration (ms): {round(float(cfg.duration_s or 0) * 1000)}",
        f"min_query_count : {judging.get('min_queries') or 0}",
        "max_query_count : 0",
        f"schedule_rng_seed : {cfg.seed}",
        f"profile : {cfg.profile or 'n/a'}",
        f"workload_fingerprint : {run.workload.fingerprint or 'n/a'}",
        f"tool : {run.tool.name or 'loadtest'} {run.tool.version or ''}".rstrip(),
        f"endpoint : {endpoint.url or 'n/a'}",
        f"run_id : {run.run_id or 'n/a'}",
        "",
    ]
    warnings = [c.detail for c in _checks(run) if not c.passed and not c.blocking]
    warnings += run.notes
    if interrupted:
        warnings.insert(0, f"the run was interrupted ({run.interrupted_reason or 'unknown reason'})")
    if warnings:
        lines.append(f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''} encountered during test:")
        lines += [f" * {w}" for w in warnings]
    else:
        lines.append("No warnings encountered during test.")
    lines.append("")
    failed = {o: n for o, n in req.by_outcome.items() if n and o != "ok"}
    if failed:
        total = sum(failed.values())
        what = ", ".join(f"{o} {n}" for o, n in failed.items())
        lines.append(f"{total} error{'s' if total != 1 else ''} encountered during test: {what}.")
    else:
        lines.append("No errors encountered during test.")
    return "\n".join(lines) + "\n"


def _verdict_text(run: RunDocument) -> str:
    """The verdict's status and exit code, ``none (exit n/a)`` for a run without one."""
    v = run.verdict
    return f"{v.status} (exit {v.exit_code})" if v is not None else "none (exit n/a)"


def write_summary(run_dir: Path, run: RunDocument) -> Path:
    """Write ``run_dir/mlperf_log_summary.txt`` and return its path."""
    path = Path(run_dir) / SUMMARY_NAME
    path.write_text(format_summary(run), encoding="utf-8")
    return path
