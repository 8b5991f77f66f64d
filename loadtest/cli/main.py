"""The ``loadtest`` command line: subcommands and their arguments."""

import argparse
import sys

from loadtest import __version__
from loadtest.cli.cluster_cmd import add_parsers as add_cluster_parsers
from loadtest.cli.compare_cmd import add_parser as add_compare_parser
from loadtest.cli.endpoint_flags import HostAction, add_endpoint_check_option, add_fleet_options
from loadtest.cli.endpoint_options import add_endpoint_options
from loadtest.cli.export_cmd import add_parser as add_export_parser
from loadtest.cli.run_options import (
    add_capture_options,
    add_generator_health_option,
    add_max_requests_option,
    add_progress_option,
    add_smoke_option,
)
from loadtest.cli.sweep_cmd import add_parser as add_sweep_parser
from loadtest.fd_limit import raise_open_file_limit

# Commands that run Locust: gevent must patch the process before ssl, socket or threading are used.
GEVENT_COMMANDS = {"run", "ui", "master", "worker"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="loadtest",
        description="Service-level load tests for OpenAI-compatible LLM endpoints (MLPerf-style metrics).",
    )
    ap.add_argument("--version", action="version", version=f"loadtest {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a headless load test and write run.json, records and report.html")
    run.add_argument(
        "--profile",
        default="interactive-chat",
        help="shipped profile name or YAML path (default: %(default)s)",
    )
    run.add_argument(
        "--host",
        action=HostAction,
        help="endpoint base URL, e.g. http://10.0.0.5:8000; give it again for each replica "
        "(default: start the embedded engine)",
    )
    add_fleet_options(run)  # --hosts-file, --balance (docs/multi-endpoint.md)
    add_endpoint_check_option(run)  # --endpoint-check models|none|PATH
    add_endpoint_options(run)  # --gpu-kind, --gpu-count, prices, --endpoint-file (docs/economics.md)
    run.add_argument(
        "--model", help="model name to request (default: the profile's, else the endpoint's first model)"
    )
    run.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=None,
        help="name of the environment variable holding the API key (default: OPENAI_API_KEY if set)",
    )
    run.add_argument(
        "--api-key-file", metavar="PATH", help="file holding the API key (instead of --api-key-env)"
    )
    run.add_argument(
        "--duration", help="how long to issue requests: 90, 90s, 5m, 1h (default: the profile's)"
    )
    load = run.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, metavar="N", help="closed loop: N concurrent streams")
    load.add_argument("--rate", type=float, metavar="R", help="open loop: R requests/s, Poisson arrivals")
    run.add_argument(
        "--tokenizer", help="llama3, cl100k, o200k, o200k_harmony, qwen3, or a tokenizer.json / folder path"
    )
    run.add_argument("--seed", type=int, help="workload and arrival seed (default: the profile's)")
    run.add_argument(
        "--slo",
        metavar="SPEC",
        help="SLOs to judge, e.g. ttft_p99=2s,tpot_p99=80ms,error_rate=0.5%% (merged over the profile's)",
    )
    add_capture_options(run)
    run.add_argument(
        "--warmup",
        metavar="S|auto",
        help="judge only requests scheduled after this (30s, 1m, auto: steady state, 0: from the start; "
        "default 10%% of the run, at most 30s)",
    )
    run.add_argument(
        "--cooldown", metavar="S|auto", help="and before this long before the last one (or auto)"
    )
    add_generator_health_option(run, "the run")
    add_smoke_option(run, "the run")
    add_progress_option(run)
    add_max_requests_option(run)
    run.add_argument(
        "--junit", metavar="PATH", help="write the verdict as JUnit XML (one test case per check)"
    )
    run.add_argument("--out", help="output folder (default: reports/<timestamp>-<profile>/)")
    run.add_argument(
        "--force", action="store_true", help="--out may hold an earlier run: its files are replaced"
    )
    run.add_argument(
        "--processes", type=int, default=1, metavar="N", help="Locust worker processes on this host"
    )
    run.add_argument(
        "--connect-timeout",
        type=float,
        metavar="S",
        help="default: the profile's client.connect_timeout_s (10)",
    )
    run.add_argument(
        "--read-timeout",
        type=float,
        metavar="S",
        help="longest silence within a response (default: the profile's client.read_timeout_s, 300)",
    )
    run.add_argument(
        "--total-timeout",
        type=float,
        metavar="S",
        help="longest whole request, 0 = none (default: the profile's client.total_timeout_s, 0)",
    )
    run.add_argument(
        "--retries",
        type=int,
        metavar="N",
        help="resend a 429/503 answer up to N times, each a separate record (default: the profile's, 0)",
    )
    run.add_argument(
        "--insecure", action="store_true", help="do not verify TLS certificates (recorded in the verdict)"
    )
    tele = run.add_argument_group("server telemetry and record (docs/telemetry.md)")
    tele.add_argument("--no-telemetry", action="store_true", help="do not poll the endpoint's /metrics")
    tele.add_argument(
        "--metrics-url",
        metavar="URL",
        help="Prometheus URL(s) to poll, comma-separated (default: HOST/metrics)",
    )
    tele.add_argument(
        "--server-info",
        metavar="FILE",
        help="server.json of the server under test (default: the one `loadtest serve` keeps for --host)",
    )
    eng = run.add_argument_group("embedded engine (only without --host)")
    eng.add_argument("--engine-gpu", help="GPU preset (default: the profile's engine.gpu, else H100)")
    eng.add_argument(
        "--engine-model", help="model preset (default: the profile's engine.model, else llama-3.1-8b)"
    )
    eng.add_argument(
        "--engine-tp", type=int, help="tensor-parallel GPUs (default: the profile's engine.tp, else 1)"
    )
    eng.add_argument(
        "--engine-faults",
        metavar="SPEC",
        help="inject faults (docs/engine.md), e.g. http_503=2%%,stall_mid_stream=#3@2",
    )
    eng.add_argument(
        "--engine-speedup", type=float, default=1.0, help="run the engine clock this many times faster"
    )

    ui = sub.add_parser(
        "ui", help="Locust's web UI with a live LLM metrics tab; each start is a run with results"
    )
    ui.add_argument(
        "--profile",
        default="interactive-chat",
        help="shipped profile name or YAML path (default: %(default)s)",
    )
    ui.add_argument("--host", help="endpoint base URL (default: start the embedded engine)")
    add_endpoint_check_option(ui)
    ui.add_argument(
        "--model", help="model name to request (default: the profile's, else the endpoint's first)"
    )
    ui.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    ui.add_argument("--api-key-file", metavar="PATH", help="file holding the API key")
    ui.add_argument("--no-telemetry", action="store_true", help="do not poll the endpoint's /metrics")
    ui.add_argument("--metrics-url", metavar="URL", help="Prometheus URL(s) to poll (default: HOST/metrics)")
    ui.add_argument(
        "--slo", metavar="SPEC", help="SLOs to judge, merged over the profile's (ttft_p99=2s,...)"
    )
    add_generator_health_option(ui, "a run")
    add_smoke_option(ui, "a run")
    ui.add_argument("--seed", type=int, help="workload and arrival seed (default: the profile's)")
    ui.add_argument("--tokenizer", help="tokenizer name or tokenizer.json path (default: the profile's)")
    ui.add_argument(
        "--processes", type=int, default=1, metavar="N", help="Locust processes (the UI supports 1 for now)"
    )
    ui.add_argument(
        "--web-host",
        default="127.0.0.1",
        help="interface the UI listens on (default: %(default)s; any other needs --web-login)",
    )
    ui.add_argument("--web-port", type=int, default=8089, help="UI port (default: %(default)s)")
    ui.add_argument(
        "--web-login",
        metavar="VAR",
        help="require Locust's login page; the environment variable VAR holds USER:PASSWORD (use it off loopback)",
    )
    ui.add_argument(
        "--reports-dir",
        default="reports",
        help="each run writes <dir>/<timestamp>-<profile>/ (default: %(default)s)",
    )
    ui.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="on stop, let in-flight requests end (s)",
    )
    ui.add_argument("--connect-timeout", type=float, metavar="S", help="default: the profile's client policy")
    ui.add_argument("--read-timeout", type=float, metavar="S", help="default: the profile's client policy")
    ui.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    eng = ui.add_argument_group("embedded engine (only without --host)")
    eng.add_argument("--engine-gpu", help="GPU preset (default: the profile's engine.gpu)")
    eng.add_argument("--engine-model", help="model preset (default: the profile's engine.model)")
    eng.add_argument("--engine-tp", type=int, help="tensor-parallel GPUs (default: the profile's engine.tp)")
    eng.add_argument("--engine-faults", metavar="SPEC", help="inject faults (docs/engine.md)")
    eng.add_argument(
        "--engine-speedup", type=float, default=1.0, help="run the engine clock this many times faster"
    )

    add_cluster_parsers(sub)  # master, worker
    add_compare_parser(sub)  # compare
    add_sweep_parser(sub)  # sweep

    rep = sub.add_parser(
        "report", help="rebuild report.html of a run folder from its run.json (sweep.html of a sweep folder)"
    )
    rep.add_argument("run_dir")
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
    add_export_parser(sub)  # export

    prof = sub.add_parser("profiles", help="list, show or validate traffic profiles (docs/profiles.md)")
    psub = prof.add_subparsers(dest="profiles_command", required=True)
    psub.add_parser("list", help="every shipped profile: name, load mode, scenarios, description")
    psub.add_parser("show", help="a profile as YAML, every default filled in").add_argument(
        "profile", metavar="NAME|FILE"
    )
    psub.add_parser("validate", help="check profile files; exit 0 only if all are valid").add_argument(
        "files", nargs="+", metavar="FILE"
    )

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
    if args.command in GEVENT_COMMANDS:
        from gevent import monkey

        monkey.patch_all()
    if args.command == "serve" and args.engine != "sim":
        from loadtest.cli.serve_cmd import serve_command

        return serve_command(args.engine, args.sim_args)
    if args.command == "serve":
        from loadtest.sim.__main__ import main as sim_main

        return sim_main(args.sim_args)
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
    if args.command == "compare":
        from loadtest.cli.compare_cmd import compare_command

        return compare_command(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
