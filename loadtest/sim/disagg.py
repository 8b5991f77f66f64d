"""Disaggregated prefill/decode (xPyD): a prefill pool and a decode pool of engine instances, the
prompt's KV sent between them over a link (docs/engine.md, docs/sources.md §26)."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Sequence

from loadtest.sim.engine import Engine, EngineCounters, merge_lateness, sum_counters
from loadtest.sim.presets import GB, EngineConfig
from loadtest.sim.request import SHUTDOWN, RequestState, SimRequest


def link_bytes_per_s(config: EngineConfig) -> float:
    """The KV link's bytes/s per GPU: the configured GB/s, else the GPU's NVLink in one direction."""
    return config.disagg.link_gbs * GB if config.disagg.link_gbs > 0 else config.link_bw


def kv_transfer_s(config: EngineConfig, prompt_tokens: int) -> float:
    """Engine seconds to send a prompt's KV from a prefill to a decode instance: each of the ``tp``
    ranks sends its share (per-GPU KV bytes of the prompt) over its own link."""
    bw = link_bytes_per_s(config)
    if bw <= 0:
        raise ValueError(
            f"disaggregation needs a KV link bandwidth; {config.gpu.name} has no NVLink: give P:D@GBPS"
        )
    return prompt_tokens * config.kv_bytes_per_token_per_gpu / bw


def _least_loaded(engines: Sequence[Engine]) -> Engine:
    return min(engines, key=lambda e: len(e.scheduler.waiting) + len(e.scheduler.running))


class DisaggEngine:
    """The engine interface over two pools: a request is prefilled on the least-loaded prefill
    instance (its first token not yet sampled), its prompt's KV sent (``kv_transfer_s``), then admitted
    on the least-loaded decode instance, whose first step samples the first token; decode instances
    batch only decodes. Counters add up over the instances."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        kv_transfer_s(config, 1)  # fail at start without a link
        self.prefill = [Engine(config, on_prefilled=self._prefilled) for _ in range(config.disagg.prefill)]
        self.decode = [Engine(config) for _ in range(config.disagg.decode)]
        self._owner: weakref.WeakKeyDictionary[SimRequest, Engine] = weakref.WeakKeyDictionary()
        self._in_flight: set[SimRequest] = set()
        self.kv_transfers = 0
        self.kv_transfer_bytes = 0

    @property
    def instances(self) -> list[Engine]:
        return [*self.prefill, *self.decode]

    async def start(self) -> None:
        for e in self.instances:
            await e.start()

    async def stop(self) -> None:
        for e in self.instances:
            await e.stop()
        for req in list(self._in_flight):
            req.state = RequestState.ABORTED
            req.deliver(SHUTDOWN)
        self._in_flight.clear()

    def target_length(self, max_tokens: int | None, min_tokens: int = 0, ignore_eos: bool = False) -> int:
        return self.prefill[0].target_length(max_tokens, min_tokens, ignore_eos)

    def submit(
        self,
        prompt: Sequence[int] | int,
        target_tokens: int,
        request_id: str | None = None,
        session: str | None = None,
    ) -> SimRequest:
        engine = _least_loaded(self.prefill)
        req = engine.submit(prompt, target_tokens, request_id)
        self._owner[req] = engine
        return req

    def abort(self, req: SimRequest) -> None:
        owner = self._owner.get(req)
        if req in self._in_flight:
            self._in_flight.discard(req)
            req.state = RequestState.ABORTED
        elif owner is not None:
            owner.abort(req)

    def _prefilled(self, req: SimRequest) -> None:
        """A prefill instance finished ``req``'s prompt: send its KV, then admit it to decode."""
        req.prefill_done_ns = time.perf_counter_ns()
        self._in_flight.add(req)
        self.kv_transfers += 1
        self.kv_transfer_bytes += req.prompt_tokens * self.config.kv_bytes_per_token_per_gpu * self.config.tp
        delay = kv_transfer_s(self.config, req.prompt_tokens) / self.config.speedup
        asyncio.get_running_loop().call_later(delay, self._arrive, req)

    def _arrive(self, req: SimRequest) -> None:
        if req not in self._in_flight:  # aborted or shut down on the way
            return
        self._in_flight.discard(req)
        req.kv_arrived_ns = time.perf_counter_ns()
        engine = _least_loaded(self.decode)
        self._owner[req] = engine
        engine.admit_transferred(req)

    # ---- what the server and /metrics read -------------------------------------------------------
    @property
    def num_running(self) -> int:
        return sum(e.num_running for e in self.instances)

    @property
    def num_waiting(self) -> int:
        return sum(e.num_waiting for e in self.instances) + len(self._in_flight)

    def pool_waiting(self, pool: str) -> int:
        return sum(e.num_waiting for e in (self.prefill if pool == "prefill" else self.decode))

    def pool_running(self, pool: str) -> int:
        return sum(e.num_running for e in (self.prefill if pool == "prefill" else self.decode))

    @property
    def kv_transfers_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def kv_usage(self) -> float:
        """The decode pool's KV usage (where a request's KV lives while it generates)."""
        return sum(e.kv_usage for e in self.decode) / len(self.decode)

    @property
    def counters(self) -> EngineCounters:
        return sum_counters(self.instances)

    def take_step_lateness(self) -> dict[str, float | int]:
        return merge_lateness([e.take_step_lateness() for e in self.instances])
