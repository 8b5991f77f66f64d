"""The embedded simulated serving engine: an OpenAI-compatible aiohttp server with vLLM-like timing.

A continuous-batching scheduler (chunked prefill) steps on a roofline clock (``clock``) built from
GPU and model presets (``presets``); the server records ground-truth emit times for every token.
"""

from loadtest.sim.presets import EngineConfig, GpuSpec, ModelSpec, get_gpu, get_model
from loadtest.sim.process import SimProcess

__all__ = ["EngineConfig", "GpuSpec", "ModelSpec", "SimProcess", "get_gpu", "get_model"]
