"""``mlperf_log_summary.txt``: the run in MLPerf LoadGen's Server or Offline summary form, then loadtest's own section."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from hdrh.histogram import HdrHistogram

from loadtest.contracts.run_document import Check, RunDocument
from loadtest.metrics import early_stopping as es
from loadtest.metrics import hdr
from loadtest.metrics.samples import LatencySamples
from loadtest.results.percentiles import decode
from loadtest.results.record_log import read_lines, record_files

SUMMARY_NAME = "mlperf_log_summary.txt"
RULE = "=" * 48
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 97.0, 99.0, 99.9)
ESTIMATE_PERCENTILES: tuple[float, ...] = (90.0, 99.0, 99.9)
SS_PERCENTILE = 0.9  # LoadGen's SingleStream target latency percentile (test_settings.h)
OWN_SECTION = "loadtest Additional Results"
# LoadGen's labels, spacing included (mlcommons-loadgen 6.0.17, PerformanceSummary::LogSummary):
# (histogram, min/max/mean label, percentile label)
_LOADGEN_STATS: dict[str, tuple[str, str, str]] = {
    "e2e": (
        "{} latency (ns)                : ",
        "{} latency (ns)               : ",
        "{} percentile latency (ns)   : ",
    ),
    "ttft": (
        "{} First Token latency (ns)                : ",
        "{} First Token latency (ns)               : ",
        "{} percentile first token latency (ns)   : ",
    ),
    "tpot": (
        "{} Time per Output Token (ns)                : ",
        "{} Time per Output Token (ns)               : ",
        "{} percentile time to output token (ns)   : ",
    ),
}
_ITL_STATS = (
    "{} Inter-token latency (ns)                : ",
    "{} Inter-token latency (ns)               : ",
    "{} percentile inter-token latency (ns)   : ",
)
_DURATION_ADVICE = {
    "Offline": "Increase expected QPS so the loadgen pre-generates a larger (coalesced) query.",
    "Server": "Increase the target QPS so the loadgen pre-generates more queries.",
    "SingleStream": "Decrease the expected latency so the loadgen pre-generates more queries.",
}
_MORE_QUERIES = " with the run being successful if every additional\n query were under latency."


def _yes(ok: bool) -> str:
    return "Yes" if ok else "NO"


def _two(v: float) -> str:
    """LoadGen's DoubleToString: two decimals."""
    return f"{v:.2f}"


def load_shape(run: RunDocument) -> str:
    """The run's load in words (Server, Offline, SingleStream, Concurrency (n streams), …)."""
    load = run.config.load
    if load.mode == "open" and load.rate is not None:
        return "Server" if load.arrival in (None, "poisson") else f"Server ({load.arrival} arrivals)"
    if load.mode == "closed" and load.concurrency is not None:
        if "offline" in (run.config.profile or ""):
            return "Offline"
        n = load.concurrency
        return "SingleStream" if n == 1 else f"Concurrency ({n} streams)"
    if load.trace:
        return "Trace replay"
    if load.stages:
        return "Stages"
    return load.mode or "unknown"


def scenario_name(run: RunDocument) -> str:
    """The LoadGen form the run is written in: SingleStream (one stream), Offline, else Server."""
    shape = load_shape(run)
    return shape if shape in ("SingleStream", "Offline") else "Server"


def _checks(run: RunDocument) -> list[Check]:
    return list(run.verdict.checks) if run.verdict is not None else []


def _passed(run: RunDocument, pred: Callable[[Check], bool]) -> bool:
    return all(c.passed for c in _checks(run) if pred(c))


def _limit(slos: dict[str, float | None], metric: str) -> tuple[int, str]:
    """(limit in ns, judged percentile) of the metric's percentile SLO; (0, "n/a") without one."""
    for key, ms in sorted(slos.items()):
        if key.startswith(f"{metric}_p") and ms is not None:
            return round(float(ms) * 1e6), key.split("_p", 1)[1].replace("_", ".")
    return 0, "n/a"


