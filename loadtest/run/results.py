"""A finished run's results: the record log read in bounded batches, the whole run's and the judged
window's metrics, the providers' sections and checks, the verdict (judged once, from every check),
run.json, report.html and mlperf_log_summary.txt, the JUnit XML, the console summary and the exit code."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtest.client.failures import FailureTally, stopped_early_text
from loadtest.contracts.record_line import RecordLine
from loadtest.contracts.run_document import RUN_FILE, RunDocument, from_data, write_run_document
from loadtest.errors import EXIT_COULD_NOT_RUN
from loadtest.locust.settings import RunSettings, load_mode
from loadtest.metrics.judged_scan import JudgingScan, LineAggregator
from loadtest.metrics.samples import LatencySamples
from loadtest.metrics.slo import AnySlo
from loadtest.metrics.summary import build_metrics
from loadtest.metrics.verdict import ValidityRules, Verdict, headline, health_warnings, judge, junit_xml
from loadtest.profile.schema import Profile
from loadtest.report.run_report import VERDICT_LABELS
from loadtest.results.record_log import read_lines
from loadtest.results.run_json import build_run_document
from loadtest.run.endpoint import EndpointFacts
from loadtest.run.providers import (
    Contribution,
    EconomicsProvider,
    EmbeddingsProvider,
    EndpointsProvider,
    Provider,
    QualityProvider,
    RerankProvider,
    TelemetryProvider,
    TokensProvider,
    endpoint_extras,
)
from loadtest.telemetry import TelemetryPoller
from loadtest.workload.builder import Workload
from loadtest.workload.salt import describe_run_salt

if TYPE_CHECKING:  # importing locust monkey-patches the process: only where a run happens
    from loadtest.locust.runtime import RunOutcome

EXIT_OK = 0
SMOKE_NOTE = (
    "smoke run (--smoke): the profile's minimum duration and query count were reported, not applied; "
    "this is not a compliant result"
)
EXIT_INTERRUPTED = {"SIGINT": 130, "SIGTERM": 143}
BATCH_LINES = 20_000  # record-log lines held at once while the results are computed


@dataclass
class FinishedRun:
    """What ``finalize`` judges: the run's settings, the profile and workload it ran (judging settings
    applied), the SLOs, what the runtime handed back and where, the endpoint, its telemetry poller,
    the notes of the checks before the run, and where the JUnit XML goes (None: nowhere)."""

    settings: RunSettings
    profile: Profile
    workload: Workload
    slos: list[AnySlo]
    outcome: RunOutcome
    out: Path
    endpoint: EndpointFacts
    telemetry: TelemetryPoller | None = None
    early_notes: list[str] = field(default_factory=list)
    junit: str | None = None


@dataclass
class Finalized:
    """run.json as written, its verdict, the files written, the console lines and the exit code."""

    doc: RunDocument
    verdict: Verdict
    run_json: Path
    report: Path
    lines: list[str]
    exit_code: int


def line_batches(paths: list[Path], size: int = BATCH_LINES) -> Iterator[list[RecordLine]]:
    """The record logs' lines, in log order, ``size`` at a time."""
    lines = read_lines(paths)
    while batch := list(islice(lines, size)):
        yield batch


