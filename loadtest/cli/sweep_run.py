"""The `loadtest sweep` command: check inputs, open the endpoint, run the points, write sweep.json and sweep.html."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from loadtest import __version__
from loadtest.cli.endpoint_options import endpoint_args
from loadtest.cli.run_options import engine_overrides, fail, run_options
from loadtest.cli.sweep_plan import declarations, print_plan, submission_plan
from loadtest.contracts.sweep_document import (
    SCHEMA_VERSION,
    Mode,
    SearchSummary,
    SweepDocument,
    SweepEndpoint,
    SweepPoint,
    write_sweep_document,
)
from loadtest.errors import EXIT_COULD_NOT_RUN, LoadtestError, UsageError
from loadtest.log_setup import configure_logging
from loadtest.metrics.judged import judged_warmup_s
from loadtest.metrics.slo import latency_slos
from loadtest.metrics.verdict import EXIT_CODES, describe_judging
from loadtest.profile.loader import load_profile
from loadtest.profile.schema import Profile
from loadtest.report.sweep_report import render_sweep_report
from loadtest.run import EXIT_INTERRUPTED, EXIT_OK, ensure_writable, parse_duration, prepare, start_embedded
from loadtest.sweep.analysis import best_search_point, best_under_slo, knee
from loadtest.sweep.disclosure import Declarations, missing, missing_text
from loadtest.sweep.driver import Sweep
from loadtest.sweep.ladder import (
    DEFAULT_OFFLINE_CONCURRENCY,
    LoadPoint,
    concurrency_ladder,
    concurrency_point,
    offline_point,
    parse_list,
    rate_ladder,
    rate_point,
    rate_text,
)
from loadtest.sweep.model import POINTS_DIR, SWEEP_FILE
from loadtest.sweep.offline import dataset_offline, elect_offline
from loadtest.sweep.rules import Plan, min_duration_s, plan_lines
from loadtest.sweep.runner import AccuracyRuns, PointRunner
from loadtest.sweep.search import DEFAULT_MAX_ITERATIONS, DEFAULT_TOLERANCE, Bisection
from loadtest.sweep.submission import SubmissionError, write_submission

EXIT_NO_POINT_PASSED = EXIT_CODES["slo_missed"]


@dataclass
class SweepPlan:
    """A sweep's inputs, checked before anything starts."""

    mode: Mode
    profile: Profile
    profile_path: Path
    seed: int
    fingerprint: str
    slo: dict[str, float | None]
    concurrency: list[int]
    rates: list[float]
    offline: bool
    offline_concurrency: int
    offline_requests: int | None  # over a dataset: whole passes (sweep/offline.py)
    point_duration_s: float
    point_duration_given: bool
    stop_at_saturation: bool
    out: Path
    run_args: list[str] = field(default_factory=list)  # without --host
    mlperf_endpoints: Path | None = None  # the MLPerf Endpoints submission tree to write
    declarations: Declarations = field(default_factory=Declarations)  # --endpoint-file (sweep/disclosure.py)
    submission_plan: Plan | None = None  # the v1.0 point plan for the declared C_max (sweep/rules.py)


def _whole(value: float | None, flag: str) -> int | None:
    if value is None:
        return None
    if value != int(value) or value < 1:
        raise UsageError(f"{flag} {value:g}: a concurrency level is a whole number ≥ 1")
    return int(value)


