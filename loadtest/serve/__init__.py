"""Launchers for real serving engines (vLLM, SGLang, TensorRT-LLM, Dynamo) with MLPerf model presets."""

from loadtest.serve.engines import ENGINES, build_plan
from loadtest.serve.plan import LaunchOptions, LaunchPlan, ProcSpec
from loadtest.serve.presets import PresetError, all_presets, get_preset

__all__ = [
    "ENGINES",
    "LaunchOptions",
    "LaunchPlan",
    "PresetError",
    "ProcSpec",
    "all_presets",
    "build_plan",
    "get_preset",
]
