"""``loadtest run``: validate inputs, start the embedded engine if needed, run, write results and report."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtest.cli import run_extras
from loadtest.cli.endpoint import Endpoint, EndpointSetupError, open_endpoint
from loadtest.client.failures import commonest_failure, failure_note, stopped_early_text
from loadtest.client.secrets import KeySourceError, install_redaction, load_api_key
from loadtest.errors import EXIT_COULD_NOT_RUN, EXIT_USAGE, UsageError

if TYPE_CHECKING:
    from loadtest.locust.runtime import RunOutcome
from loadtest.locust.settings import RunSettings, load_mode
from loadtest.metrics.judged import describe_warmup, goodput_summary, judge_lines
from loadtest.metrics.slo import AnySlo, merge_slos
from loadtest.metrics.summary import build_metrics
from loadtest.metrics.verdict import ValidityRules, Verdict, health_warnings, judge, junit_xml
from loadtest.profile.loader import ProfileError, load_profile
from loadtest.profile.schema import Profile
from loadtest.report.run_report import VERDICT_LABELS
from loadtest.results.record_log import read_records
from loadtest.traces import TraceFormatError
from loadtest.workload.builder import Workload
from loadtest.workload.context_fit import check_fit

EXIT_OK = 0
EXIT_INTERRUPTED = {"SIGINT": 130, "SIGTERM": 143}
MIN_FREE_BYTES = 64 * 2**20  # refuse to start a run on a (nearly) full disk


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise UsageError(f"--duration {text!r}: use a number of seconds or 90s, 5m, 1h")
    value, unit = float(m.group(1)), m.group(2) or "s"
    seconds = value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    if seconds <= 0:
        raise UsageError("--duration must be positive")
    return seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fail(msg: str, code: int) -> int:
    print(f"loadtest: error: {msg}", file=sys.stderr)
    return code


def ensure_writable(folder: Path, what: str) -> Path:
    """Create ``folder`` and prove it takes a file, before any run starts (a clear error otherwise)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"{what} {folder} is not writable: {e.strerror or e}") from e
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        raise UsageError(
            f"{what} {folder} has only {free / 2**20:.1f} MiB free: a run needs at least "
            f"{MIN_FREE_BYTES // 2**20} MiB for its records and report (free space, or choose --out elsewhere)"
        )
    return folder


# What a run writes into its folder: a folder holding any of these holds a run.
RUN_FILES = (
    "run.json",
    "report.html",
    "mlperf_log_summary.txt",
    "records*.jsonl",
    "*.records.jsonl",
    "engine.log",
)


def _out_dir(args: argparse.Namespace, profile_name: str) -> Path:
    """The run folder: new, or (``--force``) an old run's folder cleared of that run's files.

    Appending a run's records to another's would mix two runs in every report, export and comparison."""
    out = Path(args.out) if args.out else Path("reports") / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile_name}"
    old = sorted({f for pattern in RUN_FILES for f in out.glob(pattern)}) if out.is_dir() else []
    if old and not getattr(args, "force", False):
        names = ", ".join(f.name for f in old[:3]) + (", …" if len(old) > 3 else "")
        raise UsageError(
            f"--out {out} already holds a run ({names}): give a new folder, or --force to replace that run"
        )
    for f in old:
        f.unlink()
    return ensure_writable(out, "output folder")


def _api_key_env(args: argparse.Namespace) -> str | None:
    if getattr(args, "api_key_file", None):
        if args.api_key_env:
            raise UsageError("give the API key by --api-key-env or --api-key-file, not both")
        return None
    if args.api_key_env:
        if not os.environ.get(args.api_key_env):
            raise UsageError(
                f"--api-key-env {args.api_key_env}: that environment variable is not set or empty"
            )
        return args.api_key_env
    return "OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else None


