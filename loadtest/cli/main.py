"""The ``loadtest`` command line: subcommands and their arguments."""

import argparse
import signal
import sys

from loadtest import __version__
from loadtest.cli.accuracy_cmd import add_parser as add_accuracy_parser
from loadtest.cli.cluster_cmd import add_parsers as add_cluster_parsers
from loadtest.cli.cluster_cmd import add_ui_master_options
from loadtest.cli.common_options import (
    add_engine_recorded_option,
    add_out_option,
    client_parent,
    engine_parent,
    load_parent,
    telemetry_parent,
    workload_parent,
)
from loadtest.cli.compare_cmd import add_parser as add_compare_parser
from loadtest.cli.endpoint_flags import add_endpoint_check_option, add_hosts_options
from loadtest.cli.endpoint_options import add_endpoint_options
from loadtest.cli.export_cmd import add_parser as add_export_parser
from loadtest.cli.run_options import (
    add_capture_options,
    add_live_metrics_options,
    add_max_requests_option,
    add_progress_option,
)
from loadtest.cli.suggest import SuggestingParser
from loadtest.cli.sweep_cmd import add_parser as add_sweep_parser
from loadtest.errors import EXIT_INTERRUPTED
from loadtest.fd_limit import raise_open_file_limit

# Commands that run Locust: gevent must patch the process before ssl, socket or threading are used.
GEVENT_COMMANDS = {"run", "ui", "master", "worker", "accuracy"}