def _plan(args: argparse.Namespace) -> SweepPlan:
    """Check every input (profile, SLOs, ladder options, output folder); UsageError (a ProfileError is
    one) if bad."""
    _, profile_path = load_profile(args.profile)
    if args.processes < 1:
        raise UsageError("--processes must be ≥ 1")
    if not args.engine_speedup > 0:
        raise UsageError("--engine-speedup must be > 0")
    mode = args.ladder
    if mode != "search" and (args.tolerance is not None or args.max_iterations is not None):
        raise UsageError("--tolerance and --max-iterations apply to --ladder search only")
    if mode == "search" and args.points:
        raise UsageError("--points does not apply to --ladder search; give --min and --max (or neither)")
    if args.offline_concurrency is not None and args.offline_concurrency < 1:
        raise UsageError("--offline-concurrency must be ≥ 1")
    # each point sets its own load, and the points' folders are the sweep's
    prepared = prepare(run_options(args, concurrency=None, rate=None, out=None), run_folder=False)
    profile, slos = prepared.profile, prepared.slos
    concurrency: list[int] = []
    rates: list[float] = []
    try:
        if mode == "concurrency":
            if args.points:
                concurrency = [int(v) for v in parse_list(args.points, "--points", integer=True)]
            else:
                lo, hi = _whole(args.min, "--min"), _whole(args.max, "--max")
                concurrency = concurrency_ladder(lo=lo, hi=hi, steps=args.steps)
        elif mode == "rate" and args.points:
            rates = parse_list(args.points, "--points", integer=False)
        elif args.min is not None and args.max is not None and not 0 < args.min < args.max:
            raise UsageError(f"--min {args.min:g} / --max {args.max:g}: need 0 < min < max")
        elif mode == "rate" and args.max is not None:
            rates = rate_ladder(args.max, args.min, args.steps)
    except ValueError as e:
        raise UsageError(str(e)) from e
    needs_capacity = mode in ("rate", "search") and not rates and args.max is None
    offline = args.offline if args.offline is not None else (mode == "concurrency" or needs_capacity)
    if needs_capacity and not offline:
        raise UsageError(
            f"--ladder {mode} needs --max (req/s){' or --points' if mode == 'rate' else ''}, "
            "or the offline point to measure the capacity (drop --no-offline)"
        )
    if mode == "search" and not slos:
        raise UsageError(
            f"--ladder search looks for the highest rate that meets the SLOs, and neither --slo nor "
            f"{profile_path} sets any: give e.g. --slo ttft_p90=500ms,tpot_p90=50ms"
        )
    top = max(concurrency, default=0)
    over_dataset = dataset_offline(prepared.workload)
    offline_requests = over_dataset[1] if over_dataset is not None and not args.offline_concurrency else None
    offline_concurrency = args.offline_concurrency or (
        over_dataset[0] if over_dataset is not None else max(DEFAULT_OFFLINE_CONCURRENCY, 2 * top)
    )
    duration = parse_duration(args.point_duration) if args.point_duration else profile.duration_s
    out = (
        Path(args.out)
        if args.out
        else Path("reports") / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile.name}-sweep"
    )
    if (out / SWEEP_FILE).exists() or (out / POINTS_DIR).exists():
        raise UsageError(f"{out} already holds a sweep: give a new --out folder")
    ensure_writable(out, "output folder")
    mlperf_endpoints = Path(args.mlperf_endpoints) if getattr(args, "mlperf_endpoints", None) else None
    if mlperf_endpoints is not None:
        if mode != "concurrency":
            raise UsageError(
                "--mlperf-endpoints writes a curve over concurrency: use it with --ladder concurrency"
            )
        if (mlperf_endpoints / "results").exists():
            raise UsageError(
                f"--mlperf-endpoints {mlperf_endpoints} already holds results/: give a new folder"
            )
        ensure_writable(mlperf_endpoints, "--mlperf-endpoints folder")
    decl = declarations(args) if mlperf_endpoints is not None else Declarations()
    if mlperf_endpoints is not None:
        gaps = missing(decl, args.seed_set)
        if gaps:
            raise UsageError(missing_text(f"--endpoint-file {args.endpoint_file or '(not given)'}", gaps))
    points_plan = submission_plan(args, profile, decl, offline_concurrency) if mlperf_endpoints else None
    if points_plan is not None and not args.points:
        concurrency = points_plan.concurrencies
        if not args.offline_concurrency and over_dataset is None:
            offline_concurrency = max(DEFAULT_OFFLINE_CONCURRENCY, 2 * max(concurrency))
    seed = prepared.settings.seed
    seeds = ["--seed-set", args.seed_set] if args.seed_set else ["--seed", str(seed)]  # a set has its own
    run_args = ["--profile", str(profile_path), *seeds]
    run_args += ["--processes", str(args.processes)]
    if args.point_duration:
        run_args += ["--duration", f"{duration:g}"]
    for flag, value in (
        ("--slo", args.slo),
        ("--warmup", args.warmup),
        ("--cooldown", args.cooldown),
        ("--generator-health", args.generator_health),
        ("--model", args.model),
        ("--api-key-env", args.api_key_env),
        ("--api-key-file", args.api_key_file),
        ("--tokenizer", args.tokenizer),
        ("--dataset", prepared.settings.dataset),
        ("--session-header", args.session_header),
    ):
        if value:
            run_args += [flag, str(value)]
    for flag, number in (
        ("--connect-timeout", args.connect_timeout),
        ("--read-timeout", args.read_timeout),
        ("--total-timeout", args.total_timeout),
        ("--retries", args.retries),
    ):
        if number is not None:  # otherwise each point takes the profile's own client policy
            run_args += [flag, f"{number:g}"]
    if args.insecure:
        run_args.append("--insecure")
    if args.ca_bundle:
        run_args += ["--ca-bundle", args.ca_bundle]
    if args.no_telemetry:
        run_args.append("--no-telemetry")
    if args.metrics_url:
        run_args += ["--metrics-url", args.metrics_url]
    if args.metrics_api_key_env:
        run_args += ["--metrics-api-key-env", args.metrics_api_key_env]
    if args.smoke:
        run_args.append("--smoke")
    if args.endpoint_check != "models":
        run_args += ["--endpoint-check", args.endpoint_check]
    run_args += endpoint_args(args)  # hardware and price (loadtest/economics), the same for every point
    return SweepPlan(
        mode=mode,
        profile=profile,
        profile_path=profile_path,
        seed=seed,
        fingerprint=prepared.workload.fingerprint(),
        slo={s.key: getattr(s, "limit_ms", getattr(s, "limit", None)) for s in slos},
        concurrency=concurrency,
        rates=rates,
        offline=offline,
        offline_concurrency=offline_concurrency,
        offline_requests=offline_requests,
        point_duration_s=duration,
        point_duration_given=bool(args.point_duration),
        stop_at_saturation=args.stop_at_saturation and points_plan is None,  # a plan's points all run
        out=out,
        run_args=run_args,
        mlperf_endpoints=mlperf_endpoints,
        declarations=decl,
        submission_plan=points_plan,
    )