class Distribution:
    """One metric's distribution in ns: the record log's exact samples, else the run.json histogram."""

    def __init__(self, metric: str, samples: LatencySamples | None, hist: HdrHistogram | None) -> None:
        self.metric = metric
        self.exact = samples if samples is not None and samples.count(metric) else None
        self.hist = hist

    @property
    def n(self) -> int:
        if self.exact is not None:
            return self.exact.count(self.metric)
        return int(self.hist.get_total_count()) if self.hist is not None else 0

    def stats_ns(self) -> tuple[int, int, int, list[int]] | None:
        """min, max, mean and PERCENTILES, in integer ns (LoadGen prints integers)."""
        if self.exact is not None:
            v = self.exact.values(self.metric)
            pcts = [round(float(v[hdr.loadgen_index(len(v), p)]) * 1000) for p in PERCENTILES]
            return round(float(v[0]) * 1000), round(float(v[-1]) * 1000), int(float(v.mean()) * 1000), pcts
        if self.hist is None:
            return None
        s = hdr.summary(self.hist)
        lo, hi, mean = s["min"], s["max"], s["mean"]
        assert lo is not None and hi is not None and mean is not None  # decode() returns no empty histogram
        pcts = [int(v or 0) * 1000 for v in hdr.fast_percentiles(self.hist, PERCENTILES)]
        return int(lo) * 1000, int(hi) * 1000, int(float(mean) * 1000), pcts

    def percentile_ns(self, p: float) -> int | None:
        """LoadGen's p-th percentile (p in PERCENTILES, percent), ns; None without samples."""
        stats = self.stats_ns()
        return None if stats is None else stats[3][PERCENTILES.index(p)]

    def estimate_ns(self, p: float) -> int | None:
        """The early-stopping estimate of the p-th percentile (p in percent), ns."""
        if self.exact is not None:
            est = self.exact.estimate(self.metric, p / 100.0)
            return None if est is None else round(est * 1000)
        if self.hist is None:
            return None
        est_h = es.percentile_estimate_from_histogram(self.hist, p / 100.0)
        return None if est_h is None else est_h * 1000


def _stat_lines(dist: Distribution, labels: tuple[str, str, str]) -> list[str]:
    stats = dist.stats_ns()
    lo_label, mean_label, p_label = labels
    if stats is None:
        return [lo_label.format("Min") + "n/a"]
    lo, hi, mean, pcts = stats
    lines = [
        lo_label.format("Min") + str(lo),
        lo_label.format("Max") + str(hi),
        mean_label.format("Mean") + str(mean),
    ]
    lines += [p_label.format(_two(p)) + str(v) for p, v in zip(PERCENTILES, pcts, strict=True)]
    return lines


def _early_stopping_result(run: RunDocument, metric: str) -> list[str]:
    """LoadGen's Server early-stopping lines for the metric's judged percentile SLO (an empty line
    without one: LoadGen prints its empty recommendation)."""
    for c in _checks(run):
        if c.name.startswith(f"early_stopping.{metric}_p"):
            if c.passed:
                return [" * Run successful."]
            n, need = int(c.value or 0), int(c.limit or 0)
            return [
                " * Run unsuccessful.",
                f" * Processed {n} queries.",
                f" * Would need to run at least {max(need - n, 0)} more queries,",
                *_MORE_QUERIES.split("\n"),
            ]
    return [""]


def _recommendations(r: LoadGenResult) -> list[str]:
    """LoadGen's recommendation lines for an invalid result, in its order."""
    out = []
    if not r.perf_ok:
        slo_failed = [c.name for c in _checks(r.run) if c.kind == "slo" and not c.passed]
        ttft = any(name.startswith("ttft_") for name in slo_failed)
        tpot = any(name.startswith("tpot_") for name in slo_failed)
        if ttft:
            out.append(" * TTFT constrain not met: Reduce target QPS to improve latency.")
        if tpot:
            out.append(" * TPOT constrain not met: Reduce target QPS to improve latency.")
        if not ttft and not tpot:
            out.append(" * Reduce target QPS to improve latency.")
    if not r.duration_ok:
        out.append(" * " + _DURATION_ADVICE[r.scenario])
    if not r.queries_ok:
        out += [
            " * The test exited early, before enough queries were issued.",
            "   See the detailed log for why this may have occurred.",
        ]
    return out


def _count_line(n: int, one: str, many: str, none: str) -> str:
    if n == 0:
        return none
    return (
        f"1 {one} encountered. See detailed log." if n == 1 else f"{n} {many} encountered. See detailed log."
    )