def finalize(run: FinishedRun) -> Finalized:
    """Everything after the load: run.json, report.html, mlperf_log_summary.txt, the JUnit XML; the
    console lines (summary, paths, warnings, the verdict line last) and the exit code (the verdict's,
    or 130/143 for a run a signal ended)."""
    from loadtest.report import format_summary, render_run_report

    settings, profile, workload, outcome, out = run.settings, run.profile, run.workload, run.outcome, run.out
    doc = build_run_document(
        run_id=settings.run_id,
        status="interrupted" if outcome.interrupted_reason else "completed",
        interrupted_reason=outcome.interrupted_reason,
        config=run_config(settings, profile, workload),
        endpoint=endpoint_section(settings, run.endpoint),
        fingerprint=workload.fingerprint(),
        aggregates=outcome.aggregates,
        record_files=outcome.record_files,
        notes=_notes(run),
        datasets=workload.dataset_summary(),
    )
    judging = profile.judging
    per_scenario = len(profile.scenarios) > 1
    tokens = TokensProvider(settings, workload)
    extras: list[Provider] = [EndpointsProvider(settings.hosts, settings.balance)] if settings.hosts else []
    extras += [
        EmbeddingsProvider(),
        RerankProvider(),
        EconomicsProvider(),
        QualityProvider(profile.quality, run.slos),
    ]
    server = TelemetryProvider(run.telemetry, outcome.started_epoch or None)

    # Pass one over the record log: failures, the judged window's columns, the providers' figures.
    paths = [out / f for f in outcome.record_files]
    scan = JudgingScan(judging.warmup_s, judging.cooldown_s, run.slos, per_scenario)
    failures = FailureTally()
    samples = LatencySamples()  # the exact values behind the reported percentiles (LoadGen's rule)
    for batch in line_batches(paths):
        scan.add(batch)
        failures.add(batch)
        samples.add(batch)
        for p in extras:
            p.add(batch)
    judged = scan.window()
    # Pass two, for a judged window: its metrics rebuilt from the lines inside it, and its failures.
    judged_failures, judged_aggregates, judged_samples = failures, None, samples
    if judged.window is not None:
        aggregator, judged_failures, judged_samples = (
            LineAggregator(per_scenario),
            FailureTally(),
            LatencySamples(),
        )
        for batch in line_batches(paths):
            inside = [ln for ln in batch if judged.contains(ln)]
            aggregator.add(inside)
            judged_failures.add(inside)
            judged_samples.add(inside)
        judged_aggregates = aggregator.result()

    tokens_part = tokens.contribute(doc)  # run.json `tokens`; a note when counted with a guess
    _apply(doc, tokens_part)
    failed = failures.note()
    if failed:
        doc["notes"].append(failed)
    merged = merged_gaps_note(doc["metrics"]["itl_merged"])
    if merged:
        doc["notes"].append(merged)
    stop_cause = None
    if outcome.stopped_early:  # the endpoint failed wholesale: the cause leads the notes and the verdict
        stop_cause = stopped_early_text(
            outcome.stopped_early, doc["metrics"]["requests"], failures.commonest()
        )
        doc["stopped_early"] = {**outcome.stopped_early, "reason": f"stopped early: {stop_cause}"}
        doc["notes"].insert(0, f"stopped early: {stop_cause}")
    # The judged window (default warm-up: metrics/judged.py) and the generator's steady-state health.
    if judged.note:
        doc["notes"].append(judged.note)
    metrics, hists = doc["metrics"], outcome.aggregates.all.hists
    _exact(metrics, samples)
    if judged.window is not None and judged_aggregates is not None:
        metrics, hists = build_metrics(judged_aggregates.all), judged_aggregates.all.hists
        _exact(metrics, judged_samples)
        doc["judged"] = {"window": judged.window.to_dict(), "metrics": metrics}
    doc["config"]["judging"] = {
        **judged.config,
        "generator_health": judging.generator_health,
        "smoke": judging.smoke,
    }
    if judging.smoke:  # the first note: whatever the verdict, this is not a compliant result
        doc["notes"].insert(0, SMOKE_NOTE)
    doc["generator_health"] = judged.health
    gp = scan.goodput(judged)
    if gp is not None:
        doc["goodput"] = gp
    # per-endpoint, embeddings, rerank, economics: into `metrics`, so over the whole run like the rest of it
    parts = [tokens_part]
    for p in extras:
        part = p.contribute(doc)
        _apply(doc, part)
        parts.append(part)
    # The server's view (telemetry, prefix cache): its notes are remarks, not reasons; run.json has
    # its sections after the verdict.
    remarks = server.contribute(doc)
    health = {
        "schedule_lag_p99_ms": judged.health["schedule_lag_p99_ms"],
        "startup_s": judged.health["startup_s"],
        # Sustained load, not a start-up spike: the 90th percentile of the per-second samples.
        "cpu_percent": doc["metrics"]["generator"]["cpu_p90_percent"],
    }
    rules = ValidityRules(
        min_duration_s=judging.min_duration_s,
        min_queries=judging.min_queries,
        generator_health=judging.generator_health,
        smoke=judging.smoke,
    )
    verdict = judge(
        metrics,
        hists,
        run.slos,
        rules,
        health,
        failure=judged_failures.commonest(),
        stopped_early=stop_cause,
        extra_checks=[check for part in [*parts, remarks] for check in part.checks],
        notes=doc["notes"],
        samples=judged_samples,
    )
    doc["verdict"] = verdict.to_dict()
    doc["config"]["slos"] = {s.key: getattr(s, "limit_ms", getattr(s, "limit", None)) for s in run.slos}
    _apply(doc, remarks)
    document = from_data(doc, out / RUN_FILE)  # the schema refuses a section it does not describe
    run_json = write_run_document(out, document)
    report = render_run_report(out)
    lines = [format_summary(document), f"run.json: {run_json}", f"report:   {report}"]
    if run.junit:
        Path(run.junit).write_text(
            junit_xml(verdict, f"loadtest.{profile.name}", time_s=metrics["window"]["duration_s"])
        )
        lines.append(f"junit:    {run.junit}")
    code = (
        EXIT_INTERRUPTED.get(outcome.signal or "", EXIT_COULD_NOT_RUN)
        if outcome.interrupted_reason
        else verdict.exit_code
    )
    # The reasons, one a line with its fix (a passing run's: the generator-health warnings), then the
    # verdict line, last.
    # An interrupted run (a signal, a lost worker) says so first: what happened to the run comes
    # before what its partial figures say about the endpoint.
    interrupted = [f"interrupted: {outcome.interrupted_reason}"] if outcome.interrupted_reason else []
    lines += reason_lines(interrupted + (verdict.reasons if not verdict.passed else health_warnings(verdict)))
    lines.append(verdict_line(verdict, code, judging.smoke, outcome.interrupted_reason))
    return Finalized(document, verdict, run_json, report, lines, code)