def build_parser() -> argparse.ArgumentParser:
    ap = SuggestingParser(
        prog="loadtest",
        description="Service-level load tests for OpenAI-compatible LLM endpoints (MLPerf-style metrics).",
    )
    ap.add_argument("--version", action="version", version=f"loadtest {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run a headless load test and write run.json, records and report.html",
        description="One load test against --host (or the embedded engine), judged by the profile's SLOs "
        "and --slo; the run folder holds run.json, the record log, report.html and the MLPerf summary.",
        parents=[
            workload_parent("the run"),
            load_parent(),
            client_parent(),
            telemetry_parent(),
            engine_parent(),
        ],
    )
    add_hosts_options(run)  # -H/--host, --hosts-file, --balance (docs/multi-endpoint.md)
    add_endpoint_check_option(run)  # --endpoint-check models|none|PATH
    add_endpoint_options(run)  # --gpu-kind, --gpu-count, prices, --endpoint-file (docs/economics.md)
    add_capture_options(run)
    add_progress_option(run)
    add_max_requests_option(run)
    add_engine_recorded_option(run)  # the embedded engine answers recorded agent calls as recorded
    run.add_argument(
        "--junit", metavar="PATH", help="write the verdict as JUnit XML (one test case per check)"
    )
    add_out_option(run, "the run folder (default: reports/<timestamp>-<profile>/)")
    run.add_argument(
        "--force", action="store_true", help="--out may hold an earlier run: its files are replaced"
    )
    run.add_argument(
        "--processes", type=int, default=1, metavar="N", help="Locust worker processes on this host"
    )
    run.add_argument(
        "--server-info",
        metavar="FILE",
        help="server.json of the server under test (default: the one `loadtest serve` keeps for --host)",
    )
    add_live_metrics_options(run)

    ui = sub.add_parser(
        "ui",
        help="Locust's web UI with a live LLM metrics tab; each start is a run with results",
        description="Locust's web UI on this host with an LLM tab; every start in the UI is a run whose "
        "folder (run.json, records, report.html) goes under --out.",
        parents=[workload_parent("a run"), client_parent(), telemetry_parent(), engine_parent()],
    )
    add_hosts_options(ui)  # -H/--host, --hosts-file, --balance (docs/multi-endpoint.md)
    add_endpoint_check_option(ui)
    ui.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="N > 1: the users run in N local worker processes of this UI's master (default: %(default)s, "
        "in the UI's own process)",
    )
    add_ui_master_options(ui)  # --expect-workers, --master-bind-host, --master-port, --worker-timeout
    ui.add_argument(
        "--web-host",
        default="127.0.0.1",
        metavar="ADDR",
        help="interface the UI listens on (default: %(default)s; any other needs --web-login)",
    )
    ui.add_argument(
        "--web-port", type=int, default=8089, metavar="PORT", help="UI port (default: %(default)s)"
    )
    ui.add_argument(
        "--web-login",
        metavar="VAR",
        help="require Locust's login page; the environment variable VAR holds USER:PASSWORD (use it off loopback)",
    )
    add_out_option(
        ui,
        "each run writes DIR/<timestamp>-<profile>/ (default: %(default)s)",
        dest="reports_dir",
        default="reports",
    )
    ui.add_argument("--reports-dir", dest="reports_dir", default="reports", help=argparse.SUPPRESS)
    ui.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="on stop, let in-flight requests end (s)",
    )

    add_cluster_parsers(sub)  # master, worker
    add_compare_parser(sub)  # compare
    add_sweep_parser(sub)  # sweep

    rep = sub.add_parser(
        "report", help="rebuild report.html of a run folder from its run.json (sweep.html of a sweep folder)"
    )
    rep.add_argument("run_dir", metavar="DIR", help="a run folder (run.json) or a sweep folder (sweep.json)")
    rep.add_argument(
        "--mlperf-endpoints",
        metavar="DIR",
        help="a sweep folder: also write its concurrency points as an MLPerf Endpoints v1.0 submission tree "
        "in DIR (docs/sweep.md)",
    )
    rep.add_argument(
        "--endpoint-file",
        metavar="YAML",
        help="with --mlperf-endpoints: the system: fields of system_desc.json",
    )
    rep.add_argument(
        "--convention",
        choices=("loadtest", "loadgen", "endpoints"),
        help="a run folder: recompute one metric convention's file from the record log: loadtest "
        "(report.html), loadgen (mlperf_log_summary.txt, LoadGen's sorted[floor(n*p)]), endpoints "
        "(result_summary.json, MLPerf Endpoints v1.0) (docs/metrics.md, Conventions); default: report.html "
        "and mlperf_log_summary.txt",
    )
    add_export_parser(sub)  # export

    prof = sub.add_parser("profiles", help="list, show or validate traffic profiles (docs/profiles.md)")
    psub = prof.add_subparsers(dest="profiles_command", required=True)
    psub.add_parser("list", help="every shipped profile: name, load mode, scenarios, description")
    psub.add_parser("show", help="a profile as YAML, every default filled in").add_argument(
        "profile", metavar="NAME|FILE", help="a shipped profile name or a YAML path"
    )
    psub.add_parser("validate", help="check profile files; exit 0 only if all are valid").add_argument(
        "files", nargs="+", metavar="FILE", help="profile YAML files"
    )

    add_accuracy_parser(sub)  # loadtest accuracy BENCH:FILE (docs/accuracy.md)

    serve = sub.add_parser(
        "serve", help="run a server: the embedded engine (`serve sim`) or a real engine with a preset"
    )
    serve.add_argument(
        "engine",
        choices=["sim", "vllm", "sglang", "trtllm", "dynamo", "presets"],
        help="which server (`presets` lists the real engines' model presets; docs/serving.md)",
    )
    serve.add_argument(
        "sim_args", nargs=argparse.REMAINDER, help="that server's options (`loadtest serve ENGINE --help`)"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    raise_open_file_limit()
    # SIGINT stops every command, even when it was started with SIGINT ignored (a shell's background job,
    # whose children inherit that): Python then installs no handler of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _command(args)
    except KeyboardInterrupt:  # Ctrl-C before a run's own handlers took over: nothing was sent yet
        print(
            "loadtest: interrupted (Ctrl-C) before any request was sent; nothing to record", file=sys.stderr
        )
        return EXIT_INTERRUPTED["SIGINT"]


def _command(args: argparse.Namespace) -> int:
    """The command ``args`` name, run; its exit code."""
    if args.command in GEVENT_COMMANDS:
        from gevent import monkey

        monkey.patch_all()
    if args.command == "serve" and args.engine != "sim":
        from loadtest.cli.serve_cmd import serve_command

        return serve_command(args.engine, args.sim_args)
    if args.command == "serve":
        from loadtest.sim.__main__ import main as sim_main

        return sim_main(args.sim_args, prog="loadtest serve sim")
    if args.command == "run":
        from loadtest.cli.run_cmd import run_command

        return run_command(args)
    if args.command == "ui":
        from loadtest.cli.ui_cmd import ui_command

        return ui_command(args)
    if args.command == "master":
        from loadtest.cli.cluster_cmd import master_command

        return master_command(args)
    if args.command == "worker":
        from loadtest.cli.cluster_cmd import worker_command

        return worker_command(args)
    if args.command == "profiles":
        from loadtest.cli.profiles_cmd import profiles_command

        return profiles_command(args)
    if args.command == "report":
        from loadtest.cli.report_cmd import report_command

        return report_command(args)
    if args.command == "export":
        from loadtest.cli.export_cmd import export_command

        return export_command(args)
    if args.command == "sweep":
        from loadtest.cli.sweep_cmd import sweep_command

        return sweep_command(args)
    if args.command == "accuracy":
        from loadtest.cli.accuracy_cmd import accuracy_command

        return accuracy_command(args)
    if args.command == "compare":
        from loadtest.cli.compare_cmd import compare_command

        return compare_command(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