def _ss_early_stopping(dist: Distribution) -> tuple[bool, list[str], int | None, int | None]:
    """LoadGen's SingleStream early-stopping lines for one metric (``PerformanceSummary::EarlyStopping``):
    (met, lines, the p90 estimate, the p99 estimate) in ns."""
    n, floor = dist.n, es.min_queries_for_percentile(SS_PERCENTILE)
    if n < floor:
        return (
            False,
            [
                f" * Only processed {n} queries.",
                f" * Need to process at least {floor} queries for early stopping.",
            ],
            None,
            None,
        )
    t = es.estimate_t(n, SS_PERCENTILE) or 1
    est = dist.estimate_ns(SS_PERCENTILE * 100)
    lines = [
        f" * Processed at least {floor} queries ({n}).",
        f" * Would discard {t - 1} highest latency queries.",
        f" * Early stopping {SS_PERCENTILE * 100:.1f}th percentile estimate: {est}",
    ]
    est99 = dist.estimate_ns(99.0)
    if est99 is None:
        lines += [
            " * Not enough queries processed for 99.0th percentile",
            " early stopping estimate (would need to process at",
            f" least {es.min_queries_for_percentile(0.99)} total queries).",
        ]
    else:
        lines.append(f" * Early stopping 99.0th percentile estimate: {est99}")
    return True, lines, est, est99