def _evidence_warning(plan: SweepPlan) -> list[str]:
    """A rate ladder whose lowest rate cannot reach the requests a percentile SLO needs in a point's
    judged time: the warning ``describe_judging`` gives a run, with the sweep's option."""
    if plan.mode != "rate" or not plan.rates or not plan.slo:
        return []
    duration = plan.point_duration_s
    judged_s = max(0.0, duration - judged_warmup_s(plan.profile.judging.warmup_s, duration))
    percentiles = {k: v for k, v in plan.slo.items() if v is not None}
    lines = describe_judging(latency_slos(percentiles), min(plan.rates), judged_s)[1:]
    return [line.replace("(--duration)", "per point (--point-duration)") for line in lines]


def _describe(plan: SweepPlan) -> str:
    passes = f", {plan.offline_requests} requests" if plan.offline_requests else ""
    off = f" + offline (c{plan.offline_concurrency}{passes})" if plan.offline else ""
    if plan.mode == "concurrency":
        return f"concurrency ladder {', '.join(map(str, plan.concurrency))}{off}"
    if plan.mode == "rate":
        levels = ", ".join(rate_text(r) for r in plan.rates) if plan.rates else "up to the offline point's"
        return f"rate ladder {levels} req/s{off}"
    return f"search for the highest rate that meets {', '.join(plan.slo)}{off}"


