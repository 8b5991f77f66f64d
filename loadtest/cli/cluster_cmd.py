"""``loadtest master`` and ``loadtest worker``: one run spread over workers on this or other hosts."""

from __future__ import annotations

import argparse

from loadtest.cli.common_options import (
    add_out_option,
    client_parent,
    load_parent,
    telemetry_parent,
    workload_parent,
)
from loadtest.cli.endpoint_flags import add_endpoint_check_option
from loadtest.cli.run_options import (
    add_live_metrics_options,
    add_max_requests_option,
    add_progress_option,
    endpoint_options,
    fail,
    run_options,
    telemetry_options,
)
from loadtest.errors import LoadtestError
from loadtest.log_setup import configure_logging

DEFAULT_MASTER_PORT = 5557


def _add_listen_options(p: argparse.ArgumentParser, timeout_help: str) -> None:
    """Where a master listens for its workers, and how long it waits for them."""
    p.add_argument(
        "--master-bind-host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address to listen on for workers (default: %(default)s; 0.0.0.0 lets other machines in)",
    )
    p.add_argument(
        "--master-port",
        type=int,
        default=DEFAULT_MASTER_PORT,
        metavar="PORT",
        help="port to listen on for workers (default: %(default)s)",
    )
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help=f"{timeout_help} (default: %(default)gs)",
    )


def add_ui_master_options(ui: argparse.ArgumentParser) -> None:
    """`loadtest ui` as a master: its runs' users on N `loadtest worker` processes started anywhere."""
    ui.add_argument(
        "--expect-workers",
        type=int,
        metavar="N",
        help="run every start's users on N `loadtest worker` processes (this host or others) that join "
        "this UI and stay for run after run; a start is refused until all N are connected",
    )
    _add_listen_options(ui, "at each start, how long to wait for every worker to set up the run")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``master`` and ``worker`` subcommands."""
    m = sub.add_parser(
        "master",
        help="run like `loadtest run --processes N`, with N `loadtest worker` processes started anywhere",
        description="One run whose users run in N `loadtest worker` processes (this host or others); "
        "the master merges their records and judges the run like `loadtest run`.",
        parents=[workload_parent("the run"), load_parent(" in all"), client_parent(), telemetry_parent()],
    )
    m.add_argument(
        "--expect-workers", type=int, required=True, metavar="N", help="wait for N workers, then run"
    )
    _add_listen_options(m, "how long to wait for the workers to connect")
    m.add_argument(
        "-H", "--host", required=True, metavar="URL", help="endpoint base URL every worker can reach"
    )
    add_endpoint_check_option(m)
    add_progress_option(m)
    add_max_requests_option(m)
    m.add_argument("--junit", metavar="PATH", help="write the verdict as JUnit XML (one test case per check)")
    add_out_option(m, "the run folder (default: reports/<timestamp>-<profile>/)")
    m.add_argument(
        "--force", action="store_true", help="--out may hold an earlier run: its files are replaced"
    )
    add_live_metrics_options(m)

    w = sub.add_parser("worker", help="run users for a `loadtest master`; settings come from the master")
    w.add_argument(
        "--master-host",
        default="127.0.0.1",
        metavar="HOST",
        help="the `loadtest master` to join (default: %(default)s)",
    )
    w.add_argument(
        "--master-port",
        type=int,
        default=DEFAULT_MASTER_PORT,
        metavar="PORT",
        help="its port (default: %(default)s)",
    )
    w.add_argument(
        "--master-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="give up when no master answers within this long (default: %(default)gs)",
    )
    add_out_option(
        w,
        "folder for this worker's own copy of its records, kept after the run (default: a temporary "
        "folder, removed when the run ends normally: the master's run folder has every record)",
    )


def master_command(args: argparse.Namespace) -> int:
    from loadtest.run import MasterOptions, connect_host, execute, finalize, prepare
    from loadtest.run.endpoint import EndpointFacts
    from loadtest.run.results import FinishedRun

    configure_logging()
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
            early_notes=[*ep.notes, *executed.notes],
            junit=args.junit,
        )
    )
    for line in results.lines:
        print(line)
    return results.exit_code


def worker_command(args: argparse.Namespace) -> int:
    from loadtest.locust.worker_session import worker_main

    configure_logging()
    return worker_main(args.master_host, args.master_port, out=args.out, master_wait_s=args.master_timeout)