@dataclass
class LoadGenResult:
    """What LoadGen's summary and detail logs say of a run, computed once for both files."""

    run: RunDocument
    samples: LatencySamples | None
    scenario: str
    hists: dict[str, HdrHistogram | None]
    dists: dict[str, Distribution]
    perf_ok: bool
    duration_ok: bool
    queries_ok: bool
    es_ok: bool
    valid: bool
    recommendations: list[str]
    es_blocks: dict[str, list[str]]
    es_latency_ss: int | None
    es_latency_ms: int | None
    completed: int
    duration_s: float
    tokens: int
    tokens_per_s: float
    rate: float  # Server: scheduled samples/s; SingleStream: QPS with the generator's overhead
    issue_span_s: float  # from the first to the last scheduled query (the window without the record log)
    params: list[tuple[str, str, int | float | str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    failed: dict[str, int] = field(default_factory=dict)

    @property
    def offline(self) -> bool:
        return self.scenario == "Offline"

    @property
    def single_stream(self) -> bool:
        return self.scenario == "SingleStream"


def loadgen_result(run: RunDocument, samples: LatencySamples | None = None) -> LoadGenResult:
    """The run's LoadGen figures and flags; ``samples``: the record log's exact values (the histograms'
    otherwise)."""
    req, thr = run.metrics.requests, run.metrics.throughput
    scenario = scenario_name(run)
    offline, ss = scenario == "Offline", scenario == "SingleStream"
    interrupted = run.status == "interrupted"
    duration = run.metrics.window.duration_s
    hists = {name: decode(run, name) for name in ("e2e", "ttft", "tpot", "itl")}
    dists = {name: Distribution(name, samples, hists[name]) for name in ("e2e", "ttft", "tpot")}
    perf_ok = True if ss else _passed(run, lambda c: c.kind == "slo")
    duration_ok = _passed(run, lambda c: c.name == "min_duration")
    queries_ok = _passed(run, lambda c: c.name == "min_queries")
    es_latency_ss = es_latency_ms = None
    if ss:  # LoadGen evaluates TPOT first and TTFT only when TPOT met its floor
        tpot_ok, tpot_lines, _, _ = _ss_early_stopping(dists["tpot"])
        ttft_ok, ttft_lines, es_latency_ss, es_latency_ms = (
            _ss_early_stopping(dists["ttft"]) if tpot_ok else (False, [""], None, None)
        )
        es_ok = tpot_ok and ttft_ok
        es_blocks = {"TTFT": ttft_lines, "TPOT": tpot_lines}
    else:
        es_ok = _passed(run, lambda c: c.name.startswith("early_stopping."))
        es_blocks = (
            {}
            if offline
            else {"TTFT": _early_stopping_result(run, "ttft"), "TPOT": _early_stopping_result(run, "tpot")}
        )
    # LoadGen's validity: duration, queries, constraints and early stopping (a smoke run's minimums are
    # reported, not applied, by the verdict: LoadGen applies them); a run that is not a pass or was
    # interrupted is not valid either.
    valid = (
        run.verdict is not None
        and run.verdict.status == "pass"
        and not interrupted
        and es_ok
        and _passed(run, lambda c: c.kind == "validity")
    )
    completed = req.completed
    tokens_per_s = thr.output_tokens_per_s or 0.0
    tokens = run.metrics.tokens.output_total
    span = _issue_span(samples) or duration
    rate = (
        (samples.issued - 1) / span
        if samples is not None and _issue_span(samples)
        else _per_s(completed, duration)
    )
    warnings = [c.detail for c in _checks(run) if not c.passed and not c.blocking]
    warnings += run.notes
    if interrupted:
        warnings.insert(0, f"the run was interrupted ({run.interrupted_reason or 'unknown reason'})")
    out = LoadGenResult(
        run=run,
        samples=samples,
        scenario=scenario,
        hists=hists,
        dists=dists,
        perf_ok=perf_ok,
        duration_ok=duration_ok,
        queries_ok=queries_ok,
        es_ok=es_ok,
        valid=valid,
        recommendations=[],
        es_blocks=es_blocks,
        es_latency_ss=es_latency_ss,
        es_latency_ms=es_latency_ms,
        completed=completed,
        duration_s=duration,
        tokens=tokens,
        tokens_per_s=tokens_per_s,
        rate=rate,
        issue_span_s=span,
        warnings=warnings,
        failed={o: n for o, n in req.by_outcome.items() if n and o != "ok"},
    )
    out.recommendations = [] if valid else _recommendations(out)
    out.params = _params(out)
    return out


def _params(r: LoadGenResult) -> list[tuple[str, str, int | float | str]]:
    """LoadGen's test parameters: (summary label, detail key suffix, value)."""
    cfg, load = r.run.config, r.run.config.load
    slos = cfg.slos or {}
    judging = cfg.profile_resolved.get("judging") or {}
    min_queries = int(judging.get("min_queries") or 0)
    qsl_seed, index_seed, schedule_seed = loadgen_seeds(r.run)
    if r.single_stream:
        target_qps: float = r.rate
    else:
        target_qps = load.rate if load.rate is not None else 0
    return [
        ("samples_per_query : ", "samples_per_query", r.completed if r.offline else 1),
        ("target_qps : ", "target_qps", target_qps),
        ("ttft_latency (ns): ", "server_ttft_latency", _limit(slos, "ttft")[0]),
        ("tpot_latency (ns): ", "server_tpot_latency", _limit(slos, "tpot")[0]),
        ("max_async_queries : ", "max_async_queries", 1 if r.offline or r.single_stream else 0),
        ("min_duration (ms): ", "min_duration_ms", round(float(judging.get("min_duration_s") or 0) * 1000)),
        ("max_duration (ms): ", "max_duration_ms", round(float(cfg.duration_s or 0) * 1000)),
        ("min_query_count : ", "min_query_count", max(min_queries, 1) if r.offline else min_queries),
        ("max_query_count : ", "max_query_count", 0),
        ("qsl_rng_seed : ", "qsl_rng_seed", qsl_seed),
        ("sample_index_rng_seed : ", "sample_index_rng_seed", index_seed),
        ("schedule_rng_seed : ", "schedule_rng_seed", schedule_seed),
        ("accuracy_log_rng_seed : ", "accuracy_log_rng_seed", 0),
        ("accuracy_log_probability : ", "accuracy_log_probability", 0),
        ("accuracy_log_sampling_target : ", "accuracy_log_sampling_target", 0),
        ("print_timestamps : ", "print_timestamps", 0),
        ("performance_issue_unique : ", "performance_issue_unique", 0),
        ("performance_issue_same : ", "performance_issue_same", 0),
        ("performance_issue_same_index : ", "performance_issue_same_index", 0),
        ("performance_sample_count : ", "performance_sample_count", r.completed),
        ("accuracy_sample_count : ", "accuracy_sample_count", 0),
    ]


def loadgen_seeds(run: RunDocument) -> tuple[int, int, int]:
    """(qsl, sample index, schedule) seeds: a seed set's (its sample index seed also picks the samples),
    else the run's one seed for all three."""
    seeds = run.config.seed_set
    if seeds is not None:
        return seeds.sample_index_rng_seed, seeds.sample_index_rng_seed, seeds.scheduler_rng_seed
    return run.config.seed, run.config.seed, run.config.seed


def _fmt(v: int | float | str) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def format_summary(run: RunDocument, samples: LatencySamples | None = None) -> str:
    """The summary text for a run.json document; ``samples``: the record log's exact values (the
    histograms' otherwise)."""
    return render_summary(loadgen_result(run, samples))


def render_summary(r: LoadGenResult) -> str:
    """LoadGen's summary form of the result (``PerformanceSummary::LogSummary``), then our own section."""
    run, dists = r.run, r.dists
    cfg, endpoint = run.config, run.endpoint
    completed, duration, tokens_per_s = r.completed, r.duration_s, r.tokens_per_s
    sut = f"{cfg.model or 'unknown model'} @ {endpoint.url or 'unknown endpoint'}"
    if endpoint.embedded:
        sut += " (embedded simulator)"
    lines = [
        RULE,
        "MLPerf Results Summary",
        RULE,
        f"SUT name : {sut}",
        f"Scenario : {r.scenario}",
        "Mode     : PerformanceOnly",
    ]
    if r.offline:
        lines += [
            f"Samples per second: {completed / duration if duration else 0.0:.6g}",
            f"Tokens per second: {tokens_per_s:.6g}",
        ]
    elif r.single_stream:
        pct = f"{SS_PERCENTILE * 100:.1f}th"
        lines += [
            f"{pct} percentile latency (ns) : {_pct_ns(dists['e2e'], SS_PERCENTILE)}",
            f"{pct} first token percentile latency (ns) : {_pct_ns(dists['ttft'], SS_PERCENTILE)}",
        ]
    else:  # (n − 1) completed over the time to the last completion (LoadGen: one sample opens the range)
        lines += [
            f"Completed samples per second    : {_two((completed - 1) / duration if duration and completed else 0.0)}",
            f"Completed tokens per second: {_two(tokens_per_s)}",
        ]
    lines.append(f"Result is : {'VALID' if r.valid else 'INVALID'}")
    if r.scenario == "Server":
        lines.append(f"  Performance constraints satisfied : {_yes(r.perf_ok)}")
    lines += [
        f"  Min duration satisfied : {_yes(r.duration_ok)}",
        f"  Min queries satisfied : {_yes(r.queries_ok)}",
        f"  Early stopping satisfied: {_yes(r.es_ok)}",
    ]
    if not r.valid:
        lines += ["Recommendations:", *r.recommendations]
    for label, block in r.es_blocks.items():
        lines += [f"{label} Early Stopping Result:", *block]
    lines += ["", RULE, "Additional Stats", RULE]
    if r.single_stream:
        mean_s = _mean_s(dists["e2e"])
        lines += [
            f"QPS w/ loadgen overhead         : {_two(r.rate)}",
            f"QPS w/o loadgen overhead        : {_two(1 / mean_s if mean_s else 0.0)}",
            "",
        ]
    elif not r.offline:
        lines.append(f"Scheduled samples per second : {_two(r.rate)}")
    lines += _stat_lines(dists["e2e"], _LOADGEN_STATS["e2e"])
    lines.append("")
    if r.offline:
        lines.append("")
    else:
        if r.single_stream:
            mean_s = _mean_s(dists["e2e"])
            lines += [
                f"TPS w/ loadgen overhead         : {_two(r.tokens / r.issue_span_s if r.issue_span_s else 0.0)}",
                f"TPS w/o loadgen overhead        : {_two(r.tokens / (mean_s * completed) if mean_s and completed else 0.0)}",
            ]
        else:
            lines.append(f"{'Completed tokens per second':<44}: {_two(tokens_per_s)}")
        lines += _stat_lines(dists["ttft"], _LOADGEN_STATS["ttft"])
        lines.append("")
        lines += _stat_lines(dists["tpot"], _LOADGEN_STATS["tpot"])
        lines.append("")
    lines += [RULE, "Test Parameters Used", RULE]
    lines += [label + _fmt(value) for label, _, value in r.params]
    lines.append("")
    lines.append(_count_line(len(r.warnings), "warning", "warnings", "No warnings encountered during test."))
    lines.append("")
    lines.append(_count_line(sum(r.failed.values()), "ERROR", "ERRORS", "No errors encountered during test."))
    lines += _own_section(run, r.hists, dists, r.warnings, r.failed)
    return "\n".join(lines) + "\n"


def _pct_ns(dist: Distribution, p: float) -> int:
    """LoadGen's p-th percentile (p a fraction) of the metric, ns (0 without samples)."""
    value = dist.percentile_ns(p * 100)
    return 0 if value is None else value


def _mean_s(dist: Distribution) -> float:
    stats = dist.stats_ns()
    return 0.0 if stats is None else stats[2] / 1e9


def _issue_span(samples: LatencySamples | None) -> float:
    """Seconds from the first to the last scheduled query of the record log (0 without it)."""
    if samples is None or samples.issued < 2 or samples.first_scheduled is None:
        return 0.0
    return max((samples.last_scheduled or 0.0) - samples.first_scheduled, 0.0)


def _per_s(n: int, seconds: float) -> float:
    return n / seconds if seconds else 0.0


def _own_section(
    run: RunDocument,
    hists: dict[str, HdrHistogram | None],
    dists: dict[str, Distribution],
    warnings: list[str],
    failed: dict[str, int],
) -> list[str]:
    """What LoadGen's file has no place for: our verdict, the checks LoadGen does not make, the
    early-stopping estimates, ITL, the run's identity, the warnings and errors spelled out."""
    cfg, load, endpoint = run.config, run.config.load, run.endpoint
    interrupted = run.status == "interrupted"
    v = run.verdict
    lines = [
        "",
        RULE,
        OWN_SECTION,
        RULE,
        f"loadtest verdict : {f'{v.status} (exit {v.exit_code})' if v is not None else 'none (exit n/a)'}",
        f"  Generator health satisfied : {_yes(_passed(run, lambda c: c.kind == 'health'))}",
        "  Run completed (not interrupted) : "
        + ("Yes" if not interrupted else f"NO ({run.interrupted_reason or 'interrupted'})"),
    ]
    for c in _checks(run):
        if c.name.startswith("early_stopping."):
            lines.append(f" * {c.name}: {'passed' if c.passed else 'failed'}: {c.detail}")
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
        dist = dists[metric]
        lines.append(f"{label} early stopping estimates ({dist.n} queries):")
        for p in ESTIMATE_PERCENTILES:
            est = dist.estimate_ns(p)
            if est is None:
                need = es.min_queries_for_percentile(p / 100.0)
                lines.append(f" * p{p:g} early-stopping estimate: not enough queries (needs {need})")
            else:
                lines.append(f" * p{p:g} early-stopping estimate (ns): {est}")
    lines += ["", *_stat_lines(Distribution("itl", None, hists["itl"]), _ITL_STATS), ""]
    lines += [
        f"load_shape : {load_shape(run)}",
        f"target_concurrency : {load.concurrency if load.concurrency is not None else 0}",
        f"arrival : {load.arrival or 'n/a'}",
        f"ttft_percentile : {_limit(cfg.slos or {}, 'ttft')[1]}",
        f"tpot_percentile : {_limit(cfg.slos or {}, 'tpot')[1]}",
        f"percentile_rule : sorted[floor(n * p)] ({'record log' if dists['e2e'].exact is not None else 'histogram'})",
        f"profile : {cfg.profile or 'n/a'}",
        f"workload_fingerprint : {run.workload.fingerprint or 'n/a'}",
        f"tool : {run.tool.name or 'loadtest'} {run.tool.version or ''}".rstrip(),
        f"endpoint : {endpoint.url or 'n/a'}",
        f"run_id : {run.run_id or 'n/a'}",
        *_seed_set_lines(run),
        "",
    ]
    if warnings:
        lines.append(f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''} encountered during test:")
        lines += [f" * {w}" for w in warnings]
    if failed:
        total = sum(failed.values())
        what = ", ".join(f"{o} {n}" for o, n in failed.items())
        lines.append(f"{total} error{'s' if total != 1 else ''} encountered during test: {what}.")
    return lines


def _seed_set_lines(run: RunDocument) -> list[str]:
    """The seed set the run's seeds came from (--seed-set), for our section; none without one."""
    ss = run.config.seed_set
    if ss is None:
        return []
    return [
        f"seed_set : {Path(ss.file).name} cohort {ss.cohort} set {ss.set} (sha256 {ss.sha256})",
        f"model_seed : {ss.model_seed}",
    ]


def load_samples(run_dir: Path, run: RunDocument, batch: int = 20_000) -> LatencySamples | None:
    """The exact samples of the run's record logs (those run.json names, else every one in the
    folder); None when the folder has none."""
    named = [Path(run_dir) / Path(n).name for n in run.files.records]
    paths = [p for p in named if p.is_file()] or record_files(Path(run_dir))
    if not paths:
        return None
    samples = LatencySamples()
    lines = read_lines(paths)
    while part := list(islice(lines, batch)):
        samples.add(part)
    return samples