def _open_host(args: argparse.Namespace, profile: Profile) -> SweepEndpoint:
    from loadtest.client.network import NetworkPolicy
    from loadtest.client.preflight import (
        EndpointError,
        ModelNotServed,
        check_headers,
        require_served,
        served_models,
    )
    from loadtest.client.secrets import KeySourceError, install_redaction, load_api_key

    try:
        key = load_api_key(args.api_key_env, args.api_key_file)
        if key is None and os.environ.get("OPENAI_API_KEY", "").strip():
            key = load_api_key("OPENAI_API_KEY", None)  # checked as the run's keys are
    except KeySourceError as e:
        raise UsageError(str(e)) from e
    install_redaction(key)
    try:
        served = served_models(
            args.host,
            key,
            timeout=args.connect_timeout or 10.0,
            network=NetworkPolicy.from_env(ca_bundle=args.ca_bundle, verify_tls=not args.insecure),
            headers=check_headers(key, profile),
            check=args.endpoint_check,
            api=profile.api,
        )
    except EndpointError as e:
        raise LoadtestError(str(e)) from e
    try:  # the model every point asks for: served, or the sweep does not start (exit 2)
        require_served(
            args.model or profile.model, served, args.host, "--model" if args.model else "the profile's model"
        )
    except ModelNotServed as e:
        raise UsageError(str(e)) from e
    return SweepEndpoint(url=args.host, embedded=False, engine=None, models=[m.id for m in served])


ENDPOINT_ACCESS = ("--model", "--api-key-env", "--api-key-file")  # what an accuracy run needs of the sweep's


def _accuracy_runs(args: argparse.Namespace, plan: SweepPlan) -> tuple[AccuracyRuns | None, Path | None]:
    """``--accuracy BENCH:FILE``: its dataset read now (a bad file is a usage error before any point), run
    after the plan's mandatory points (every point without a plan); with ``--engine-reference`` also the
    embedded engine's reference-answer file, written into the sweep folder."""
    from loadtest.accuracy.benchmarks import benchmark
    from loadtest.accuracy.datasets import load_dataset
    from loadtest.accuracy.run import reference_answers

    spec = getattr(args, "accuracy", None)
    reference = getattr(args, "engine_reference", False)
    if not spec:
        if reference:
            raise UsageError("--engine-reference answers an accuracy dataset: give --accuracy BENCH:FILE too")
        return None, None
    if reference and args.host:
        raise UsageError("--engine-reference is for the embedded engine; leave out --host")
    name, sep, file = spec.partition(":")
    if not sep or not name or not file:
        raise UsageError(f"--accuracy {spec!r}: give BENCH:FILE, e.g. llama3.1-8b:cnn_eval.json")
    dataset = load_dataset(benchmark(name).dataset_kind, Path(file))
    at = plan.submission_plan and frozenset(p.concurrency for p in plan.submission_plan.points if p.mandatory)
    extra: list[str] = []
    for flag in ENDPOINT_ACCESS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value:
            extra += [flag, value]
    runs = AccuracyRuns(f"{name}:{Path(file).resolve()}", at or None, tuple(extra))
    if not reference:
        return runs, None
    plan.out.mkdir(parents=True, exist_ok=True)
    return runs, reference_answers(dataset, plan.out / "reference_answers.jsonl")


def _open_endpoint(
    stack: contextlib.ExitStack, args: argparse.Namespace, plan: SweepPlan, references: Path | None
) -> SweepEndpoint:
    """``--host`` after its model check, else the embedded engine (stopped when ``stack`` closes;
    answering from ``references`` when given: ``--engine-reference``)."""
    if args.host:
        return _open_host(args, plan.profile)
    overrides = engine_overrides(args)
    if references is not None:
        overrides = dataclasses.replace(overrides, reference_answers=str(references))
    started = start_embedded(stack, overrides, plan.profile, plan.seed, plan.out / "engine.log")
    return msgspec.convert(started, SweepEndpoint)  # url, embedded, engine: the schema checks them