def _exact(metrics: dict[str, Any], samples: LatencySamples) -> None:
    """The latency figures of ``metrics`` from the exact samples, and tps_per_user from their TPOT p90."""
    samples.apply(metrics["latency_ms"])
    tpot_p90 = metrics["latency_ms"]["tpot"]["p90"]
    metrics["throughput"]["tps_per_user"] = round(1000.0 / tpot_p90, 3) if tpot_p90 else None


def _apply(doc: dict[str, Any], part: Contribution) -> None:
    doc["metrics"].update(part.metrics)
    doc.update(part.sections)
    doc["notes"].extend(part.notes)


MERGED_GAPS_NOTE_SHARE = 0.05  # merged token gaps above this share of all get a note


def merged_gaps_note(itl_merged: dict[str, Any]) -> str | None:
    """The note when many token gaps were merged reads (docs/metrics.md, "Merged gaps")."""
    share = itl_merged.get("share")
    if share is None or share < MERGED_GAPS_NOTE_SHARE:
        return None
    return (
        f"ITL: {itl_merged['gaps']} token gaps ({share * 100:.1f} %) ended in a read that held several "
        "token events (a proxy or server that batches events, or a busy client), so they time the reads, "
        "not the server: ITL percentiles leave them out (metrics.itl_merged)"
    )


def _notes(run: FinishedRun) -> list[str]:
    """run.json's notes known before the log is read: lost workers, the checks before the run, the
    client policy."""
    settings = run.settings
    notes = [f"worker {w} was lost; every request it reported is included" for w in run.outcome.workers_lost]
    notes += run.early_notes
    if not settings.verify_tls:
        notes.append("note: TLS certificates were not verified (--insecure)")
    if settings.retries and settings.retries.get("max"):
        notes.append(
            f"note: retries on (up to {settings.retries['max']} for HTTP {settings.retries['on']}): "
            "each attempt is its own record and counts in every metric"
        )
    return notes


