"""Command line: run the simulated engine server until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from loadtest.fd_limit import raise_open_file_limit
from loadtest.gc_tuning import tune_gc
from loadtest.profile.request import SESSION_HEADER
from loadtest.sim.disagg_spec import parse_disagg
from loadtest.sim.faults import FaultSpecError, parse_spec
from loadtest.sim.presets import EngineConfig, get_gpu, get_model, get_system
from loadtest.sim.reference import load_recorded, load_references
from loadtest.sim.router import ROUTERS
from loadtest.sim.server import STATE_KEY, ServerOptions, create_app
from loadtest.sim.spec_decode import parse_spec_decode

LISTENING_PREFIX = "LOADTEST_SIM_LISTENING"


def build_parser(prog: str = "python -m loadtest.sim") -> argparse.ArgumentParser:
    """The engine's options; ``prog``: the command that runs it (``loadtest serve sim``)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    p.add_argument(
        "--host", default="127.0.0.1", metavar="ADDR", help="address to listen on (default: %(default)s)"
    )
    p.add_argument("--port", type=int, default=0, metavar="PORT", help="0 picks a free port")
    p.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        metavar="PORT",
        help="also serve KServe v2 over gRPC on this port (0 picks a free one; GET /sim/stats names it)",
    )
    p.add_argument(
        "--gpu",
        default=None,
        metavar="NAME",
        help="GPU preset (--list-presets shows them; default: the --system's GPU, else H100)",
    )
    p.add_argument(
        "--model",
        default="llama-3.1-8b",
        metavar="NAME",
        help="model preset (--list-presets shows them; default: %(default)s)",
    )
    p.add_argument("--list-presets", action="store_true", help="print the GPU and model presets and exit")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel size (default: 1)")
    p.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        metavar="X",
        help="run the engine clock X times faster (default: 1)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the answers' tokens and of faults (default: 0)",
    )
    p.add_argument(
        "--truth-log",
        default=None,
        metavar="PATH",
        help="append each finished request's truth record (JSONL)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        metavar="N",
        help="running-batch limit, like vLLM's max_num_seqs (default: 1024)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens per engine step, like vLLM's max_num_batched_tokens (default: the preset's)",
    )
    p.add_argument(
        "--spec-decode",
        default=None,
        metavar="K:A",
        help="speculative decoding / MTP: K draft tokens a step, each accepted with probability A "
        "(e.g. 3:0.7; docs/engine.md)",
    )
    p.add_argument(
        "--ep",
        type=int,
        default=1,
        metavar="N",
        help="wide expert parallelism (MoE): N data-parallel groups of --tp GPUs share the experts "
        "(default: 1; docs/engine.md)",
    )
    p.add_argument(
        "--system",
        default=None,
        metavar="NAME",
        help="rack-scale system preset (GB300-NVL72, GB300-NVL72x4): its GPU, GPU count and links",
    )
    p.add_argument(
        "--disagg",
        default=None,
        metavar="P:D[@GBPS]",
        help="disaggregated serving: P prefill and D decode instances (each --tp GPUs), the prompt's KV "
        "sent at GBPS GB/s per GPU (default: NVLink, one direction; docs/engine.md)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="N independent engine instances of the preset behind this one endpoint, each its own "
        "scheduler, KV cache and prefix cache (default: 1; docs/engine.md)",
    )
    p.add_argument(
        "--router",
        choices=ROUTERS,
        default="round-robin",
        help="how a request's replica is picked: round-robin, session (a consistent hash of the "
        f"{SESSION_HEADER} header or the body's user), kv (cached prefix against load, Dynamo's cost) "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--router-overlap-weight",
        type=float,
        default=1.0,
        metavar="W",
        help="kv router: the weight of prompt blocks to prefill against KV blocks in use (default: 1)",
    )
    p.add_argument(
        "--spec-draft-layers",
        type=float,
        default=1.0,
        metavar="L",
        help="a draft token's cost in target layers (default: 1, an MTP module)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model id /v1/models lists and requests must name (default: the preset's name)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        metavar="N",
        help="context window: listed in /v1/models, longer requests get vLLM's HTTP 400 (default: none)",
    )
    p.add_argument(
        "--gpu-memory-utilization", type=float, default=None, metavar="F", help="HBM share for weights and KV"
    )
    p.add_argument(
        "--kv-blocks", type=int, default=None, metavar="N", help="override the computed KV-cache block count"
    )
    p.add_argument("--block-size", type=int, default=None, metavar="N", help="tokens per KV block")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable automatic prefix caching")
    p.add_argument(
        "--faults",
        default=None,
        metavar="SPEC",
        help="inject faults: comma-separated kind=VALUE[@param]; VALUE 0.05 or 5%% (seeded probability) "
        "or #N (the next N requests); e.g. http_503=2%%,stall_mid_stream=#1@3",
    )
    p.add_argument(
        "--reasoning",
        choices=("auto", "on", "off"),
        default="auto",
        help="stream part of the output as reasoning (auto: reasoning models and requests with reasoning_effort)",
    )
    p.add_argument(
        "--reference-answers",
        metavar="FILE",
        help="answer whole (non-streamed) requests whose prompt the JSONL file lists "
        '({"prompt": ..., "answer": ...} per line) with that answer: accuracy runs end to end (docs/accuracy.md)',
    )
    p.add_argument(
        "--recorded-answers",
        metavar="FILE",
        help="answer a chat whose messages match a recorded call's "
        '({"messages": [...], "answer": {assistant message}} per line) with the recorded message, its tool '
        "calls streamed as tool-call deltas: the agentic accuracy check end to end (docs/traces.md)",
    )
    p.add_argument(
        "--reasoning-fraction",
        type=float,
        default=0.6,
        metavar="F",
        help="share of output tokens that reason (default: %(default)s)",
    )
    p.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        metavar="PID",
        help="exit when this process is gone (so an engine never outlives a killed load generator)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="require the key held by this environment variable on /v1/* (401 otherwise), like vllm --api-key",
    )
    p.add_argument(
        "--api-key-header",
        default="Authorization",
        metavar="NAME",
        help="where the key is expected: Authorization (Bearer KEY, the default) or a header name such as api-key",
    )
    p.add_argument(
        "--coarse-timer",
        action="store_true",
        help="use only the event loop's ~1 ms timers (no helper thread for precise step deadlines)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    extra: dict[str, Any] = {}
    for name in (
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "kv_blocks",
        "block_size",
        "max_model_len",
    ):
        value = getattr(args, name)
        if value is not None:
            if name not in known:
                raise ValueError(f"--{name.replace('_', '-')} is not supported by this engine")
            extra[name] = value
    if args.no_prefix_caching and "enable_prefix_caching" in known:
        extra["enable_prefix_caching"] = False
    if args.disagg:
        extra["disagg"] = parse_disagg(args.disagg)
    gpu = args.gpu or "H100"
    if args.system:
        system = get_system(args.system)
        extra["system"] = system
        if args.gpu and get_gpu(args.gpu).name != system.gpu:
            raise ValueError(f"--gpu {args.gpu} is not {system.name}'s GPU ({system.gpu}); leave --gpu out")
        gpu = system.gpu
    if args.spec_decode:
        spec = parse_spec_decode(args.spec_decode)
        extra["spec"] = dataclasses.replace(spec, draft_layers=args.spec_draft_layers)
    if args.replicas < 1:
        raise ValueError("--replicas must be >= 1")
    return EngineConfig(
        replicas=args.replicas,
        router=args.router,
        router_overlap_weight=args.router_overlap_weight,
        gpu=get_gpu(gpu),
        model=get_model(args.model),
        tp=args.tp,
        ep=args.ep,
        speedup=args.speedup,
        seed=args.seed,
        served_model_name=args.served_model_name,
        precise_timer=not args.coarse_timer,
        **extra,
    )


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Set ``stop`` once the parent process has gone (we were re-parented)."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            stop.set()
            return
        await asyncio.sleep(1.0)


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    parse_spec(args.faults)  # fail fast on a malformed spec
    if not 0.0 <= args.reasoning_fraction <= 1.0:
        raise ValueError("--reasoning-fraction must be within [0, 1]")
    reasoning = {"auto": None, "on": True, "off": False}[args.reasoning]
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, "").strip()
        if not api_key:
            raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    references = load_references(args.reference_answers) if args.reference_answers else None
    recorded = load_recorded(args.recorded_answers) if args.recorded_answers else None
    return ServerOptions(
        references=references,
        recorded=recorded,
        faults=args.faults,
        reasoning=reasoning,
        reasoning_fraction=args.reasoning_fraction,
        api_key=api_key,
        api_key_header=args.api_key_header,
    )


async def serve(
    config: EngineConfig,
    host: str,
    port: int,
    truth_log: str | None,
    parent_pid: int | None = None,
    options: ServerOptions | None = None,
    grpc_port: int | None = None,
) -> None:
    app = create_app(config, truth_log=truth_log, options=options)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=5.0)
    await runner.setup()
    grpc_server = None
    if grpc_port is not None:
        from loadtest.sim.grpc_kserve import start_grpc

        grpc_server = await start_grpc(app[STATE_KEY], host, grpc_port)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    site = web.SockSite(runner, sock)
    await site.start()
    raise_open_file_limit()
    tune_gc()  # start-up objects (presets, tokenizer, app) are never scanned again
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    sys.stdout.write(f"{LISTENING_PREFIX} {shown}:{bound[1]}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(_watch_parent(parent_pid, stop)) if parent_pid else None
    try:
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        if grpc_server is not None:
            await grpc_server.stop(1.0)
        await runner.cleanup()


def main(argv: Sequence[str] | None = None, prog: str = "python -m loadtest.sim") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.list_presets:
        from loadtest.sim.presets import list_gpus, list_models, list_systems

        print("GPUs:")
        for g in list_gpus():
            print("  " + g.summary())
        print("Models:")
        for m in list_models():
            print("  " + m.summary())
        print("Systems:")
        for sy in list_systems():
            print("  " + sy.summary())
        return 0
    try:
        config = config_from_args(args)
        options = options_from_args(args)
    except (ValueError, FaultSpecError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is not None:
        uvloop.run(
            serve(config, args.host, args.port, args.truth_log, args.parent_pid, options, args.grpc_port)
        )
    else:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(
                serve(config, args.host, args.port, args.truth_log, args.parent_pid, options, args.grpc_port)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
