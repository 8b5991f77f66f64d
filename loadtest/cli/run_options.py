"""The options of the commands that run load (run, master, ui, sweep) read from their command line into
loadtest/run's typed values, and the one error line a command ends with."""

from __future__ import annotations

import argparse
import sys
from typing import Any, get_args

from loadtest.client.preflight import CHECK_MODELS
from loadtest.economics.spec import OPTION_FIELDS
from loadtest.errors import LoadtestError
from loadtest.locust.progress import DEFAULT_PROGRESS_S
from loadtest.metrics.verdict import GeneratorHealth
from loadtest.run.options import EndpointOptions, RunOptions, TelemetryOptions
from loadtest.sim.start import EngineOverrides


def add_generator_health_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--generator-health fail|warn`` of run, master, ui and sweep (``what``: what it judges)."""
    parser.add_argument(
        "--generator-health",
        choices=get_args(GeneratorHealth),
        help=f"fail: an overloaded load generator (schedule lag, CPU) makes {what} invalid, exit 11; "
        f"warn: report it but never fail {what}, e.g. on a shared CI runner "
        "(default: the profile's judging.generator_health, fail)",
    )


def add_smoke_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--smoke`` of run, master, ui and sweep: the profile's minimums reported but not applied."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"a short check, not a result: the profile's minimum duration and query count (MLPerf: "
        f"600 s) are reported but do not make {what} invalid, and every output says it is not a "
        "compliant result (judging.smoke)",
    )


def add_max_requests_option(parser: argparse.ArgumentParser) -> None:
    """``--max-requests N`` of run and master: end the load once N units have been issued."""
    parser.add_argument(
        "--max-requests",
        type=_positive_int,
        metavar="N",
        help="issue N units (a request, or a whole multi-turn or agent session), then let them finish "
        "and end the run, or at --duration, whichever comes first (like vllm bench --num-prompts)",
    )


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1")
    return n


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--progress S`` / ``--quiet`` of run and master: a progress line on stderr every S seconds."""
    parser.add_argument(
        "--progress",
        type=float,
        default=None,
        metavar="S",
        help="while the load runs, a line on stderr every S seconds: requests (ok, failed), req/s, "
        "output tokens/s, TTFT p50/p99, requests in flight; and the drain announced (0: none; default: "
        f"every {DEFAULT_PROGRESS_S:g} s when stderr is a terminal, none when it is piped)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress lines (the start-up lines, warnings and the verdict still print)",
    )


def progress_interval(args: argparse.Namespace) -> float:
    """The progress interval the options ask for: none with --quiet, --progress when given, else the
    default on a terminal and none when stderr is piped (a CI log keeps the summary, not the ticker)."""
    if getattr(args, "quiet", False):
        return 0.0
    given = getattr(args, "progress", None)
    if given is not None:
        return float(given)
    return DEFAULT_PROGRESS_S if sys.stderr.isatty() else 0.0


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    """``--capture N`` / ``--capture-rate R``: request/response samples into capture.jsonl (docs/quality.md)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--capture",
        type=int,
        metavar="N",
        help="write the first N requests (body sent, answer received, outcome; the API key redacted) to "
        "capture.jsonl in the run folder (default: the profile's capture, else none)",
    )
    group.add_argument(
        "--capture-rate",
        type=float,
        metavar="R",
        help="capture a seeded sample, the fraction R (0 < R ≤ 1) of the requests, at most 1000",
    )


def fail(error: LoadtestError) -> int:
    """``loadtest: error: <its line>`` on stderr; the exit code it carries."""
    print(f"loadtest: error: {error}", file=sys.stderr)
    return error.exit_code


def run_options(args: argparse.Namespace, **given: Any) -> RunOptions:
    """The run options a command has (the others keep their defaults); ``given`` overrides them."""
    values: dict[str, Any] = {
        "profile": args.profile,
        "processes": getattr(args, "processes", 1),
        "concurrency": getattr(args, "concurrency", None),
        "rate": getattr(args, "rate", None),
        "ramp_up": getattr(args, "ramp_up", None),
        "seed": getattr(args, "seed", None),
        "seed_set": getattr(args, "seed_set", None),
        "duration": getattr(args, "duration", None),
        "tokenizer": getattr(args, "tokenizer", None),
        "dataset": getattr(args, "dataset", None),
        "slo": getattr(args, "slo", None),
        "warmup": getattr(args, "warmup", None),
        "cooldown": getattr(args, "cooldown", None),
        "generator_health": getattr(args, "generator_health", None),
        "smoke": getattr(args, "smoke", False),
        "progress_s": progress_interval(args),
        "max_requests": getattr(args, "max_requests", None),
        "api_key_env": getattr(args, "api_key_env", None),
        "api_key_file": getattr(args, "api_key_file", None),
        "verify_tls": not getattr(args, "insecure", False),
        "ca_bundle": getattr(args, "ca_bundle", None),
        "connect_timeout": getattr(args, "connect_timeout", None),
        "read_timeout": getattr(args, "read_timeout", None),
        "total_timeout": getattr(args, "total_timeout", None),
        "retries": getattr(args, "retries", None),
        "session_header": getattr(args, "session_header", None),
        "capture": getattr(args, "capture", None),
        "capture_rate": getattr(args, "capture_rate", None),
        "out": getattr(args, "out", None),
        "force": getattr(args, "force", False),
    }
    return RunOptions(**{**values, **given})


def endpoint_options(args: argparse.Namespace) -> EndpointOptions:
    """``--host`` (each replica), ``--hosts-file``, ``--balance``, ``--model``, ``--endpoint-check``,
    ``--server-info``, the hardware and price options and the ``--engine-*`` options a command has."""
    host = getattr(args, "host", None)
    hosts = getattr(args, "hosts", None) or ([host] if host else [])
    return EndpointOptions(
        hosts=tuple(hosts),
        hosts_file=getattr(args, "hosts_file", None),
        balance=getattr(args, "balance", None) or "round-robin",
        model=getattr(args, "model", None),
        endpoint_check=getattr(args, "endpoint_check", CHECK_MODELS),
        server_info=getattr(args, "server_info", None),
        engine=engine_overrides(args) if hasattr(args, "engine_gpu") else EngineOverrides(),
        hardware={opt: getattr(args, opt, None) for opt in OPTION_FIELDS},
        endpoint_file=getattr(args, "endpoint_file", None),
    )


def _header(text: str) -> tuple[str, str]:
    """``--otlp-header K=V``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        # the value is not echoed: it may be a secret given in another form ("Authorization: Bearer ...")
        raise argparse.ArgumentTypeError("a header is KEY=VALUE, e.g. x-scope-orgid=fleet")
    return key.strip(), value.strip()