def endpoint_section(settings: RunSettings, facts: EndpointFacts) -> dict[str, Any]:
    """run.json ``endpoint``: url, embedded, models, engine; the context window, the server, replicas,
    hardware and price when known."""
    endpoint: dict[str, Any] = {
        "url": settings.host,
        "embedded": settings.embedded,
        "models": facts.models,
        "engine": facts.engine_info,
    }
    if facts.max_model_len:
        endpoint["max_model_len"] = facts.max_model_len  # the served model's context window (/v1/models)
    if facts.server is not None:
        endpoint["server"] = facts.server  # engine, version and flags of a server `loadtest serve` started
    endpoint.update(endpoint_extras(settings, facts.engine_info))  # replicas, hardware, price
    return endpoint


def run_config(settings: RunSettings, profile: Profile, workload: Workload) -> dict[str, Any]:
    """run.json ``config``: the profile as run, the load, the tokenizer, the run salt, the client policy."""

    load = profile.load
    return {
        "profile": profile.name,
        "profile_path": settings.profile_ref,
        "profile_resolved": profile.model_dump(mode="json"),
        "load": {
            "mode": load_mode(profile),
            "concurrency": load.concurrency,
            "rate": load.rate,
            "arrival": load.arrival if load.rate is not None else None,
            "cv": load.cv,
            "stages": [st.model_dump(mode="json") for st in load.stages] if load.stages else None,
            "trace": load.trace.model_dump(mode="json") if load.trace else None,
            "description": profile.load.describe(),
        },
        "scenarios": [{"name": sc.name, "kind": sc.kind, "weight": sc.weight} for sc in profile.scenarios],
        "tokenizer": workload.tokenizer.name,
        "run_salt": describe_run_salt(profile.run_salt, settings.run_nonce, settings.seed),
        "duration_s": settings.duration_s,
        "seed": settings.seed,
        "processes": settings.processes,
        "model": settings.model,
        "api": profile.api,
        "api_key_env": settings.api_key_env,
        "api_key_file": settings.api_key_file,
        "timeouts": {
            "connect_s": settings.connect_timeout,
            "read_s": settings.read_timeout,
            "total_s": settings.total_timeout,
        },
        "retries": settings.retries,
        "tls_verify": settings.verify_tls,
    }


def reason_lines(reasons: list[str], width: int = 80) -> list[str]:
    """The verdict's reasons for the terminal: one ``  - `` item each, wrapped to ``width`` columns."""
    return [
        line
        for r in reasons
        for line in textwrap.wrap(r, width, initial_indent="  - ", subsequent_indent="    ")
    ]


def verdict_line(
    verdict: Verdict, exit_code: int | None = None, smoke: bool = False, interrupted: str | None = None
) -> str:
    """The one line a CI log shows last: the status, the check count, the exit code and the headline
    (``too short; too few samples to prove ttft_p99``; the reasons are the lines above it);
    ``exit_code`` is the process's (an interrupted run's 130/143); ``smoke``: a smoke run, which the line
    says is not a compliant result; ``interrupted``: why the run stopped early (a signal, a lost
    worker), which then leads the line."""
    label = VERDICT_LABELS.get(verdict.status, verdict.status) + (
        " [smoke run: not a compliant result]" if smoke else ""
    )
    causes = [f"interrupted: {interrupted}"] if interrupted else []
    if verdict.status != "pass":
        causes.append(headline(verdict.status, verdict.checks))
    why = f": {'; '.join(causes)}" if causes else ""
    checks = len(verdict.checks)
    code = verdict.exit_code if exit_code is None else exit_code
    return f"verdict: {label} ({checks} check{'s' if checks != 1 else ''}, exit {code}){why}"


__all__ = [
    "BATCH_LINES",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "Finalized",
    "FinishedRun",
    "finalize",
    "line_batches",
    "reason_lines",
    "run_config",
    "verdict_line",
]