def _ladder_point(plan: SweepPlan, concurrency: int) -> LoadPoint:
    """A ladder point; in a v1.0 plan without --point-duration, as long as the rules ask (sweep/rules.py)."""
    point = concurrency_point(concurrency)
    if plan.submission_plan is None or plan.point_duration_given:
        return point
    return dataclasses.replace(point, duration_s=min_duration_s(concurrency, plan.submission_plan.agentic))


def _execute(plan: SweepPlan, args: argparse.Namespace, sweep: Sweep) -> Bisection | None:
    """Run the plan's points in order; the search's state when searching."""
    mode = plan.mode
    if mode == "concurrency":
        sweep.ladder([_ladder_point(plan, c) for c in plan.concurrency], plan.stop_at_saturation)
        if plan.offline:
            sweep.single(offline_point(plan.offline_concurrency, plan.offline_requests))
        return None
    hi: float | None = args.max
    if plan.offline:
        entry = sweep.single(offline_point(plan.offline_concurrency, plan.offline_requests))
        if hi is None and not sweep.halted:
            rps = entry.requests_per_s if entry else None
            if not rps:
                sweep.halted = sweep.stopped_because = "the offline point measured no throughput"
                return None
            hi = float(rps)
    if sweep.halted:
        return None
    if mode == "rate":
        try:
            rates = plan.rates or rate_ladder(float(hi or 0.0), args.min, args.steps)
        except ValueError as e:  # --min above the measured capacity
            sweep.stopped_because = str(e)
            return None
        loads = list({p.label: p for p in map(rate_point, rates)}.values())
        sweep.ladder(loads, plan.stop_at_saturation)
        return None
    assert hi is not None
    try:
        bisection = Bisection(
            lo=args.min if args.min is not None else hi / 16,
            hi=hi,
            tolerance=args.tolerance if args.tolerance is not None else DEFAULT_TOLERANCE,
            max_iterations=args.max_iterations if args.max_iterations is not None else DEFAULT_MAX_ITERATIONS,
        )
    except ValueError as e:
        sweep.stopped_because = str(e)
        return None
    sweep.search(bisection)
    return bisection


def _best_search_point(points: list[SweepPoint]) -> int | None:
    return best_search_point(points)  # never a point whose endpoint failed (sweep/analysis.py)


def _search(bisection: Bisection | None) -> SearchSummary | None:
    """sweep.json ``search``: the bisection's bounds and where it ended (a search only)."""
    if bisection is None:
        return None
    return SearchSummary(
        min=bisection.lo,
        max=bisection.hi,
        tolerance=bisection.tolerance,
        max_iterations=bisection.max_iterations,
        highest_passing_rate=bisection.passed,
        lowest_failing_rate=bisection.failed,
        runs=len(bisection.tried),
        lengthened_runs=len(bisection.lengthened),
    )


def _document(
    plan: SweepPlan,
    sweep: Sweep,
    endpoint: SweepEndpoint,
    interrupted: str | None,
    bisection: Bisection | None,
) -> SweepDocument:
    points = list(sweep.points)
    best = _best_search_point(points) if plan.mode == "search" else best_under_slo(points)
    election = elect_offline(points, plan.offline) if plan.mode == "concurrency" else None
    return SweepDocument(
        schema_version=SCHEMA_VERSION,
        kind="sweep",
        mode=plan.mode,
        status="interrupted" if interrupted else "completed",
        interrupted_reason=interrupted,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        tool={"name": "loadtest", "version": __version__},
        profile=plan.profile.name,
        profile_path=str(plan.profile_path),
        seed=plan.seed,
        fingerprint=plan.fingerprint,
        endpoint=endpoint,
        slo=plan.slo,
        point_duration_s=plan.point_duration_s,
        offline_concurrency=plan.offline_concurrency if plan.offline else None,
        stop_at_saturation=plan.mode != "search" and plan.stop_at_saturation,
        points=points,
        knee=knee(points, plan.mode),
        best_under_slo=best,
        stopped_because=sweep.stopped_because,
        search=_search(bisection),
        offline=election.mode if election is not None else None,
        offline_point=election.index if election is not None else None,
        offline_reason=election.reason if election is not None else None,
    )


