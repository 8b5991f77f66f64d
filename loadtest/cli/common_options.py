"""The options run, master, ui and sweep share, as argparse parent parsers: one name, help and metavar each."""

from __future__ import annotations

import argparse
from typing import get_args

from loadtest.cli.run_options import add_generator_health_option, add_smoke_option
from loadtest.cli.suggest import SuggestingParser
from loadtest.profile.schema import RouterName

DEFAULT_PROFILE = "interactive-chat"


def _parent() -> SuggestingParser:
    return SuggestingParser(add_help=False)


def workload_parent(what: str) -> SuggestingParser:
    """--profile/-p, --model/-m, the API key, --tokenizer, --seed, --slo, --warmup, --cooldown,
    --generator-health and --smoke (``what``: what is judged, "the run" or "a point")."""
    p = _parent()
    p.add_argument(
        "-p",
        "--profile",
        default=DEFAULT_PROFILE,
        metavar="NAME|FILE",
        help="shipped profile name (`loadtest profiles list`) or YAML path (default: %(default)s)",
    )
    p.add_argument(
        "-m",
        "--model",
        metavar="NAME",
        help="model name to request (default: the profile's, else the endpoint's first model)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="name of the environment variable holding the API key (default: OPENAI_API_KEY if set); "
        "every worker reads its own",
    )
    p.add_argument(
        "--api-key-file",
        metavar="PATH",
        help="file holding the API key, instead of --api-key-env (the same path on every worker host)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="NAME|PATH",
        help="llama3, cl100k, o200k, o200k_harmony, qwen3, or a tokenizer.json / folder path "
        "(default: the profile's, else the served model's own)",
    )
    p.add_argument(
        "--dataset",
        metavar="PATH",
        help="send the prompts of this file instead of the profile's scenarios: ShareGPT JSON, OpenAI-chat "
        "JSONL, a prompts CSV/JSONL/Parquet or a saved HF dataset folder, read by its shape (docs/datasets.md)",
    )
    p.add_argument("--seed", type=int, metavar="N", help="workload and arrival seed (default: the profile's)")
    p.add_argument(
        "--seed-set",
        metavar="FILE:COHORT[:SET]",
        help="an MLCommons seed set: its scheduler_rng_seed drives the arrivals, sample_index_rng_seed the "
        "workload, model_seed is recorded (docs/profiles.md, Seeds); not with --seed",
    )
    p.add_argument(
        "--slo",
        metavar="SPEC",
        help="SLOs to judge, e.g. ttft_p99=2s,tpot_p99=80ms,error_rate=0.5%% (merged over the profile's; "
        "latencies in us, ms or s, rates in %% or as a fraction below 1)",
    )
    p.add_argument(
        "--warmup",
        metavar="S|auto",
        help="judge only requests scheduled after this (30s, 1m, auto: steady state, 0: from the start; "
        "default 10%% of the run, at most 30s)",
    )
    p.add_argument("--cooldown", metavar="S|auto", help="and before this long before the last one (or auto)")
    add_generator_health_option(p, what)
    add_smoke_option(p, what)
    return p


def client_parent() -> SuggestingParser:
    """The client policy: --connect-timeout, --read-timeout, --total-timeout, --retries, --session-header,
    --insecure, --ca-bundle."""
    p = _parent()
    g = p.add_argument_group("client policy (default: the profile's client section; docs/reliability.md)")
    g.add_argument(
        "--connect-timeout",
        type=float,
        metavar="S",
        help="longest TCP/TLS connect (default: the profile's client.connect_timeout_s, 10)",
    )
    g.add_argument(
        "--read-timeout",
        type=float,
        metavar="S",
        help="longest silence within a response (default: the profile's client.read_timeout_s, 300)",
    )
    g.add_argument(
        "--total-timeout",
        type=float,
        metavar="S",
        help="longest whole request, 0 = none (default: the profile's client.total_timeout_s, 0)",
    )
    g.add_argument(
        "--retries",
        type=int,
        metavar="N",
        help="resend a 429/503 answer up to N times, each a separate record (default: the profile's, 0)",
    )
    g.add_argument(
        "--session-header",
        metavar="NAME",
        help="the header carrying each multi-turn chat's or agent's session id on every call, for "
        "session-aware routers; none: no such header (default: the profile's request.session_header, "
        "X-Session-ID)",
    )
    g.add_argument(
        "--insecure",
        action="store_true",
        help="do not verify TLS certificates, for every request (recorded in the verdict)",
    )
    g.add_argument(
        "--ca-bundle",
        metavar="FILE",
        help="PEM file of the CAs to trust for every request (default: REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, "
        "SSL_CERT_FILE, else the system's; docs/network.md)",
    )
    return p


