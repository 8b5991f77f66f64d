"""vLLM-V1-style per-step scheduling: running first, then waiting FCFS, chunked prefill, LIFO preemption."""

from __future__ import annotations

import contextlib
import random
from collections import deque
from dataclasses import dataclass

from loadtest.sim.kv import KvBackend, UnlimitedKv
from loadtest.sim.request import ERROR, RequestState, SimRequest
from loadtest.sim.spec_decode import SpecDecode


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One request's share of a step: ``n_new`` tokens computed over ``n_cached`` already cached; a
    speculative decode item verifies ``n_draft`` draft tokens among them (``n_new = 1 + n_draft``)."""

    req: SimRequest
    n_new: int
    n_cached: int
    n_draft: int = 0


@dataclass
class SchedulerStats:
    """Totals like vLLM's counters: preemptions, prefix-cache queries/hits (tokens), refusals, and the
    speculative-decoding drafts, draft tokens and accepted tokens (vllm:spec_decode_num_*)."""

    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    rejected: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


class Scheduler:
    """Holds the waiting deque and running list (in admission order) and builds each step's batch."""

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv: KvBackend | None = None,
        spec: SpecDecode | None = None,
        seed: int = 0,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv: KvBackend = kv if kv is not None else UnlimitedKv()
        self.spec = spec if spec is not None else SpecDecode()
        self._accept_rng = random.Random(f"spec-{seed}")
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = SchedulerStats()

    def add(self, req: SimRequest) -> bool:
        """Queue ``req``; one that can never fit the KV cache is refused at once (see ``fail``)."""
        problem = self._never_fits(req)
        if problem is not None:
            self.fail(req, problem)
            return False
        req.state = RequestState.WAITING
        self.waiting.append(req)
        return True

    def fail(self, req: SimRequest, reason: str) -> None:
        """Abort ``req`` with ``reason`` in ``req.error`` and ``ERROR`` on its queue."""
        self.abort(req)
        req.state = RequestState.ABORTED
        req.error = reason
        self.stats.rejected += 1
        req.deliver(ERROR)

    def _never_fits(self, req: SimRequest) -> str | None:
        cap = self.kv.capacity_tokens
        if cap is None:
            return None
        if req.prompt_tokens > cap:
            return f"prompt of {req.prompt_tokens} tokens exceeds the KV cache ({cap} tokens)"
        # The last output token is sampled, never stored: prompt + target − 1 tokens of KV at most.
        if req.prompt_tokens + req.target_tokens - 1 > cap:
            return (
                f"prompt of {req.prompt_tokens} tokens plus {req.target_tokens} output tokens "
                f"exceeds the KV cache ({cap} tokens)"
            )
        return None

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

    def release(self, req: SimRequest) -> None:
        """Take a running request out of this scheduler (its KV leaves with it: disaggregated prefill)."""
        self.running = [r for r in self.running if r is not req]
        self.kv.free(req)

    def admit_transferred(self, req: SimRequest) -> None:
        """Queue a request whose prompt's KV arrived from elsewhere: all but its last prompt token are
        computed, so its first step here computes that token and samples the first output token."""
        req.kv_transferred = True
        req.block_hashes = []  # this cache hashes the blocks afresh
        req.num_computed = max(0, req.prompt_tokens - 1)
        req.state = RequestState.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _preempt_last(self) -> SimRequest:
        """Preempt the most recently admitted running request: free its KV, requeue it at the front."""
        victim = self.running.pop()
        self.kv.free(victim)
        victim.num_computed = 0
        victim.state = RequestState.WAITING
        victim.num_preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def schedule(self) -> list[Scheduled]:
        """The batch for the next step. Running requests first, then admissions while budget allows.

        A running request that cannot get its blocks preempts the newest running request (LIFO,
        possibly itself); a step that preempted admits nothing new (unless it is otherwise empty).
        """
        budget = self.max_num_batched_tokens
        batch: list[Scheduled] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            if n <= 0:
                i += 1
                continue
            draft = self._drafts(req, n, budget)
            n += draft
            while not self.kv.allocate(req, n):
                preempted = True
                if self._preempt_last() is req:
                    break
            else:
                batch.append(Scheduled(req, n, req.num_computed, draft))
                budget -= n
                i += 1
        if preempted and batch:
            return batch
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            hit = self.kv.cached_prefix_tokens(req) if req.num_computed == 0 else 0
            req.num_computed += hit
            n = min(req.num_tokens - req.num_computed, budget)
            if not self.kv.allocate(req, n):
                req.num_computed -= hit
                break
            if req.num_preemptions == 0 and not req.kv_transferred:
                req.num_cached_tokens = hit
                if self.kv.prefix_caching:
                    self.stats.prefix_queries += req.num_tokens
                    self.stats.prefix_hits += hit
            self.waiting.popleft()
            req.state = RequestState.RUNNING
            self.running.append(req)
            batch.append(Scheduled(req, n, req.num_computed))
            budget -= n
        return batch

    def _drafts(self, req: SimRequest, n: int, budget: int) -> int:
        """Draft tokens to verify for a running request: k for a plain decode (one token to compute),
        fewer near its target length or the step's token budget; 0 with speculative decoding off."""
        if not self.spec.enabled or n != 1 or req.prefilling:
            return 0
        return max(0, min(self.spec.k, req.target_tokens - req.num_output - 1, budget - 1))

    def complete_step(self, batch: list[Scheduled]) -> list[SimRequest]:
        """Apply a step's progress; return the requests that produced tokens (in batch order), each
        with ``last_emitted`` set to how many.

        A request whose prefill completes samples its next token; a decoding one samples one token,
        plus the leading accepted drafts of a speculative item (their KV is computed; the rest's is
        discarded). Requests that reach their target length are finished and leave the running list.
        """
        emitted: list[SimRequest] = []
        finished = False
        stats = self.stats
        for item in batch:
            req = item.req
            if req.done:
                continue
            accepted = 0
            if item.n_draft:
                accepted = self.spec.draw_accepted(self._accept_rng, item.n_draft)
                stats.spec_drafts += 1
                stats.spec_draft_tokens += item.n_draft
                stats.spec_accepted_tokens += accepted
                req.num_draft_tokens += item.n_draft
                req.num_accepted_tokens += accepted
            req.num_computed += item.n_new - item.n_draft + accepted
            if req.num_computed >= req.num_tokens:
                req.num_output += 1 + accepted
                req.last_emitted = 1 + accepted
                emitted.append(req)
                if req.num_output >= req.target_tokens:
                    req.state = RequestState.FINISHED
                    self.kv.free(req)
                    finished = True
        if finished:
            self.running = [r for r in self.running if not r.done]
        return emitted
