"""Starting the embedded engine for a command without --host (run, ui, sweep) from the profile's preset and
the --engine-* options, and the endpoint description it reports."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.profile.schema import Profile


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
    recorded_answers: str | None = None  # a messages → recorded answer JSONL file: the recorded-answer mode
    recorded: bool = False  # --engine-recorded: answer the profile's recorded calls as recorded


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
    from loadtest.sim.presets import get_gpu, get_model

    gpu = opts.gpu or profile.engine.gpu
    model = opts.model or profile.engine.model
    tp = opts.tp or profile.engine.tp
    try:
        get_gpu(gpu)
        get_model(model)
    except ValueError as e:
        raise EngineStartError(
            f"embedded engine preset: {e} (--engine-gpu, --engine-model, or the profile's engine)", usage=True
        ) from e
    max_num_seqs = opts.max_num_seqs
    if max_num_seqs is not None and max_num_seqs < 1:
        raise EngineStartError("--engine-max-num-seqs must be ≥ 1", usage=True)
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
                extra_args=_mode_args(opts) or None,
            )
        )
    except (RuntimeError, ValueError) as e:
        raise EngineStartError(f"embedded engine did not start: {e}", usage=False) from e
    gpus = f"{tp}×{gpu}" if tp > 1 else gpu
    print(
        f"embedded engine: {model} on {gpus} (speed-up {opts.speedup:g}x) at {sim.base_url}",
        flush=True,
    )
    return {"url": sim.base_url, "embedded": True, "engine": sim.stats().get("config")}
