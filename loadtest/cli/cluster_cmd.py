"""``loadtest master`` and ``loadtest worker``: one run spread over workers on this or other hosts."""

from __future__ import annotations

import argparse
import logging

from loadtest.cli.endpoint_flags import add_endpoint_check_option
from loadtest.cli.run_options import (
    add_generator_health_option,
    add_live_metrics_options,
    add_max_requests_option,
    add_progress_option,
    add_smoke_option,
    endpoint_options,
    fail,
    run_options,
    telemetry_options,
)
from loadtest.errors import LoadtestError

DEFAULT_MASTER_PORT = 5557


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``master`` and ``worker`` subcommands."""
    m = sub.add_parser(
        "master",
        help="run like `loadtest run --processes N`, with N `loadtest worker` processes started anywhere",
    )
    m.add_argument(
        "--expect-workers", type=int, required=True, metavar="N", help="wait for N workers, then run"
    )
    m.add_argument(
        "--master-bind-host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address to listen on for workers (default: %(default)s; 0.0.0.0 lets other machines in)",
    )
    m.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT, metavar="PORT")
    m.add_argument(
        "--worker-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="how long to wait for the workers to connect (default: %(default)gs)",
    )
    m.add_argument("--profile", default="interactive-chat", help="shipped profile name or YAML path")
    m.add_argument("--host", required=True, help="endpoint base URL every worker can reach")
    add_endpoint_check_option(m)
    m.add_argument(
        "--model", help="model name to request (default: the profile's, else the endpoint's first)"
    )
    m.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="name of the variable holding the API key; each worker reads its own (default: OPENAI_API_KEY if set)",
    )
    m.add_argument(
        "--api-key-file", metavar="PATH", help="file holding the API key (the same path on every worker host)"
    )
    m.add_argument("--duration", help="how long to issue requests: 90, 90s, 5m, 1h (default: the profile's)")
    load = m.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, metavar="N", help="closed loop: N concurrent streams in all")
    load.add_argument(
        "--rate", type=float, metavar="R", help="open loop: R requests/s in all, Poisson arrivals"
    )
    m.add_argument(
        "--tokenizer", help="tokenizer name or tokenizer.json path (the same path on every worker)"
    )
    m.add_argument("--seed", type=int, help="workload and arrival seed (default: the profile's)")
    m.add_argument("--slo", metavar="SPEC", help="SLOs to judge, e.g. ttft_p99=2s,error_rate=0.5%%")
    m.add_argument("--warmup", metavar="S|auto", help="judge only requests scheduled after this")
    m.add_argument("--cooldown", metavar="S|auto", help="and before this long before the last one")
    add_generator_health_option(m, "the run")
    add_smoke_option(m, "the run")
    add_progress_option(m)
    add_max_requests_option(m)
    m.add_argument("--junit", metavar="PATH", help="write the verdict as JUnit XML")
    m.add_argument("--out", help="output folder (default: reports/<timestamp>-<profile>/)")
    m.add_argument(
        "--force", action="store_true", help="--out may hold an earlier run: its files are replaced"
    )
    m.add_argument("--connect-timeout", type=float, metavar="S", help="default: the profile's client policy")
    m.add_argument("--read-timeout", type=float, metavar="S", help="default: the profile's client policy")
    m.add_argument("--total-timeout", type=float, metavar="S", help="default: the profile's client policy")
    m.add_argument("--retries", type=int, metavar="N", help="resend 429/503 up to N times (default: 0)")
    m.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    m.add_argument("--no-telemetry", action="store_true", help="do not poll the endpoint's /metrics")
    m.add_argument("--metrics-url", metavar="URL", help="Prometheus URL(s) to poll (default: HOST/metrics)")
    add_live_metrics_options(m)

    w = sub.add_parser("worker", help="run users for a `loadtest master`; settings come from the master")
    w.add_argument("--master-host", default="127.0.0.1", metavar="HOST", help="default: %(default)s")
    w.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT, metavar="PORT")
    w.add_argument(
        "--master-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="give up when no master answers within this long (default: %(default)gs)",
    )
    w.add_argument(
        "--out",
        help="folder for this worker's own copy of its records, kept after the run (default: a temporary "
        "folder, removed when the run ends normally: the master's run folder has every record)",
    )


def master_command(args: argparse.Namespace) -> int:
    from loadtest.run import MasterOptions, connect_host, execute, finalize, prepare
    from loadtest.run.endpoint import EndpointFacts
    from loadtest.run.results import FinishedRun

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    n = args.expect_workers
    options = run_options(args, processes=n, processes_option="--expect-workers")
    try:
        prepared = prepare(options, host=args.host)
        settings, out = prepared.settings, prepared.out
        assert out is not None
        ep = connect_host(prepared, endpoint_options(args))
        profile = prepared.profile
        print(
            f"master on {args.master_bind_host}:{args.master_port}: waiting for {n} worker(s), then "
            f"{profile.name} for {settings.duration_s:g}s: {profile.load.describe()}, "
            f"model {settings.model}; writing {out}/",
            flush=True,
        )
        # the endpoint's /metrics each second, from the master (docs/telemetry.md)
        master = MasterOptions(args.master_port, bind_host=args.master_bind_host, wait_s=args.worker_timeout)
        executed = execute(prepared, ep, telemetry_options(args), master=master)
    except LoadtestError as e:
        return fail(e)
    results = finalize(
        FinishedRun(
            settings,
            profile,
            prepared.workload,
            prepared.slos,
            executed.outcome,
            out,
            EndpointFacts(ep.models),  # the workers' endpoint: its models (no engine, server or context here)
            telemetry=executed.telemetry,
            junit=args.junit,
        )
    )
    for line in results.lines:
        print(line)
    return results.exit_code


def worker_command(args: argparse.Namespace) -> int:
    from loadtest.locust.worker_session import worker_main

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return worker_main(args.master_host, args.master_port, out=args.out, master_wait_s=args.master_timeout)
