"""vLLM-V1-style per-step scheduling: running first, then waiting FCFS, with chunked prefill."""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass

from loadtest.sim.kv import KvManager, UnlimitedKv
from loadtest.sim.request import RequestState, SimRequest


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One request's share of a step: ``n_new`` tokens computed over ``n_cached`` already cached."""

    req: SimRequest
    n_new: int
    n_cached: int


class Scheduler:
    """Holds the waiting deque and running list and builds each step's batch."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, kv: KvManager | None = None) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv: KvManager = kv if kv is not None else UnlimitedKv()
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []

    def add(self, req: SimRequest) -> None:
        req.state = RequestState.WAITING
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        """Drop a request wherever it is; it never appears in a later batch."""
        if req.done:
            return
        was_waiting = req.state is RequestState.WAITING
        req.state = RequestState.ABORTED
        if was_waiting:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        else:
            self.running = [r for r in self.running if r is not req]
        self.kv.free(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def schedule(self) -> list[Scheduled]:
        """The batch for the next step. Running requests first, then admissions while budget allows."""
        budget = self.max_num_batched_tokens
        batch: list[Scheduled] = []
        for req in self.running:
            if budget <= 0:
                break
            n = min(req.num_tokens - req.num_computed, budget)
            if n <= 0:
                continue
            # Seam for preemption: when the KV manager refuses, a later version evicts the most
            # recently admitted request (LIFO) and requeues it at the front of `waiting`.
            if not self.kv.allocate(req, n):
                continue
            batch.append(Scheduled(req, n, req.num_computed))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.num_computed == 0:
                req.num_computed = self.kv.cached_prefix_tokens(req)
            n = min(req.num_tokens - req.num_computed, budget)
            if not self.kv.allocate(req, n):
                break
            self.waiting.popleft()
            req.state = RequestState.RUNNING
            self.running.append(req)
            batch.append(Scheduled(req, n, req.num_computed))
            budget -= n
        return batch

    def complete_step(self, batch: list[Scheduled]) -> list[SimRequest]:
        """Apply a step's progress; return the requests that produced a token (in batch order).

        A request whose prefill completes samples its first token; a decoding one samples one token.
        Requests that reach their target length are finished and leave the running list.
        """
        emitted: list[SimRequest] = []
        finished = False
        for item in batch:
            req = item.req
            if req.done:
                continue
            req.num_computed += item.n_new
            if req.num_computed >= req.num_tokens:
                req.num_output += 1
                emitted.append(req)
                if req.num_output >= req.target_tokens:
                    req.state = RequestState.FINISHED
                    self.kv.free(req)
                    finished = True
        if finished:
            self.running = [r for r in self.running if not r.done]
        return emitted