def run_command(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        _, profile_path = load_profile(args.profile)
        if args.processes < 1:
            raise UsageError("--processes must be ≥ 1")
        if args.concurrency is not None and args.concurrency < 1:
            raise UsageError("--concurrency must be ≥ 1")
        if args.rate is not None and args.rate <= 0:
            raise UsageError("--rate must be > 0")
        prepared = prepare_run(args, profile_path, processes=args.processes)
        try:  # several endpoints, hardware and price (cli/run_extras.py)
            run_extras.setup(args, prepared.settings)
        except ValueError as e:
            raise UsageError(str(e)) from e
        settings, profile, workload, slos = (
            prepared.settings,
            prepared.profile,
            prepared.workload,
            prepared.slos,
        )
        api_key = prepared.api_key
        settings.duration_s = run_duration(args, profile, workload)
        out = _out_dir(args, profile.name)
        settings.out_dir, settings.run_id = str(out), out.name
    except ProfileError as e:
        return _fail(str(e), EXIT_USAGE)
    except UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    seed = settings.seed
    duration = settings.duration_s

    with contextlib.ExitStack() as stack:
        try:
            ep = open_endpoint(stack, args, profile, seed, api_key, out / "engine.log")
        except EndpointSetupError as e:
            return _fail(str(e), EXIT_USAGE if e.usage else EXIT_COULD_NOT_RUN)
        models, engine_info = ep.models, ep.engine_info
        model = ep.model
        settings.host, settings.model, settings.embedded = ep.host, model, engine_info is not None
        replica_error = run_extras.check_replicas(settings, api_key, args, profile)
        if replica_error:
            return _fail(replica_error, EXIT_COULD_NOT_RUN)
        # the model's own tokenizer when this host has it; a loud warning when it is a guess
        from loadtest.cli.run_tokens import settle_tokenizer

        # vLLM lists its served name as the id and the weights' folder or hub id as `root`
        served = ep.served_model()
        tokenizer_model = served.root if served is not None and served.root else model
        profile, workload = settle_tokenizer(settings, profile, workload, tokenizer_model, engine_info)
        try:
            early_notes = context_notes(ep, workload, profile_path)
        except UsageError as e:
            return _fail(str(e), EXIT_USAGE)
        print(
            f"running {profile.name} for {duration:g}s: {profile.load.describe()}, "
            f"{args.processes} process(es), model {model}; writing {out}/"
        )
        print(f"  {describe_warmup(profile.judging.warmup_s, duration)}")
        telemetry = None
        if not getattr(args, "no_telemetry", False):
            from loadtest.telemetry import start_for_run

            telemetry = start_for_run(
                settings.hosts or ep.host,  # every replica's /metrics, summed
                override=getattr(args, "metrics_url", None),
                server=ep.server,
                embedded=engine_info is not None,
                api_key=api_key,
            )
            stack.callback(telemetry.stop)
        from loadtest.locust import runtime

        try:
            if args.processes > 1:
                outcome = runtime.run_master(settings, _free_port())
            else:
                outcome = runtime.run_local(settings)
        except RuntimeError as e:
            return _fail(str(e), EXIT_COULD_NOT_RUN)
        if telemetry is not None:
            telemetry.stop()
        return _write_results(
            settings, profile, workload, outcome, models, engine_info, out, slos, args.junit,
            server=ep.server, telemetry=telemetry, early_notes=early_notes,
            max_model_len=(sm.max_model_len if (sm := ep.served_model()) else None),
        )  # fmt: skip
    return EXIT_COULD_NOT_RUN  # pragma: no cover


def context_notes(ep: Endpoint, workload: Workload, profile_path: Path) -> list[str]:
    """Check the workload's first requests against the served context window before the run.

    Nothing fits: UsageError (the run could only fail). Some do not: a warning now and a run.json note."""
    served = ep.served_model()
    if served is None or not served.max_model_len:
        return []
    fit = check_fit(workload, served.max_model_len)
    if fit.nothing_fits:
        raise UsageError(
            f"{profile_path}: every prompt of the first {fit.sampled} requests is longer than {served.id}'s "
            f"context of {served.max_model_len} tokens (/v1/models max_model_len): shorten the profile's "
            "input lengths, or serve the model with a longer context (vLLM --max-model-len)"
        )
    if not fit.over:
        return []
    note = f"warning: {fit.message()}"
    print(note, flush=True)
    return [note]


def _write_results(
    settings: RunSettings,
    profile: Profile,
    workload: Workload,
    outcome: RunOutcome,
    models: list[str],
    engine_info: dict[str, Any] | None,
    out: Path,
    slos: list[AnySlo],
    junit: str | None,
    server: dict[str, Any] | None = None,
    telemetry: Any = None,
    early_notes: list[str] | None = None,
    max_model_len: int | None = None,
) -> int:
    from loadtest.cli.run_tokens import describe_tokens
    from loadtest.report import format_summary, render_run_report
    from loadtest.results.run_json import build_run_document, write_run_json
    from loadtest.workload.salt import describe_run_salt

    status = "interrupted" if outcome.interrupted_reason else "completed"
    mode = load_mode(profile)
    load = profile.load
    config = {
        "profile": profile.name,
        "profile_path": settings.profile_ref,
        "profile_resolved": profile.model_dump(mode="json"),
        "load": {
            "mode": mode,
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
    endpoint = {"url": settings.host, "embedded": settings.embedded, "models": models, "engine": engine_info}
    if max_model_len:
        endpoint["max_model_len"] = max_model_len  # the served model's context window (/v1/models)
    if server is not None:
        endpoint["server"] = server  # engine, version and flags of a server `loadtest serve` started
    endpoint.update(run_extras.endpoint_extras(settings, engine_info))  # replicas, hardware, price
    notes = [f"worker {w} was lost; every request it reported is included" for w in outcome.workers_lost]
    notes += early_notes or []
    if not settings.verify_tls:
        notes.append("note: TLS certificates were not verified (--insecure)")
    if settings.retries and settings.retries.get("max"):
        notes.append(
            f"note: retries on (up to {settings.retries['max']} for HTTP {settings.retries['on']}): "
            "each attempt is its own record and counts in every metric"
        )
    doc = build_run_document(
        run_id=settings.run_id,
        status=status,
        interrupted_reason=outcome.interrupted_reason,
        config=config,
        endpoint=endpoint,
        fingerprint=workload.fingerprint(),
        aggregates=outcome.aggregates,
        record_files=outcome.record_files,
        notes=notes,
    )
    metrics, hists = doc["metrics"], outcome.aggregates.all.hists
    judging = profile.judging
    lines: list[Mapping[str, Any]] = list(read_records([out / f for f in outcome.record_files]))
    describe_tokens(doc, settings, workload)  # run.json `tokens`; a note when counted with a guess
    failed = failure_note(lines)
    if failed:
        doc["notes"].append(failed)
    stop_cause = None
    if outcome.stopped_early:  # the endpoint failed wholesale: the cause leads the notes and the verdict
        stop_cause = stopped_early_text(
            outcome.stopped_early, doc["metrics"]["requests"], commonest_failure(lines)
        )
        doc["stopped_early"] = {**outcome.stopped_early, "reason": f"stopped early: {stop_cause}"}
        doc["notes"].insert(0, f"stopped early: {stop_cause}")
    # The judged window (default warm-up: metrics/judged.py) and the generator's steady-state health.
    jr = judge_lines(lines, judging.warmup_s, judging.cooldown_s, per_scenario=len(profile.scenarios) > 1)
    if jr.note:
        doc["notes"].append(jr.note)
    if jr.window is not None and jr.aggregates is not None:
        metrics, hists = build_metrics(jr.aggregates.all), jr.aggregates.all.hists
        doc["judged"] = {"window": jr.window.to_dict(), "metrics": metrics}
    every_line, lines = lines, jr.lines
    doc["config"]["judging"] = {**jr.config, "generator_health": judging.generator_health}
    doc["generator_health"] = jr.health
    gp = goodput_summary(lines, slos, per_scenario=len(profile.scenarios) > 1)
    if gp is not None:
        doc["goodput"] = gp
    health = {
        "schedule_lag_p99_ms": jr.health["schedule_lag_p99_ms"],
        "startup_s": jr.health["startup_s"],
        # Sustained load, not a start-up spike: the 90th percentile of the per-second samples.
        "cpu_percent": doc["metrics"]["generator"]["cpu_p90_percent"],
    }
    rules = ValidityRules(
        min_duration_s=judging.min_duration_s,
        min_queries=judging.min_queries,
        generator_health=judging.generator_health,
    )
    verdict = judge(
        metrics, hists, slos, rules, health, failure=commonest_failure(lines), stopped_early=stop_cause
    )
    # per-endpoint, embeddings, economics: into `metrics`, so over the whole run like the rest of it
    run_extras.results(doc, verdict, every_line, settings)
    for note in doc["notes"]:
        if note not in verdict.reasons:
            verdict.reasons.append(note)
    doc["verdict"] = verdict.to_dict()
    doc["config"]["slos"] = {s.key: getattr(s, "limit_ms", getattr(s, "limit", None)) for s in slos}
    from loadtest.telemetry import attach

    # after the verdict: a missing /metrics or a warm prefix cache is a note, not a reason; t counts
    # from the load's start; the prefix-cache hit rate is also read from the records without telemetry
    attach(doc, telemetry, outcome.started_epoch or None)
    write_run_json(out, doc)
    report = render_run_report(out)
    print(format_summary(doc))
    print(f"run.json: {out / 'run.json'}")
    print(f"report:   {report}")
    if junit:
        Path(junit).write_text(
            junit_xml(verdict, f"loadtest.{profile.name}", time_s=metrics["window"]["duration_s"])
        )
        print(f"junit:    {junit}")
    code = (
        EXIT_INTERRUPTED.get(outcome.signal or "", EXIT_COULD_NOT_RUN)
        if outcome.interrupted_reason
        else verdict.exit_code
    )
    for warning in health_warnings(verdict):  # judging.generator_health: warn; the verdict line stays last
        print(warning)
    print(verdict_line(verdict, code))
    return code


@dataclass
class PreparedRun:
    """A run's inputs, checked: settings (no host or output folder yet), the effective profile, its
    workload (tokenizer and any trace already loaded) and the SLOs to judge."""

    settings: RunSettings
    profile: Profile
    workload: Workload
    slos: list[AnySlo]
    api_key: str | None = None  # read once to check it; never stored in settings or files


def prepare_run(
    args: argparse.Namespace, profile_path: Path, *, processes: int, host: str = ""
) -> PreparedRun:
    """What `run`, `master` and `ui` share: settings from the command line, the profile with its
    overrides, the workload and the SLOs; UsageError or ProfileError with one line on bad input."""
    settings = RunSettings(
        run_id="",
        profile_ref=str(profile_path),
        host=host,
        out_dir="",
        duration_s=0.0,
        seed=0,
        concurrency=getattr(args, "concurrency", None),
        rate=getattr(args, "rate", None),
        api_key_env=_api_key_env(args),
        api_key_file=str(Path(args.api_key_file).expanduser().resolve())
        if getattr(args, "api_key_file", None)
        else None,
        processes=processes,
        verify_tls=not args.insecure,
        tokenizer=args.tokenizer,
        slo=args.slo,
    )
    try:
        api_key = load_api_key(settings.api_key_env, settings.api_key_file)
    except KeySourceError as e:
        raise UsageError(str(e)) from e
    install_redaction(api_key)
    profile, _ = settings.profile()
    _apply_client_policy(settings, profile, args)
    settings.seed = profile.seed if args.seed is None else args.seed
    try:
        # checks the tokenizer and reads any trace now; the run nonce is the one every worker gets
        workload = Workload(profile, settings.seed, run_nonce=settings.run_nonce)
    except (ValueError, OSError, TraceFormatError) as e:
        raise UsageError(f"{profile_path}: {e}") from e
    profile = _with_judging(profile, args)
    try:
        slos = merge_slos(profile.slos, args.slo)
    except ValueError as e:
        raise UsageError(f"SLOs ({'--slo' if args.slo else profile_path}): {e}") from e
    return PreparedRun(settings, profile, workload, slos, api_key)


def _apply_client_policy(settings: RunSettings, profile: Profile, args: argparse.Namespace) -> None:
    """Timeouts and retries: the profile's ``client`` section, each overridden by its command-line option."""
    client = profile.client

    def pick(option: str, default: float) -> float:
        value = getattr(args, option, None)
        if value is None:
            return default
        if value < 0 or (value == 0 and option != "total_timeout"):
            raise UsageError(f"--{option.replace('_', '-')} must be > 0")
        return float(value)

    settings.connect_timeout = pick("connect_timeout", client.connect_timeout_s)
    settings.read_timeout = pick("read_timeout", client.read_timeout_s)
    settings.total_timeout = pick("total_timeout", client.total_timeout_s)
    retries = client.retries.model_dump()
    n = getattr(args, "retries", None)
    if n is not None:
        if not 0 <= n <= 10:
            raise UsageError("--retries must be between 0 and 10")
        retries["max"] = n
    settings.retries = retries


def run_duration(args: argparse.Namespace, profile: Profile, workload: Workload) -> float:
    """--duration, else the length of a schedule that ends by itself (trace, stages), else the profile's."""
    if args.duration:
        return parse_duration(args.duration)
    span = workload.schedule_span_s
    return span + 0.001 if span is not None else profile.duration_s


def _with_judging(profile: Profile, args: argparse.Namespace) -> Profile:
    """The profile with --warmup / --cooldown / --generator-health applied (commands without them leave
    it as it is)."""
    update: dict[str, Any] = {}
    if getattr(args, "generator_health", None):
        update["generator_health"] = args.generator_health
    for flag, key in (
        (getattr(args, "warmup", None), "warmup_s"),
        (getattr(args, "cooldown", None), "cooldown_s"),
    ):
        if flag:
            update[key] = "auto" if flag.strip() == "auto" else _window_seconds(flag, key)
    return (
        profile.model_copy(update={"judging": profile.judging.model_copy(update=update)})
        if update
        else profile
    )


def _window_seconds(text: str, key: str) -> float:
    """--warmup / --cooldown seconds: like --duration, but 0 is allowed (``--warmup 0``: judge from the start)."""
    if re.fullmatch(r"\s*0+(?:\.0*)?\s*(ms|s|m|h)?\s*", text):
        return 0.0
    try:
        return parse_duration(text)
    except UsageError:
        option = "--warmup" if key == "warmup_s" else "--cooldown"
        raise UsageError(f"{option} {text!r}: use seconds like 30s, 2m, 0, or auto") from None


def verdict_line(verdict: Verdict, exit_code: int | None = None) -> str:
    """The one line a CI log shows; ``exit_code`` is the process's (an interrupted run's 130/143)."""
    label = VERDICT_LABELS.get(verdict.status, verdict.status)
    why = f": {'; '.join(verdict.reasons)}" if verdict.reasons and verdict.status != "pass" else ""
    checks = len(verdict.checks)
    code = verdict.exit_code if exit_code is None else exit_code
    return f"verdict: {label} ({checks} check{'s' if checks != 1 else ''}, exit {code}){why}"
