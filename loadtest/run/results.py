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
from loadtest.errors import EXIT_COULD_NOT_RUN, EXIT_INTERRUPTED, EXIT_WRITE_FAILED
from loadtest.locust.settings import RunSettings, load_mode
from loadtest.metrics import delivery
from loadtest.metrics.judged_scan import JudgingScan, LineAggregator
from loadtest.metrics.samples import LatencySamples
from loadtest.metrics.slo import AnySlo
from loadtest.metrics.summary import build_metrics
from loadtest.metrics.verdict import (
    COMPLETE_RUN,
    OfferedLoad,
    ValidityRules,
    Verdict,
    headline,
    health_warnings,
    judge,
    junit_xml,
)
from loadtest.profile.schema import Profile
from loadtest.report.run_report import VERDICT_LABELS
from loadtest.results.durable import WriteFailure
from loadtest.results.mlperf_detail import DETAIL_NAME
from loadtest.results.mlperf_summary import SUMMARY_NAME
from loadtest.results.record_log import ReadTally, read_lines
from loadtest.results.run_json import build_run_document
from loadtest.run.connections import ConnectionsProvider
from loadtest.run.endpoint import EndpointFacts
from loadtest.run.providers import (
    AgenticAccuracyProvider,
    Contribution,
    ConversationsProvider,
    EconomicsProvider,
    EmbeddingsProvider,
    EndpointsProvider,
    Provider,
    QualityProvider,
    RerankProvider,
    SamplesProvider,
    TelemetryProvider,
    TokensProvider,
    WindowProvider,
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


def accuracy_target(profile: Profile) -> float | None:
    """The profile's agentic accuracy target (its agent_trace scenario's ``accuracy_target``), if any."""
    return next(
        (
            s.agent_trace.accuracy_target
            for s in profile.scenarios
            if s.agent_trace is not None and s.agent_trace.accuracy_target is not None
        ),
        None,
    )


def line_batches(
    paths: list[Path], size: int = BATCH_LINES, tally: ReadTally | None = None
) -> Iterator[list[RecordLine]]:
    """The record logs' lines, in log order, ``size`` at a time (``tally``: the lines skipped)."""
    lines = read_lines(paths, tally)
    while batch := list(islice(lines, size)):
        yield batch


def finalize(run: FinishedRun) -> Finalized:
    """Everything after the load: run.json, report.html, mlperf_log_summary.txt, the JUnit XML; the
    console lines (summary, paths, warnings, the verdict line last) and the exit code (the verdict's,
    or 130/143 for a run a signal ended)."""
    from loadtest.report import format_summary

    settings, profile, workload, outcome, out = run.settings, run.profile, run.workload, run.outcome, run.out
    status, why, incomplete = run_status(outcome)
    doc = build_run_document(
        run_id=settings.run_id,
        status=status,
        interrupted_reason=why,
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
        SamplesProvider(),
        EconomicsProvider(),
        QualityProvider(profile.quality, run.slos),
        WindowProvider(),
        ConnectionsProvider(),
        ConversationsProvider(run.slos, judging.smoke),
        AgenticAccuracyProvider(accuracy_target(profile)),
    ]
    server = TelemetryProvider(run.telemetry, outcome.started_epoch or None)

    # Pass one over the record log: failures, the judged window's columns, the providers' figures.
    paths = [out / f for f in outcome.record_files]
    ramp = outcome.ramp
    ramp_end = ramp.end_epoch if ramp is not None else None
    scan = JudgingScan(judging.warmup_s, judging.cooldown_s, run.slos, per_scenario, ramp_end)
    failures = FailureTally()
    samples = LatencySamples()  # the exact values behind the reported percentiles (LoadGen's rule)
    skipped = ReadTally()
    for batch in line_batches(paths, tally=skipped):
        scan.add(batch)
        failures.add(batch)
        samples.add(batch)
        tokens.add(batch)
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

    lost = lost_section(outcome, skipped)
    if lost is not None:
        doc["lost"] = lost
    tokens_part = tokens.contribute(doc)  # run.json `tokens`; a note when counted with a guess
    _apply(doc, tokens_part)
    failed = failures.note()
    if failed:
        doc["notes"].append(failed)
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
    merged = merged_gaps_note(metrics["itl_merged"])  # the judged figures', as the verdict's check
    if merged:
        doc["notes"].append(merged)
    doc["config"]["judging"] = {
        **judged.config,
        "generator_health": judging.generator_health,
        "smoke": judging.smoke,
        **({"ramp": ramp.to_dict()} if ramp is not None else {}),
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
        # Sustained load, not a start-up spike: the 90th percentile of the per-second samples; of one
        # process, or of a master's local processes together per core when that is higher
        "cpu_percent": doc["metrics"]["generator"]["cpu_p90_percent"],
    }
    asked = streams_asked(profile)
    ok_share = judged.health.get("in_flight_ok_share")
    if asked is not None and ok_share is not None and ok_share >= STREAMS_OK_SHARE:
        health["streams_asked"], health["mean_in_flight"] = asked, judged.health["mean_in_flight"]
    host_cpu = doc["metrics"]["generator"].get("host_cpu_p90_percent")
    if host_cpu is not None and host_cpu > (health["cpu_percent"] or 0):
        health["cpu_percent"], health["cpu_basis"] = host_cpu, "host"
    rules = ValidityRules(
        min_duration_s=judging.min_duration_s,
        min_queries=judging.min_queries,
        generator_health=judging.generator_health,
        smoke=judging.smoke,
    )
    extra_checks = [check for part in [*parts, remarks] for check in part.checks]

    def decide(incomplete: str | None) -> Verdict:
        return judge(
            metrics,
            hists,
            run.slos,
            rules,
            health,
            failure=judged_failures.commonest(),
            stopped_early=stop_cause,
            extra_checks=extra_checks,
            notes=doc["notes"],
            samples=judged_samples,
            incomplete=incomplete,
            load=OfferedLoad(profile.load.rate, int((settings.retries or {}).get("max") or 0)),
        )

    verdict = decide(incomplete)
    doc["verdict"] = verdict.to_dict()
    doc["config"]["slos"] = {s.key: getattr(s, "limit_ms", getattr(s, "limit", None)) for s in run.slos}
    _apply(doc, remarks)
    code = (
        EXIT_WRITE_FAILED
        if outcome.write_failure
        else EXIT_INTERRUPTED.get(outcome.signal or "", EXIT_COULD_NOT_RUN)
        if outcome.interrupted_reason
        else verdict.exit_code
    )
    run_json = out / RUN_FILE
    document = from_data(doc, run_json)  # the schema refuses a section it does not describe
    report, failure = write_files(out, document)
    if failure is not None:  # run.json, or the report after it: the run is incomplete, and says so
        incomplete = f"incomplete: {failure.describe()}" if incomplete is None else incomplete
        doc["status"], doc["interrupted_reason"] = (
            "incomplete",
            doc["interrupted_reason"] or failure.describe(),
        )
        verdict = decide(incomplete)
        doc["verdict"] = verdict.to_dict()
        document = from_data(doc, run_json)
        code = EXIT_WRITE_FAILED if code not in EXIT_INTERRUPTED.values() else code
        tail = [verdict_line(verdict, code, judging.smoke, incomplete)]
        try:
            write_run_document(out, document)
            tail.append(
                f"report not written: {failure.describe()}; `loadtest report {out}` writes it once there is room"
            )
        except OSError as e2:
            tail.append(unwritten_line(WriteFailure.of(run_json, e2), outcome))
        lines = [format_summary(document), *reason_lines(verdict.reasons), *tail]
        return Finalized(document, verdict, run_json, report, lines, code)
    lines = [format_summary(document), f"run.json: {run_json}", f"report:   {report}"]
    if run.junit:
        try:
            Path(run.junit).write_text(
                junit_xml(verdict, f"loadtest.{profile.name}", time_s=metrics["window"]["duration_s"])
            )
            lines.append(f"junit:    {run.junit}")
        except OSError as e:  # run.json holds the verdict: the JUnit file's loss is said, and fails the run
            lines.append(f"junit not written: {WriteFailure.of(run.junit, e).describe()}")
            code = EXIT_WRITE_FAILED if code not in EXIT_INTERRUPTED.values() else code
    # The reasons, one a line with its fix (a passing run's: the generator-health warnings), then the
    # verdict line, last. An incomplete run (a signal, a lost worker, a full disk) says so first: what
    # happened to the run comes before what its partial figures say about the endpoint.
    lines += reason_lines(verdict.reasons if not verdict.passed else health_warnings(verdict))
    lines.append(verdict_line(verdict, code, judging.smoke, incomplete))
    return Finalized(document, verdict, run_json, report, lines, code)


def write_files(out: Path, document: RunDocument) -> tuple[Path, WriteFailure | None]:
    """run.json, then report.html and mlperf_log_summary.txt; the report's path and the first write that
    failed (None: all written). A report or summary cut by a failed write is removed: none is better."""
    from loadtest.report import render_run_report

    report = out / "report.html"
    try:
        write_run_document(out, document)
    except OSError as e:
        return report, WriteFailure.of(out / RUN_FILE, e)
    try:
        return render_run_report(out), None
    except OSError as e:
        for partial in (report, out / SUMMARY_NAME, out / DETAIL_NAME):
            partial.unlink(missing_ok=True)
        return report, WriteFailure.of(e.filename or report, e)


def run_status(outcome: RunOutcome) -> tuple[str, str | None, str | None]:
    """run.json's ``status`` and ``interrupted_reason``, and the verdict's first reason for a run that did
    not end as planned (None for one that did): ``incomplete`` (a run file could not be written),
    ``interrupted`` (a signal, a lost worker) or ``completed``."""
    if outcome.write_failure:
        why = outcome.write_failure
        if outcome.interrupted_reason:
            why += f"; {outcome.interrupted_reason}"
        lost = outcome.records_lost
        said = f"{lost} finished request{'s' if lost != 1 else ''} counted but not written to the record log"
        return "incomplete", why, f"incomplete: {why}: {said}"
    if outcome.interrupted_reason:
        return "interrupted", outcome.interrupted_reason, f"interrupted: {outcome.interrupted_reason}"
    return "completed", None, None


def lost_section(outcome: RunOutcome, skipped: ReadTally) -> dict[str, Any] | None:
    """run.json ``lost``: what the run could not keep; None when nothing was lost."""
    if not (
        outcome.write_failure or outcome.records_lost or outcome.lost_in_flight or skipped.cut or skipped.bad
    ):
        return None
    return {
        "write_failure": outcome.write_failure,
        "records_not_written": outcome.records_lost,
        "in_flight_of_lost_workers": outcome.lost_in_flight,
        "cut_lines": skipped.cut,
        "unreadable_lines": skipped.bad,
    }


def unwritten_line(failure: WriteFailure, outcome: RunOutcome) -> str:
    """The last console line when run.json could not be written: why, and what was kept and lost."""
    kept = outcome.records_written
    files = ", ".join(outcome.record_files) or "no record log"
    return (
        f"run.json not written: {failure.describe()}; lost: run.json, the report, the MLPerf summary"
        + (f" and {outcome.records_lost} finished requests not written" if outcome.records_lost else "")
        + f"; kept: {kept} record lines in {files} (loadtest report cannot rebuild the run without run.json)"
    )


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
    """The note when many token gaps were merged reads (docs/metrics.md, "Merged gaps"): the merged
    delivery diagnosis when it is the run's pattern (metrics/delivery.py), which the verdict's
    ``merged_delivery`` check gives as its reason too."""
    diagnosis = delivery.diagnosis(itl_merged)
    if diagnosis is not None:
        return diagnosis
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


STREAMS_OK_SHARE = 0.99  # the streams-held check needs an endpoint that answers (failures back streams off)


def streams_asked(profile: Profile) -> int | None:
    """The streams a closed loop must hold all the time: its concurrency, when every unit is one request
    (sessions and agents think between calls, so their streams are idle by design); None otherwise."""
    load = profile.load
    if load.concurrency is None:
        return None
    if any(sc.kind not in ("chat", "trace") or sc.dataset is not None for sc in profile.scenarios):
        return None
    return load.concurrency


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
        "seed_set": settings.seed_set,
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
        "network": settings.policy().describe(),
    }


