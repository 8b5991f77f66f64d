"""/metrics for the torch server: the embedded engine's vLLM-named set plus vLLM's older cache gauge."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from loadtest.sim.prom import CONTENT_TYPE, SimMetrics

__all__ = ["CONTENT_TYPE", "RequestTimes", "TorchRefMetrics"]


@dataclass
class RequestTimes:
    """What the server saw of one request (perf_counter_ns), in the shape SimMetrics.finished reads."""

    arrival_ns: int
    prompt_tokens: int
    completion_tokens: int = 0
    first_token_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    done_ns: int | None = None
    finish_reason: str | None = None


class TorchRefMetrics(SimMetrics):
    """The same names as the embedded engine (``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``,
    ``vllm:prompt_tokens_total``, ``vllm:time_to_first_token_seconds``...) plus
    ``vllm:gpu_cache_usage_perc`` (the name before vLLM V1) and ``vllm:iteration_steps_total``."""

    prompt_per_step = False  # its counters.prompt_tokens counts computed prefill tokens, not prompts

    def collect(self) -> Iterator[Any]:
        yield from super().collect()
        e = self.engine
        yield self._gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (1 = full).", e.kv_usage)
        yield self._counter("vllm:iteration_steps", "Engine steps run.", e.counters.steps)
