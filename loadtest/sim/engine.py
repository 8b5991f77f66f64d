"""The asyncio step loop: schedule, wait the modelled step time, deliver tokens."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields

from loadtest.sim.clock import draft_time_s, step_time_s
from loadtest.sim.kv import KvManager
from loadtest.sim.memory import block_size, kv_capacity_blocks
from loadtest.sim.presets import EngineConfig
from loadtest.sim.request import SHUTDOWN, RequestState, SimRequest
from loadtest.sim.scheduler import Scheduler

_COARSE_MARGIN_S = 0.002


def _sleep_until_blocking(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


@dataclass
class EngineCounters:
    """Engine-side totals (for stats and the /metrics endpoint)."""

    steps: int = 0
    scheduled_tokens: int = 0
    generated_tokens: int = 0  # vllm:generation_tokens, counted per step as vLLM does
    prompt_tokens: int = 0  # vllm:prompt_tokens: a request's prompt, counted at the step of its first token
    busy_engine_s: float = 0.0  # modelled engine seconds, before speedup
    late_steps: int = 0  # steps that started behind their deadline and were re-anchored
    preemptions: int = 0  # vllm:num_preemptions
    prefix_queries: int = 0  # vllm:prefix_cache_queries (prompt tokens looked up at first scheduling)
    prefix_hits: int = 0  # vllm:prefix_cache_hits (of those, tokens found in the cache)
    rejected: int = 0  # requests refused with ERROR (can never fit the KV cache)
    spec_drafts: int = 0  # vllm:spec_decode_num_drafts (speculative decode items verified)
    spec_draft_tokens: int = 0  # vllm:spec_decode_num_draft_tokens
    spec_accepted_tokens: int = 0  # vllm:spec_decode_num_accepted_tokens


def sum_counters(engines: Sequence[Engine]) -> EngineCounters:
    """The totals of several instances: each counter summed."""
    out = EngineCounters()
    for e in engines:
        c = e.counters
        for f in fields(EngineCounters):
            setattr(out, f.name, getattr(out, f.name) + getattr(c, f.name))
    return out


def merge_lateness(parts: Sequence[dict[str, float | int]]) -> dict[str, float | int]:
    """Several instances' ``take_step_lateness`` as one: steps summed, the worst percentiles."""
    steps = sum(int(p["steps"]) for p in parts)
    if not steps:
        return parts[0]
    return {
        "steps": steps,
        "p50_us": max(float(p["p50_us"]) for p in parts),
        "p99_us": max(float(p["p99_us"]) for p in parts),
        "max_us": max(float(p["max_us"]) for p in parts),
        "over_1ms": sum(int(p["over_1ms"]) for p in parts),
    }


def default_scheduler(config: EngineConfig) -> Scheduler:
    """Scheduler with a paged KV cache sized from the GPU and model (``kv_capacity_blocks``)."""
    kv = KvManager(
        kv_capacity_blocks(config),
        block_size(config),
        enable_prefix_caching=bool(getattr(config, "enable_prefix_caching", True)),
    )
    return Scheduler(config.max_num_seqs, config.max_num_batched_tokens, kv, config.spec, config.seed)