def _interval(text: str) -> float:
    """``--otlp-interval S``: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0.1:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds, at least 0.1 (e.g. 10)")
    return value


def add_live_metrics_options(parser: argparse.ArgumentParser) -> None:
    """``--dcgm-url``, ``--prometheus-port/-bind-host/-hold`` and ``--otlp*`` of run and master
    (docs/telemetry.md)."""
    parser.add_argument(
        "--dcgm-url",
        metavar="URL",
        help="NVIDIA dcgm-exporter /metrics URL(s), comma-separated: GPU utilization, power, memory and "
        "SM clock polled with the endpoint's metrics; run.json then has energy per output token",
    )
    parser.add_argument(
        "--prometheus-port",
        type=int,
        metavar="PORT",
        help="serve this run's live metrics in Prometheus text on PORT (/metrics): latency histograms, "
        "tokens, outcomes, in flight, SLO attainment, per scenario (0: a free port)",
    )
    parser.add_argument(
        "--prometheus-bind-host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the live metrics listen on (default: %(default)s; 0.0.0.0 for a Prometheus elsewhere)",
    )
    parser.add_argument(
        "--prometheus-hold",
        type=float,
        default=0.0,
        metavar="S",
        help="after the load, keep serving until one scrape has read the final figures, at most S seconds "
        "(default: 0)",
    )
    parser.add_argument(
        "--otlp",
        action="store_true",
        help="push the live metrics over OTLP/HTTP to the collector that OTEL_EXPORTER_OTLP_METRICS_ENDPOINT "
        "or OTEL_EXPORTER_OTLP_ENDPOINT names (default http://localhost:4318); needs loadtest[otlp]",
    )
    parser.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="push the live metrics over OTLP/HTTP to this collector (a base URL gets /v1/metrics) every "
        "--otlp-interval and once at the end; implies --otlp",
    )
    parser.add_argument(
        "--otlp-interval",
        type=_interval,
        default=10.0,
        metavar="S",
        help="seconds between OTLP pushes (default: %(default)g)",
    )
    parser.add_argument(
        "--otlp-header",
        type=_header,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a header on every OTLP push (repeatable); put secrets in OTEL_EXPORTER_OTLP_HEADERS instead, "
        "which the exporter reads and nothing writes down",
    )


def telemetry_options(args: argparse.Namespace) -> TelemetryOptions:
    """``--no-telemetry``, ``--metrics-url`` (``--metrics-api-key-env``), ``--dcgm-url`` and the live
    metrics' options."""
    return TelemetryOptions(
        enabled=not getattr(args, "no_telemetry", False),
        metrics_url=getattr(args, "metrics_url", None),
        metrics_api_key_env=getattr(args, "metrics_api_key_env", None),
        gpu_metrics_url=getattr(args, "dcgm_url", None),
        prometheus_port=getattr(args, "prometheus_port", None),
        prometheus_bind=getattr(args, "prometheus_bind_host", "127.0.0.1"),
        prometheus_hold_s=getattr(args, "prometheus_hold", 0.0),
        otlp=bool(getattr(args, "otlp", False) or getattr(args, "otlp_endpoint", None)),
        otlp_endpoint=getattr(args, "otlp_endpoint", None),
        otlp_interval_s=getattr(args, "otlp_interval", 10.0),
        otlp_headers=tuple(getattr(args, "otlp_header", None) or ()),
    )


def engine_overrides(args: argparse.Namespace) -> EngineOverrides:
    """The --engine-* options of run, ui and sweep (cli/common_options.engine_parent)."""
    return EngineOverrides(
        gpu=args.engine_gpu,
        model=args.engine_model,
        tp=args.engine_tp,
        faults=args.engine_faults,
        speedup=args.engine_speedup,
        max_num_seqs=getattr(args, "engine_max_num_seqs", None),
        spec_decode=getattr(args, "engine_spec_decode", None),
        disagg=getattr(args, "engine_disagg", None),
        ep=getattr(args, "engine_ep", None),
        system=getattr(args, "engine_system", None),
        replicas=getattr(args, "engine_replicas", None),
        router=getattr(args, "engine_router", None),
        recorded=bool(getattr(args, "engine_recorded", False)),
    )