def load_parent(total: str = "") -> SuggestingParser:
    """--duration/-d, --concurrency/-c | --rate/-r and --ramp-up (``total``: " in all" when spread over
    workers)."""
    p = _parent()
    p.add_argument(
        "-d",
        "--duration",
        metavar="TIME",
        help="how long to issue requests: 90, 90s, 5m, 1h (default: the profile's)",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "-c", "--concurrency", type=int, metavar="N", help=f"closed loop: N concurrent streams{total}"
    )
    load.add_argument(
        "-r", "--rate", type=float, metavar="R", help=f"open loop: R requests/s{total}, Poisson arrivals"
    )
    p.add_argument(
        "--ramp-up",
        metavar="S",
        help="closed loop: start the streams over this many seconds (0: at once; default: at once up to "
        "500 a process, else 1,000 a second a process, at most a third of the run); the judged window "
        "begins after the last one started",
    )
    return p


def telemetry_parent() -> SuggestingParser:
    """--no-telemetry, --metrics-url and --metrics-api-key-env."""
    p = _parent()
    g = p.add_argument_group("server telemetry (docs/telemetry.md)")
    g.add_argument("--no-telemetry", action="store_true", help="do not poll the endpoint's /metrics")
    g.add_argument(
        "--metrics-url",
        metavar="URL",
        help="Prometheus URL(s) to poll, comma-separated (default: HOST/metrics); the API key goes only "
        "to those on the endpoint's own origin",
    )
    g.add_argument(
        "--metrics-api-key-env",
        metavar="NAME",
        help="environment variable holding a Bearer key for --metrics-url URLs on another origin",
    )
    return p


def engine_parent(scope: str = "") -> SuggestingParser:
    """The embedded engine's --engine-* options (``scope``: e.g. "; one engine for every point")."""
    p = _parent()
    g = p.add_argument_group(f"embedded engine (only without --host{scope}; docs/engine.md)")
    g.add_argument(
        "--engine-gpu", metavar="NAME", help="GPU preset (default: the profile's engine.gpu, else H100)"
    )
    g.add_argument(
        "--engine-model",
        metavar="NAME",
        help="model preset (default: the profile's engine.model, else llama-3.1-8b)",
    )
    g.add_argument(
        "--engine-tp",
        type=int,
        metavar="N",
        help="tensor-parallel GPUs (default: the profile's engine.tp, else 1)",
    )
    g.add_argument(
        "--engine-faults",
        metavar="SPEC",
        help="inject faults (docs/engine.md), e.g. http_503=2%%,stall_mid_stream=#3@2",
    )
    g.add_argument(
        "--engine-speedup",
        type=float,
        default=1.0,
        metavar="X",
        help="run the engine clock X times faster (default: %(default)g)",
    )
    g.add_argument(
        "--engine-max-num-seqs",
        type=int,
        metavar="N",
        help="the engine's running-batch limit (vLLM max_num_seqs; default: the engine's, 1024)",
    )
    g.add_argument(
        "--engine-spec-decode",
        metavar="K:A",
        help="speculative decoding / MTP in the engine: K draft tokens a step, acceptance A, e.g. 3:0.7 "
        "(default: the profile's engine.spec_decode, else off)",
    )
    g.add_argument(
        "--engine-ep",
        type=int,
        metavar="N",
        help="wide expert parallelism (MoE): N data-parallel groups of --engine-tp GPUs share the experts "
        "(default: the profile's engine.ep, else 1)",
    )
    g.add_argument(
        "--engine-system",
        metavar="NAME",
        help="rack-scale system preset, e.g. GB300-NVL72 or GB300-NVL72x4 (default: the profile's engine.system)",
    )
    g.add_argument(
        "--engine-disagg",
        metavar="P:D[@GBPS]",
        help="disaggregated prefill/decode in the engine: P prefill and D decode instances, KV link GB/s "
        "per GPU (default: the profile's engine.disagg, else one aggregated instance)",
    )
    g.add_argument(
        "--engine-replicas",
        type=int,
        metavar="N",
        help="N replicas of the engine behind its one endpoint, each its own KV and prefix cache "
        "(default: the profile's engine.replicas, else 1)",
    )
    g.add_argument(
        "--engine-router",
        choices=get_args(RouterName),
        help="how the replicas' router picks one: round-robin, session (affinity by the session header), "
        "kv (cached prefix against load) (default: the profile's engine.router, else round-robin)",
    )
    return p


def add_engine_recorded_option(parser: argparse.ArgumentParser) -> None:
    """``--engine-recorded`` (run): the embedded engine answers recorded agent calls as recorded."""
    parser.add_argument(
        "--engine-recorded",
        action="store_true",
        help="the embedded engine answers each recorded agent call (an agent_trace recording with expected "
        "answers: MLPerf agentic) with its recorded answer, tool calls included: the agentic accuracy's "
        "ceiling (docs/traces.md)",
    )


def add_out_option(
    parser: argparse.ArgumentParser, what: str, dest: str = "out", default: str | None = None
) -> None:
    """-o/--out DIR (``what``: what the folder holds and its default)."""
    parser.add_argument("-o", "--out", dest=dest, default=default, metavar="DIR", help=what)