def _summary(doc: SweepDocument) -> list[str]:
    lines = []
    for index, what in ((doc.knee, "knee"), (doc.best_under_slo, "best point under the SLOs")):
        p = doc.point(index)
        lines.append(f"{what}: {p.label} ({p.output_tps:,.1f} output tok/s)" if p else f"{what}: none")
    if doc.offline is not None:
        standing = doc.point(doc.offline_point)
        lines.append(
            f"offline: {doc.offline}{f' ({standing.label})' if standing else ''}: {doc.offline_reason}"
        )
    if doc.stopped_because:
        lines.append(f"stopped: {doc.stopped_because}")
    return lines


def run_sweep(args: argparse.Namespace) -> int:
    """`loadtest sweep` (options: loadtest/cli/sweep_cmd.py); the exit code."""
    configure_logging()
    if getattr(args, "plan", False):
        return print_plan(args)
    try:
        plan = _plan(args)
        accuracy, references = _accuracy_runs(args, plan)
    except LoadtestError as e:
        return fail(e)
    if plan.submission_plan is not None:
        for line in plan_lines(plan.submission_plan):
            print(line, flush=True)
    print(
        f"sweep {plan.profile.name}: {_describe(plan)}; {plan.point_duration_s:g}s per point; "
        f"writing {plan.out}/",
        flush=True,
    )
    for line in _evidence_warning(plan):
        print(f"  {line}", flush=True)
    runner = PointRunner(plan.out, [], accuracy)
    restore = runner.install_signal_handlers()
    try:
        with contextlib.ExitStack() as stack:
            try:
                endpoint = _open_endpoint(stack, args, plan, references)
            except LoadtestError as e:
                return fail(e)
            runner.run_args = [*plan.run_args, "--host", endpoint.url]

            def checkpoint() -> None:  # the points so far, marked running, in case the sweep is killed
                so_far = _document(plan, sweep, endpoint, None, None)
                write_sweep_document(plan.out, msgspec.structs.replace(so_far, status="running"))

            sweep = Sweep(runner, echo=lambda line: print(line, flush=True), checkpoint=checkpoint)
            bisection = _execute(plan, args, sweep)
    finally:
        restore()
    doc = _document(plan, sweep, endpoint, runner.interrupted, bisection)
    write_sweep_document(plan.out, doc)
    report = render_sweep_report(plan.out)
    for line in _summary(doc):
        print(line)
    print(f"sweep.json: {plan.out / SWEEP_FILE}")
    print(f"report:     {report}")
    if plan.mlperf_endpoints is not None:
        try:
            tree = write_submission(plan.out, doc, plan.mlperf_endpoints, plan.declarations)
        except SubmissionError as e:
            print(f"mlperf endpoints: not written: {e}")
        else:
            print(f"mlperf endpoints: {tree.curve} ({len(tree.points)} points)")
            for why in tree.left_out:
                print(f"  left out {why}")
    if runner.interrupted:
        return EXIT_INTERRUPTED.get(runner.interrupted, EXIT_COULD_NOT_RUN)
    if any(p.status == "failed" for p in doc.points):
        return EXIT_COULD_NOT_RUN
    return EXIT_OK if doc.best_under_slo is not None else EXIT_NO_POINT_PASSED