def reason_lines(reasons: list[str], width: int = 80) -> list[str]:
    """The verdict's reasons for the terminal: one ``  - `` item each, wrapped to ``width`` columns."""
    return [
        line
        for r in reasons
        for line in textwrap.wrap(r, width, initial_indent="  - ", subsequent_indent="    ")
    ]


def verdict_line(
    verdict: Verdict, exit_code: int | None = None, smoke: bool = False, incomplete: str | None = None
) -> str:
    """The one line a CI log shows last: the status, the check count, the exit code and the headline
    (``too short; too few samples to prove ttft_p99``; the reasons are the lines above it);
    ``exit_code`` is the process's (an interrupted run's 130/143); ``smoke``: a smoke run, which the line
    says is not a compliant result; ``incomplete``: why the run did not end as planned (``interrupted:
    SIGTERM``, ``incomplete: disk full at …``), which then leads the line."""
    label = VERDICT_LABELS.get(verdict.status, verdict.status) + (
        " [smoke run: not a compliant result]" if smoke else ""
    )
    causes = [incomplete] if incomplete else []
    others = [c for c in verdict.checks if c.name != COMPLETE_RUN]  # the incomplete run is said above
    if verdict.status != "pass" and any(c.blocking and not c.passed for c in others):
        causes.append(headline(verdict.status, others))
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
