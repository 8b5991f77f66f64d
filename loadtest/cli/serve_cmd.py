"""``loadtest serve vllm|sglang|trtllm|dynamo --preset NAME`` and ``loadtest serve presets``."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from loadtest.serve import ENGINES, LaunchOptions, LaunchPlan, PresetError, all_presets, build_plan
from loadtest.serve.state import register, scrub_argv, scrub_env, unregister, write_json
from loadtest.serve.supervisor import LaunchError, Supervisor
from loadtest.serve.version import probe_version

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser(engine: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=f"loadtest serve {engine}",
        description=f"Start {engine} with an MLPerf model preset, wait until it is healthy, record what was "
        "started (server.json) and stop it cleanly on Ctrl-C (docs/serving.md).",
    )
    ap.add_argument(
        "--preset",
        required=True,
        metavar="NAME|FILE",
        help="serving preset name or YAML path (`loadtest serve presets`)",
    )
    ap.add_argument(
        "--gpus", type=int, metavar="N", help="GPU count (default: the preset's smallest for the mode)"
    )
    ap.add_argument(
        "--model",
        metavar="PATH|ID",
        help="serve this model instead of the preset's: a local folder or a hub id",
    )
    ap.add_argument(
        "--cpu-cores", metavar="CORES", help="CPU presets: cores for the engine's threads, e.g. 1 or 0-3"
    )
    ap.add_argument(
        "--mode", choices=["aggregated", "disagg"], default="aggregated", help="default: %(default)s"
    )
    ap.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the endpoint binds (default: %(default)s)",
    )
    ap.add_argument(
        "--port",
        type=int,
        default=8000,
        metavar="PORT",
        help="endpoint port; workers use the next ones (default: 8000)",
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="print the command lines, env and files; start nothing"
    )
    ap.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    ap.add_argument(
        "--extra-args", default="", metavar="ARGS", help='more engine flags, e.g. "--enforce-eager"'
    )
    ap.add_argument(
        "--router-args", default="", metavar="ARGS", help="more router / frontend flags (disagg, dynamo)"
    )
    ap.add_argument(
        "--executable", metavar="PATH", help="run PATH in place of each program (vllm, python3, ...)"
    )
    ap.add_argument(
        "--python",
        default="python3",
        metavar="PATH",
        help="interpreter for `python -m` engines (default: python3)",
    )
    ap.add_argument(
        "--gpu-ids",
        metavar="IDS",
        help="GPU ids to use, e.g. 4,5,6,7 (default: CUDA_VISIBLE_DEVICES or 0..N-1)",
    )
    if engine == "dynamo":
        ap.add_argument(
            "--dynamo-backend",
            choices=["vllm", "sglang", "trtllm"],
            default="vllm",
            help="the engine behind Dynamo's workers (default: %(default)s)",
        )
    ap.add_argument(
        "--log-dir", metavar="DIR", help="logs, config files, server.json (default: reports/serve-<time>-...)"
    )
    ap.add_argument("--info-out", metavar="FILE", help="also write server.json here")
    ap.add_argument(
        "--health-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="give up when the server is not healthy within S seconds (default: %(default)g)",
    )
    return ap


def _gpu_ids(text: str | None) -> list[str] | None:
    raw = text if text is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None or not raw.strip():
        return None
    return [g.strip() for g in raw.split(",") if g.strip()]


def _options(args: argparse.Namespace, workdir: Path) -> LaunchOptions:
    try:
        extra, router = shlex.split(args.extra_args), shlex.split(args.router_args)
    except ValueError as e:
        raise ValueError(f"--extra-args / --router-args: {e}") from e
    return LaunchOptions(
        gpus=args.gpus,
        mode=args.mode,
        host=args.host,
        port=args.port,
        extra_args=extra,
        router_args=router,
        executable=args.executable,
        python=args.python,
        gpu_ids=_gpu_ids(args.gpu_ids),
        dynamo_backend=getattr(args, "dynamo_backend", "vllm"),
        workdir=workdir.resolve(),
        model=args.model,
        cpu_cores=args.cpu_cores,
    )


def server_doc(plan: LaunchPlan, sup: Supervisor, version: str, workdir: Path) -> dict[str, Any]:
    """server.json: engine, version, exact argv and env additions of every process, preset, URL, pids."""
    now = time.time()
    return {
        "engine": plan.engine,
        "version": version,
        "preset": plan.preset,
        "model": plan.model,
        "mode": plan.mode,
        "gpus": plan.gpus,
        "url": plan.url,
        "metrics_urls": plan.metrics_urls,
        "layout": plan.layout,
        "processes": [
            {
                "name": r.spec.name,
                "role": r.spec.role,
                "argv": scrub_argv(r.spec.argv),
                "env": scrub_env(r.spec.env),
                "pid": r.proc.pid,
                "gpus": r.spec.gpus,
                "health_url": r.spec.health_url,
                "metrics_url": r.spec.metrics_url,
                "log": str(r.log),
            }
            for r in sup.running
        ],
        "files": [str(workdir / name) for name in plan.files],
        "started": dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="seconds"),
        "started_epoch": round(now, 3),
        "launcher_pid": os.getpid(),
        "workdir": str(workdir),
    }


def list_presets() -> int:
    for p in all_presets().values():
        agg = ",".join(str(n) for n in sorted(p.aggregated)) or "-"
        dis = ",".join(str(n) for n in sorted(p.disagg)) or "-"
        print(f"{p.name:20} {p.model:40} GPUs aggregated {agg:8} disagg {dis:8} {p.description}")
    return EXIT_OK


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def serve_command(engine: str, argv: list[str]) -> int:
    if engine == "presets":
        return list_presets()
    args = build_parser(engine).parse_args(argv)
    preset_tag = Path(args.preset).stem if args.preset.endswith((".yaml", ".yml")) else args.preset
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = Path(args.log_dir) if args.log_dir else Path("reports") / f"serve-{stamp}-{engine}-{preset_tag}"
    try:
        plan = build_plan(engine, args.preset, _options(args, workdir))
    except (PresetError, ValueError) as e:
        print(f"loadtest serve: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        print(plan.to_json() if args.json else plan.render(workdir.resolve()))
        return EXIT_OK
    return run_plan(plan, workdir.resolve(), args.health_timeout, args.info_out)


def run_plan(plan: LaunchPlan, workdir: Path, health_timeout: float, info_out: str | None) -> int:
    """Start, wait for health, record server.json, then wait for Ctrl-C / SIGTERM or a process exit."""
    sup = Supervisor(plan, workdir)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    ready, registered = False, False
    print(
        f"starting {plan.engine} {plan.preset} ({plan.mode}, {f'{plan.gpus} GPUs' if plan.gpus else 'CPU'}): "
        f"logs in {workdir}/",
        flush=True,
    )
    try:
        sup.start()
        sup.wait_healthy(health_timeout)
        doc = server_doc(plan, sup, probe_version(plan), workdir)
        write_json(workdir / "server.json", doc)
        if info_out:
            write_json(Path(info_out), doc)
        register(doc)
        registered, ready = True, True
        print(
            f"ready: {plan.url} ({plan.engine} {doc['version']}, {plan.model}); server.json: "
            f"{workdir / 'server.json'}; Ctrl-C stops it",
            flush=True,
        )
        while (dead := sup.first_exited()) is None:
            time.sleep(1.0)
        raise LaunchError(f"{dead.spec.name} exited with code {dead.proc.returncode}; see {dead.log}")
    except KeyboardInterrupt:
        print("stopping...", flush=True)
        return EXIT_OK if ready else EXIT_INTERRUPTED
    except (LaunchError, OSError) as e:
        print(f"loadtest serve: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        held = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sup.stop()
        signal.signal(signal.SIGINT, held)
        if registered:
            unregister(plan.url, os.getpid())
        signal.signal(signal.SIGTERM, previous)
        if sup.running:
            print(f"stopped {', '.join(f'{n} (pid {p})' for n, p in sup.pids().items())}", flush=True)


__all__ = ["ENGINES", "serve_command"]
