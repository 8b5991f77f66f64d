"""Starting the embedded engine for a command without --host (run, ui, sweep) from the profile's preset and
the --engine-* options, and the endpoint description it reports."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.profile.schema import Profile

GRPC_API = "kserve_v2_grpc"  # a profile with this api gets the engine's gRPC service as its host


class EngineStartError(Exception):
    """One line for the user; ``usage`` tells a bad preset (exit 2) from an engine that failed (exit 1)."""

    def __init__(self, message: str, usage: bool) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass(frozen=True, slots=True)
class EngineOverrides:
    """What the command line sets over the profile's engine preset (the --engine-* options); None = keep."""

    gpu: str | None = None
    model: str | None = None
    tp: int | None = None
    faults: str | None = None
    speedup: float = 1.0
    max_num_seqs: int | None = None
    reference_answers: str | None = None  # a prompt → answer JSONL file: the reference-answer mode
    spec_decode: str | None = None  # speculative decoding "K:A" (sim/spec_decode.py)
    disagg: str | None = None  # disaggregated serving "P:D[@GBPS]" (sim/disagg.py)
    ep: int | None = None  # wide expert parallelism: data-parallel groups of tp GPUs sharing the experts
    system: str | None = None  # rack-scale system preset (its GPU unless --engine-gpu names one)
    recorded_answers: str | None = None  # a messages → recorded answer JSONL file: the recorded-answer mode
    recorded: bool = False  # --engine-recorded: answer the profile's recorded calls as recorded
    replicas: int | None = None  # replicas behind the one endpoint (sim/replicas.py)
    router: str | None = None  # the router's policy over them: round-robin, session, kv (sim/router.py)


def _mode_args(opts: EngineOverrides) -> list[str]:
    """The engine's answer-mode options: reference answers, recorded answers."""
    args = ["--reference-answers", opts.reference_answers] if opts.reference_answers else []
    return args + (["--recorded-answers", opts.recorded_answers] if opts.recorded_answers else [])


def start_engine(
    stack: contextlib.ExitStack, opts: EngineOverrides, profile: Profile, seed: int, log: Path | None
) -> dict[str, Any]:
    """Start the engine with the profile's preset and ``opts`` over it (stopped when ``stack`` closes);
    returns the endpoint description: url, embedded, engine (its configuration)."""
    from loadtest.sim import SimProcess
    from loadtest.sim.presets import EngineConfig, get_gpu, get_model, get_system

    system = opts.system or profile.engine.system
    gpu = opts.gpu or profile.engine.gpu
    model = opts.model or profile.engine.model
    tp = opts.tp or profile.engine.tp
    ep = opts.ep or profile.engine.ep
    try:
        if system:
            gpu = opts.gpu or get_system(system).gpu
        get_gpu(gpu)
        get_model(model)
    except ValueError as e:
        raise EngineStartError(
            f"embedded engine preset: {e} (--engine-gpu, --engine-model, --engine-system, or the profile's engine)",
            usage=True,
        ) from e
    max_num_seqs = opts.max_num_seqs
    if max_num_seqs is not None and max_num_seqs < 1:
        raise EngineStartError("--engine-max-num-seqs must be ≥ 1", usage=True)
    from loadtest.sim.disagg_spec import Disagg, parse_disagg
    from loadtest.sim.spec_decode import parse_spec_decode

    extra = _mode_args(opts)
    for flag, given, field, parse in (
        ("spec-decode", opts.spec_decode, profile.engine.spec_decode, parse_spec_decode),
        ("disagg", opts.disagg, profile.engine.disagg, parse_disagg),
    ):
        value = given or field
        if not value:
            continue
        try:
            parse(value)
        except ValueError as e:
            where = f"--engine-{flag}" if given else f"the profile's engine.{flag.replace('-', '_')}"
            raise EngineStartError(f"{where}: {e}", usage=True) from e
        extra += [f"--{flag}", value]
    if system:
        extra += ["--system", system]
    if ep and ep > 1:
        extra += ["--ep", str(ep)]
    replicas = opts.replicas if opts.replicas is not None else profile.engine.replicas
    router = opts.router or profile.engine.router
    if replicas < 1:
        raise EngineStartError("--engine-replicas must be ≥ 1", usage=True)
    if replicas > 1:
        extra += ["--replicas", str(replicas), "--router", router]
    grpc = GRPC_API in {profile.api, *(s.api for s in profile.scenarios)}
    if grpc:  # KServe v2 over gRPC: the engine serves it too; the run's host is its grpc:// address
        extra += ["--grpc-port", "0"]
    disagg = opts.disagg or profile.engine.disagg
    try:  # the layout's own checks (a MoE model for ep > 1, the system's GPU count), as one line
        EngineConfig(
            gpu=get_gpu(gpu),
            model=get_model(model),
            tp=tp,
            ep=ep or 1,
            system=get_system(system) if system else None,
            disagg=parse_disagg(disagg) if disagg else Disagg(),
            replicas=replicas,
            router=router,
        )
    except ValueError as e:
        raise EngineStartError(
            f"embedded engine layout: {e} (--engine-tp, --engine-ep, --engine-system, --engine-disagg, "
            "--engine-replicas)",
            usage=True,
        ) from e
    try:
        sim = stack.enter_context(
            SimProcess(
                gpu=gpu,
                model=model,
                tp=tp,
                faults=opts.faults or profile.engine.faults,
                speedup=opts.speedup,
                seed=seed,
                max_num_seqs=max_num_seqs,
                stderr_path=log,
                extra_args=extra or None,
            )
        )
    except (RuntimeError, ValueError) as e:
        raise EngineStartError(f"embedded engine did not start: {e}", usage=False) from e
    n_gpus = tp * (ep or 1)
    gpus = f"{n_gpus}×{gpu}" if n_gpus > 1 else gpu
    if system:
        gpus += f" of {system}"
    url = sim.grpc_url if grpc else sim.base_url
    if replicas > 1:
        gpus = f"{replicas} replicas of {gpus} ({router} router)"
    print(f"embedded engine: {model} on {gpus} (speed-up {opts.speedup:g}x) at {url}", flush=True)
    return {"url": url, "embedded": True, "engine": sim.stats().get("config")}
