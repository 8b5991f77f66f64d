"""Replicas behind one endpoint: N independent engine instances and the router that picks one a request."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence

from loadtest.sim.engine import Engine, EngineCounters, merge_lateness, sum_counters
from loadtest.sim.kv import KvManager
from loadtest.sim.presets import EngineConfig
from loadtest.sim.request import SimRequest
from loadtest.sim.router import ReplicaState, make_policy


def replica_state(engine: Engine, probe: SimRequest | None) -> ReplicaState:
    """One replica as a policy sees it; ``probe`` (a request not yet submitted) looks up its cached prefix.
    Its prompt work not yet computed counts a waiting request's prompt less what the router found cached
    for it (``SimRequest.routed_cached_tokens``), as Dynamo credits the overlap of active prefills."""
    sched = engine.scheduler
    kv = sched.kv
    bs = kv.block_size if isinstance(kv, KvManager) else 1
    backlog = sum(
        max(r.prompt_tokens - max(r.num_computed, r.routed_cached_tokens), 0)
        for r in (*sched.waiting, *sched.running)
    )
    active = kv.num_blocks - kv.num_free_blocks if isinstance(kv, KvManager) else 0
    cached = kv.cached_prefix_tokens(probe) // bs if probe is not None else 0
    return ReplicaState(cached, -(-backlog // bs), active, len(sched.waiting) + len(sched.running))


class ReplicaEngine:
    """The engine interface over ``config.replicas`` instances of one preset (each its own scheduler, KV
    cache and prefix cache, seeded apart) and a routing policy (sim/router.py). Counters add up over the
    instances; ``routed`` and ``matched_blocks`` count the router's decisions per replica."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        n = config.replicas
        self.replicas = [Engine(dataclasses.replace(config, seed=config.seed + i)) for i in range(n)]
        self.policy = make_policy(config.router, n, config.router_overlap_weight)
        self._owner: weakref.WeakKeyDictionary[SimRequest, Engine] = weakref.WeakKeyDictionary()
        self.routed = [0] * n
        self.matched_blocks = [0] * n

    async def start(self) -> None:
        for e in self.replicas:
            await e.start()

    async def stop(self) -> None:
        for e in self.replicas:
            await e.stop()

    def target_length(self, max_tokens: int | None, min_tokens: int = 0, ignore_eos: bool = False) -> int:
        return self.replicas[0].target_length(max_tokens, min_tokens, ignore_eos)

    def submit(
        self,
        prompt: Sequence[int] | int,
        target_tokens: int,
        request_id: str | None = None,
        session: str | None = None,
    ) -> SimRequest:
        """Route the request (``session``: its conversation's key, for session affinity) and queue it."""
        probe = None
        states: list[ReplicaState] = []
        if self.policy.needs_state:  # only a policy that reads them: each is a pass over a replica's queue
            if not isinstance(prompt, int) and prompt:
                ids = tuple(prompt)
                probe = SimRequest(
                    request_id or "probe", len(ids), max(1, target_tokens), 0.0, prompt_ids=ids
                )
            states = [replica_state(e, probe) for e in self.replicas]
        bs = self.config.block_size
        n_prompt = prompt if isinstance(prompt, int) else len(prompt)
        i = self.policy.pick(states, -(-n_prompt // bs), session)
        engine = self.replicas[i]
        req = engine.submit(prompt, target_tokens, request_id)
        if probe is not None:
            req.block_hashes = probe.block_hashes  # the prompt's block hashes, computed once
        cached = states[i].cached_blocks if states else 0
        req.replica = i
        req.routed_cached_tokens = cached * bs
        self._owner[req] = engine
        self.routed[i] += 1
        self.matched_blocks[i] += cached
        return req

    def abort(self, req: SimRequest) -> None:
        owner = self._owner.get(req)
        if owner is not None:
            owner.abort(req)

    # ---- what the server and /metrics read -------------------------------------------------------
    @property
    def num_running(self) -> int:
        return sum(e.num_running for e in self.replicas)

    @property
    def num_waiting(self) -> int:
        return sum(e.num_waiting for e in self.replicas)

    @property
    def kv_usage(self) -> float:
        """The replicas' mean KV usage."""
        return sum(e.kv_usage for e in self.replicas) / len(self.replicas)

    @property
    def counters(self) -> EngineCounters:
        return sum_counters(self.replicas)

    def take_step_lateness(self) -> dict[str, float | int]:
        return merge_lateness([e.take_step_lateness() for e in self.replicas])

    def describe(self) -> list[dict[str, object]]:
        """Per replica (GET /sim/stats): its requests, routed and matched blocks, queue, batch, KV usage."""
        out: list[dict[str, object]] = []
        for i, e in enumerate(self.replicas):
            c = e.counters
            out.append(
                {
                    "replica": i,
                    "routed": self.routed[i],
                    "matched_blocks": self.matched_blocks[i],
                    "num_requests_running": e.num_running,
                    "num_requests_waiting": e.num_waiting,
                    "kv_cache_usage_perc": e.kv_usage,
                    "prefix_cache_queries": c.prefix_queries,
                    "prefix_cache_hits": c.prefix_hits,
                }
            )
        return out