class Engine:
    """Continuous-batching engine simulation driven by the roofline step clock."""

    def __init__(
        self,
        config: EngineConfig,
        scheduler: Scheduler | None = None,
        on_prefilled: Callable[[SimRequest], None] | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler or default_scheduler(config)
        # A prefill-only instance (disaggregated serving): a request whose prompt is computed leaves
        # with its KV to this callback instead of sampling its first token here.
        self._on_prefilled = on_prefilled
        self._counters = EngineCounters()
        self._rng = random.Random(config.seed)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_id = 0
        # How late each step ended against its schedule (seconds), since the last summary.
        self._lateness_s: deque[float] = deque(maxlen=200_000)
        self._timer: ThreadPoolExecutor | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        """Stop stepping; every unfinished request is aborted and gets SHUTDOWN on its queue."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._timer is not None:
            self._timer.shutdown(wait=False)
            self._timer = None
        for req in [*self.scheduler.running, *self.scheduler.waiting]:
            self.scheduler.abort(req)
            req.deliver(SHUTDOWN)

    # ---- requests --------------------------------------------------------------------------
    def target_length(self, max_tokens: int | None, min_tokens: int = 0, ignore_eos: bool = False) -> int:
        """Output tokens this request will produce (seeded, drawn in arrival order)."""
        dist = self.config.output_len
        limit = max_tokens if max_tokens is not None else dist.cap
        limit = max(limit, 1)
        if ignore_eos or min_tokens >= limit:
            return limit
        n = round(math.exp(math.log(dist.median) + dist.sigma * self._rng.gauss(0.0, 1.0)))
        return max(1, min_tokens, min(n, limit))

    def submit(
        self,
        prompt: Sequence[int] | int,
        target_tokens: int,
        request_id: str | None = None,
        session: str | None = None,
    ) -> SimRequest:
        """Queue a request; its ``queue`` then receives token indices as steps complete.

        ``prompt`` is the prompt's token ids (keys the prefix cache) or just its length (no
        cross-request prefix hits). A request that can never fit the KV cache comes back already
        ABORTED, with ``error`` set and ``ERROR`` on its queue. ``session`` (its conversation) matters
        only to a router over replicas (sim/replicas.py), which takes the same arguments.
        """
        if request_id is None:
            self._next_id += 1
            request_id = f"sim-{self._next_id}"
        if isinstance(prompt, int):
            ids, n_prompt = None, max(1, prompt)
        else:
            ids = tuple(prompt) or None
            n_prompt = len(ids) if ids else 1
        req = SimRequest(
            request_id=request_id,
            prompt_tokens=n_prompt,
            target_tokens=max(1, target_tokens),
            arrival_s=time.perf_counter(),
            prompt_ids=ids,
        )
        if self.scheduler.add(req):
            self._wake.set()
        return req

    def abort(self, req: SimRequest) -> None:
        self.scheduler.abort(req)

    def admit_transferred(self, req: SimRequest) -> None:
        """Queue a request whose prompt's KV another instance computed (disaggregated decode)."""
        self.scheduler.admit_transferred(req)
        self._wake.set()

    def take_step_lateness(self) -> dict[str, float | int]:
        """Steps since the last call and how far behind schedule they ended (µs: p50, p99, max)."""
        samples = sorted(self._lateness_s)
        self._lateness_s.clear()
        n = len(samples)
        if not n:
            return {"steps": 0, "p50_us": 0.0, "p99_us": 0.0, "max_us": 0.0, "over_1ms": 0}
        return {
            "steps": n,
            "p50_us": round(samples[n // 2] * 1e6, 1),
            "p99_us": round(samples[min(n - 1, int(n * 0.99))] * 1e6, 1),
            "max_us": round(samples[-1] * 1e6, 1),
            "over_1ms": sum(1 for x in samples if x > 0.001),
        }

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use (0..1; cached-but-unreferenced blocks count as free)."""
        return self.scheduler.kv.usage()

    @property
    def counters(self) -> EngineCounters:
        """Engine totals, with the scheduler's preemption and prefix-cache counts folded in."""
        c, s = self._counters, self.scheduler.stats
        c.preemptions, c.prefix_queries, c.prefix_hits, c.rejected = (
            s.preemptions,
            s.prefix_queries,
            s.prefix_hits,
            s.rejected,
        )
        c.spec_drafts, c.spec_draft_tokens, c.spec_accepted_tokens = (
            s.spec_drafts,
            s.spec_draft_tokens,
            s.spec_accepted_tokens,
        )
        return c

    # ---- the loop --------------------------------------------------------------------------
    async def _sleep_until(self, deadline: float) -> None:
        remaining = deadline - time.perf_counter()
        if not self.config.precise_timer:
            if remaining > 0:
                await asyncio.sleep(remaining)
            return
        # Loop timers wake up to ~1.1 ms late; sleep coarsely to ~2 ms before, then precisely in a thread.
        if remaining > _COARSE_MARGIN_S:
            await asyncio.sleep(remaining - _COARSE_MARGIN_S)
        if deadline - time.perf_counter() > 0:
            if self._timer is None:
                self._timer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim-timer")
            await asyncio.get_running_loop().run_in_executor(self._timer, _sleep_until_blocking, deadline)

    async def _run(self) -> None:
        sched = self.scheduler
        cfg = self.config
        deadline: float | None = None
        while True:
            if not sched.has_work():
                deadline = None
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = sched.schedule()
            if not batch:  # nothing schedulable (e.g. KV full): wait for a change
                deadline = None
                self._wake.clear()
                await self._wake.wait()
                continue
            t_engine = step_time_s(cfg, [(s.n_new, s.n_cached) for s in batch])
            if cfg.spec.enabled:
                t_engine += draft_time_s(cfg, [s.n_cached for s in batch if s.n_draft])
            now = time.perf_counter()
            if deadline is None or deadline < now - t_engine / cfg.speedup:
                if deadline is not None:
                    self.counters.late_steps += 1
                deadline = now  # idle or fell behind by more than a step: re-anchor
            deadline += t_engine / cfg.speedup
            await self._sleep_until(deadline)
            self._lateness_s.append(time.perf_counter() - deadline)
            emitted = sched.complete_step(batch)
            c = self._counters
            if self._on_prefilled is not None:  # prefill-only: the prompt's KV leaves, no token here
                c.steps += 1
                c.scheduled_tokens += sum(s.n_new for s in batch)
                c.busy_engine_s += t_engine
                for req in emitted:
                    req.num_output -= 1
                    sched.release(req)
                    req.state = RequestState.WAITING
                    self._on_prefilled(req)
                continue
            c.steps += 1
            c.scheduled_tokens += sum(s.n_new for s in batch)
            c.prompt_tokens += sum(r.prompt_tokens for r in emitted if r.num_output == 1)
            c.busy_engine_s += t_engine
            for req in emitted:
                n = req.last_emitted
                c.generated_tokens += n
                if n == 1:
                    req.deliver(req.num_output - 1)
                else:
                    req.deliver_run(req.num_output - n, n)
