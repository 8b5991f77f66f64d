"""Engine launchers: each turns a preset layout and options into a launch plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from loadtest.serve.engines import dynamo, sglang, trtllm, vllm
from loadtest.serve.plan import LaunchOptions, LaunchPlan
from loadtest.serve.presets import MODES, Layout, Preset, PresetError, get_preset

Builder = Callable[[Preset, Layout, LaunchOptions], LaunchPlan]
ENGINES: dict[str, Builder] = {
    "vllm": vllm.build,
    "sglang": sglang.build,
    "trtllm": trtllm.build,
    "dynamo": dynamo.build,
}


def build_plan(engine: str, preset_name: str, opts: LaunchOptions) -> LaunchPlan:
    """The plan for ``engine`` serving ``preset_name``; PresetError / ValueError name what is wrong."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    if opts.mode not in MODES:
        raise ValueError(f"--mode {opts.mode!r}: one of {', '.join(MODES)}")
    if not 0 < opts.port < 65536:
        raise ValueError(f"--port {opts.port}: a TCP port")
    preset = get_preset(preset_name)
    if opts.model:
        preset = dataclasses.replace(preset, model=opts.model)
    if preset.device == "cpu" and engine != "vllm":
        raise ValueError(f"preset {preset.name} is a CPU preset: only vllm (its CPU build) serves it")
    layout = preset.layout(opts.mode, opts.gpus)
    return ENGINES[engine](preset, layout, opts)


__all__ = ["ENGINES", "build_plan", "PresetError"]
