"""Tests for the simulated engine's paged KV cache, prefix cache, preemption and memory budget."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

import pytest

from loadtest.sim.clock import step_time_s
from loadtest.sim.engine import Engine
from loadtest.sim.kv import KvManager
from loadtest.sim.memory import kv_capacity_blocks
from loadtest.sim.presets import H100_SXM, H200_SXM, LLAMA_3_1_8B, LLAMA_3_1_70B, EngineConfig
from loadtest.sim.request import ERROR, RequestState, SimRequest
from loadtest.sim.scheduler import Scheduler

CFG = EngineConfig(gpu=H100_SXM, model=LLAMA_3_1_8B)


def _cfg(base: EngineConfig = CFG, **extra: Any) -> SimpleNamespace:
    """A config with fields EngineConfig may not have yet (kv_blocks, gpu_memory_utilization, ...)."""
    return SimpleNamespace(**{**{f.name: getattr(base, f.name) for f in fields(base)}, **extra})


def _req(i: int, prompt: int | list[int], target: int) -> SimRequest:
    ids = tuple(prompt) if isinstance(prompt, list) else None
    n = len(ids) if ids is not None else int(prompt)  # type: ignore[arg-type]
    return SimRequest(request_id=str(i), prompt_tokens=n, target_tokens=target, arrival_s=0.0, prompt_ids=ids)


def _check_blocks(kv: KvManager) -> None:
    """Every block is either referenced by a live block table or in the free queue, never both."""
    held = {b for table in kv._tables.values() for b in table}
    free = set(kv._free) | set(range(kv._fresh, kv.num_blocks))  # freed, and never used
    assert not held & free
    assert held | free == set(range(kv.num_blocks))
    assert kv.num_free_blocks == len(free)
    for b in range(kv.num_blocks):
        want = sum(table.count(b) for table in kv._tables.values())
        assert (kv._ref[b] if b < kv._fresh else 0) == want


def _run(s: Scheduler, max_steps: int = 100_000, cfg: EngineConfig = CFG) -> dict[SimRequest, list[float]]:
    """Step the scheduler to completion; per request, the modelled engine time of each emitted token."""
    t = 0.0
    emits: dict[SimRequest, list[float]] = {}
    for _ in range(max_steps):
        if not s.has_work():
            return emits
        batch = s.schedule()
        assert batch, "scheduler stalled with work left"
        t += step_time_s(cfg, [(x.n_new, x.n_cached) for x in batch])
        for r in s.complete_step(batch):
            emits.setdefault(r, []).append(t)
        if isinstance(s.kv, KvManager):
            _check_blocks(s.kv)
    raise AssertionError("did not finish")


# ---- memory budget ---------------------------------------------------------------------------
def test_kv_capacity_matches_hand_computation() -> None:
    # Llama-3.1-8B on one H100 at 0.9: (0.9·80e9 − 8.03e9·2 − 4e9) / (kv_B 131072 · 16 tokens).
    want = math.floor((0.9 * 80e9 - 8.03e9 * 2 - 4e9) / (131072 * 16))
    assert want == 24766
    assert kv_capacity_blocks(CFG) == want
    assert kv_capacity_blocks(_cfg(gpu_memory_utilization=0.5)) == math.floor(
        (0.5 * 80e9 - 8.03e9 * 2 - 4e9) / (131072 * 16)
    )
    big = EngineConfig(gpu=H200_SXM, model=LLAMA_3_1_70B, tp=2)
    kv_b = 2 * 80 * 8 * 128 * 2
    assert kv_capacity_blocks(big) == math.floor((0.9 * 141e9 * 2 - 70.6e9 * 2 - 4e9 * 2) / (kv_b * 16))
    assert kv_capacity_blocks(_cfg(kv_blocks=100)) == 100
    assert kv_capacity_blocks(_cfg(block_size=32)) == math.floor(
        (0.9 * 80e9 - 8.03e9 * 2 - 4e9) / (131072 * 32)
    )


def test_model_that_does_not_fit_raises() -> None:
    cfg = EngineConfig(gpu=H100_SXM, model=LLAMA_3_1_70B)
    with pytest.raises(
        ValueError, match=r"Llama-3.1-70B needs 141 GB of weights; 1×H100-SXM has 80 GB.*--tp ≥ 3"
    ):
        kv_capacity_blocks(cfg)
    with pytest.raises(ValueError, match="--tp"):
        Engine(cfg)
    assert kv_capacity_blocks(_cfg(cfg, kv_blocks=7)) == 7  # the override wins


def test_engine_from_config_uses_paged_kv() -> None:
    eng = Engine(CFG)
    kv = eng.scheduler.kv
    assert isinstance(kv, KvManager)
    assert kv.num_blocks == 24766 and kv.block_size == 16 and kv.prefix_caching
    assert eng.kv_usage == 0.0


# ---- allocation ------------------------------------------------------------------------------
def test_allocation_never_leaks() -> None:
    rng = random.Random(1)
    kv = KvManager(num_blocks=64, block_size=16)
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=256, kv=kv)
    reqs = []
    for i in range(40):
        shared = list(range(rng.choice([0, 32, 100])))
        prompt = shared + [10_000 + rng.randrange(1000) for _ in range(rng.randint(1, 150))]
        reqs.append(_req(i, prompt if i % 3 else len(prompt), rng.randint(1, 80)))
    for r in reqs:
        assert s.add(r)
    emits = _run(s)
    assert all(len(emits[r]) == r.target_tokens and r.state is RequestState.FINISHED for r in reqs)
    assert s.stats.preemptions > 0  # 64 blocks is tight for 8 such requests
    assert kv.num_free_blocks == kv.num_blocks and kv.usage() == 0.0
    assert kv.num_cached_blocks > 0  # finished blocks stay cached, unreferenced
    _check_blocks(kv)


def test_allocate_is_all_or_nothing() -> None:
    kv = KvManager(num_blocks=4, block_size=16)
    a, b = _req(0, 40, 5), _req(1, 40, 5)
    assert kv.allocate(a, 40) and len(kv.block_table(a)) == 3
    assert kv.usage() == pytest.approx(0.75)
    assert not kv.allocate(b, 40)
    assert kv.block_table(b) == [] and kv.num_free_blocks == 1
    kv.free(a)
    kv.free(a)  # idempotent
    assert kv.usage() == 0.0 and kv.allocate(b, 40)


# ---- prefix cache ----------------------------------------------------------------------------
PREFIX = list(range(1024))


def test_prefix_cache_hit_skips_prefill() -> None:
    kv = KvManager(num_blocks=1000, block_size=16)
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=8192, kv=kv)
    a = _req(0, PREFIX + list(range(5000, 5100)), 3)
    b = _req(1, PREFIX + list(range(6000, 6100)), 3)
    c = _req(2, list(range(9000, 9000 + 1124)), 3)  # a different prefix
    ttft = {}
    for r in (a, b, c):
        s.add(r)
        first_batch = s.schedule()
        ttft[r] = step_time_s(CFG, [(x.n_new, x.n_cached) for x in first_batch])
        assert [(x.n_new, x.n_cached) for x in first_batch] == [
            (r.prompt_tokens - r.num_cached_tokens, r.num_cached_tokens)
        ]
        assert s.complete_step(first_batch) == [r]
        _run(s)
    assert (a.num_cached_tokens, b.num_cached_tokens, c.num_cached_tokens) == (0, 1024, 0)
    assert ttft[b] < 0.5 * ttft[a]
    assert ttft[c] == pytest.approx(ttft[a], rel=0.01)
    assert s.stats.prefix_queries == 3 * 1124 and s.stats.prefix_hits == 1024
    # The identical full prompt again: the last block is not reused (one prompt token must be
    # computed to sample from), so 1024 − 16 hit for a block-aligned 1024-token prompt.
    d, e = _req(3, PREFIX, 2), _req(4, PREFIX[:1000], 2)
    s.add(d)
    s.add(e)
    _run(s)
    assert d.num_cached_tokens == 1008
    assert e.num_cached_tokens == 992  # full blocks only: 62·16
    assert kv.usage() == 0.0


def test_prefix_cache_can_be_disabled() -> None:
    kv = KvManager(num_blocks=1000, block_size=16, enable_prefix_caching=False)
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=8192, kv=kv)
    a, b = _req(0, PREFIX + [1], 2), _req(1, PREFIX + [2], 2)
    s.add(a)
    _run(s)
    s.add(b)
    _run(s)
    assert b.num_cached_tokens == 0 and s.stats.prefix_queries == 0 and kv.num_cached_blocks == 0


def test_prefix_cache_lru_eviction() -> None:
    kv = KvManager(num_blocks=8, block_size=4)
    x, y = _req(0, list(range(8)), 1), _req(1, list(range(100, 108)), 1)
    for r in (x, y):  # 2 full blocks each, cached; x freed first (older)
        assert kv.allocate(r, 8)
        kv.free(r)
    assert kv.num_cached_blocks == 4 and kv.usage() == 0.0
    x2, y2 = _req(2, list(range(8)) + [1], 1), _req(3, list(range(100, 108)) + [1], 1)
    assert kv.cached_prefix_tokens(x2) == 8 and kv.cached_prefix_tokens(y2) == 8
    # 6 new blocks: the 4 never-used blocks, then x's (least recently used) two.
    z = _req(4, 24, 1)
    assert kv.allocate(z, 24)
    assert kv.cached_prefix_tokens(x2) == 0 and kv.cached_prefix_tokens(y2) == 8
    kv.free(z)
    # A hit makes blocks most recently used: w re-uses y's blocks, frees them after z's.
    w = _req(5, list(range(100, 108)) + [7, 7], 1)
    w.num_computed = kv.cached_prefix_tokens(w)
    assert w.num_computed == 8 and kv.allocate(w, 2)
    kv.free(w)
    big = _req(6, 24, 1)
    assert kv.allocate(big, 24)  # 6 of 8 blocks: z's six go first, y's survive
    assert kv.cached_prefix_tokens(y2) == 8
    _check_blocks(kv)


def test_recompute_hits_own_output_blocks() -> None:
    kv = KvManager(num_blocks=8, block_size=4)
    r = _req(0, list(range(6)), 5)
    assert kv.allocate(r, 6)
    r.num_computed, r.num_output = 6, 1
    assert kv.allocate(r, 1)
    r.num_computed, r.num_output = 7, 2
    assert kv.allocate(r, 1)  # tokens 0..7 computed: block 1 holds prompt 4,5 and outputs 0,1
    r.num_computed, r.num_output = 8, 3
    kv.free(r)
    r.num_computed = 0
    assert kv.cached_prefix_tokens(r) == 8  # (9 − 1) // 4 blocks: including the output block
    other = _req(1, list(range(6)) + [0, 1, 2], 1)  # same prompt, its own content after it
    assert kv.cached_prefix_tokens(other) == 4


# ---- preemption ------------------------------------------------------------------------------
def test_preemption_is_lifo() -> None:
    kv = KvManager(num_blocks=6, block_size=4)
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=100, kv=kv)
    a, b, c = _req(0, 7, 10), _req(1, 7, 10), _req(2, 7, 10)
    for r in (a, b, c):
        s.add(r)
    assert [x.req for x in s.schedule()] == [a, b, c]  # 2 blocks each: the cache is full
    s.complete_step([])
    for r in (a, b, c):
        r.num_computed, r.num_output = 8, 2  # as if 2 steps ran: the next token needs a 3rd block
    batch = s.schedule()
    assert [x.req for x in batch] == [a, b]
    assert s.running == [a, b] and list(s.waiting) == [c]
    assert (a.num_preemptions, b.num_preemptions, c.num_preemptions) == (0, 0, 1)
    assert c.state is RequestState.WAITING and c.num_computed == 0 and s.stats.preemptions == 1
    assert kv.block_table(c) == []
    _check_blocks(kv)


def test_preemption_can_hit_itself() -> None:
    kv = KvManager(num_blocks=3, block_size=4)
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=100, kv=kv)
    a, b = _req(0, 4, 5), _req(1, 4, 5)
    s.add(a)
    s.add(b)
    s.complete_step(s.schedule())  # 1 block each; both sample their first token
    assert [x.req for x in s.schedule()] == [a]  # a takes the last block, b (newest) preempts itself
    assert list(s.waiting) == [b] and b.num_preemptions == 1


def test_preemption_completes_everything_with_a_stall() -> None:
    kv = KvManager(num_blocks=40, block_size=16)
    s = Scheduler(max_num_seqs=64, max_num_batched_tokens=512, kv=kv)
    reqs = [_req(i, 100, 60) for i in range(8)]  # 8 × 10 blocks wanted, 40 exist
    for r in reqs:
        s.add(r)
    emits = _run(s)
    assert s.stats.preemptions > 0
    for r in reqs:
        assert len(emits[r]) == 60 and r.num_output == 60
    victim = max(reqs, key=lambda r: r.num_preemptions)
    assert victim.num_preemptions > 0
    gaps = [b - a for a, b in zip(emits[victim], emits[victim][1:], strict=False)]
    assert max(gaps) > 5 * statistics.median(gaps)
    assert kv.usage() == 0.0


def test_engine_preemption_stalls_stream_but_completes() -> None:
    async def main() -> tuple[Engine, list[SimRequest], dict[SimRequest, list[float]]]:
        eng = Engine(CFG.__class__(speedup=20.0), Scheduler(64, 512, KvManager(num_blocks=40, block_size=16)))
        await eng.start()
        reqs = [eng.submit(100, 60) for _ in range(8)]
        times: dict[SimRequest, list[float]] = {r: [] for r in reqs}

        async def consume(r: SimRequest) -> None:
            for i in range(r.target_tokens):
                assert await r.queue.get() == i
                times[r].append(time.perf_counter())

        await asyncio.wait_for(asyncio.gather(*(consume(r) for r in reqs)), 20)
        await eng.stop()
        return eng, reqs, times

    eng, reqs, times = asyncio.run(main())
    assert eng.counters.preemptions > 0 and eng.counters.preemptions == sum(r.num_preemptions for r in reqs)
    assert all(r.state is RequestState.FINISHED and r.queue.empty() for r in reqs)
    assert eng.kv_usage == 0.0 and eng.num_running == 0 and eng.num_waiting == 0
    victim = max(reqs, key=lambda r: r.num_preemptions)
    gaps = [b - a for a, b in zip(times[victim], times[victim][1:], strict=False)]
    assert max(gaps) > 5 * statistics.median(gaps)


# ---- engine ----------------------------------------------------------------------------------
def test_engine_prefix_hit_shortens_ttft() -> None:
    async def ttft(eng: Engine, prompt: list[int]) -> tuple[SimRequest, float]:
        t0 = time.perf_counter()
        r = eng.submit(prompt, 2)
        assert await r.queue.get() == 0
        t = time.perf_counter() - t0
        assert await r.queue.get() == 1
        return r, t

    async def main() -> tuple[Engine, list[tuple[SimRequest, float]]]:
        # At the clock's own speed the first prefill takes about 50 ms: a busy machine's late wake-ups
        # (a few ms) cannot close the gap between it and the cached one's
        eng = Engine(EngineConfig(speedup=1.0))
        await eng.start()
        out = [await ttft(eng, PREFIX + [5000 + i] * 100) for i in range(2)]
        await eng.stop()
        return eng, out

    eng, [(a, ta), (b, tb)] = asyncio.run(main())
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 1024)
    assert a.prompt_ids is not None and a.prompt_tokens == 1124
    assert tb < 0.6 * ta, (tb, ta)
    c = eng.counters
    assert (c.prefix_queries, c.prefix_hits, c.preemptions) == (2 * 1124, 1024, 0)
    assert eng.kv_usage == 0.0


def test_oversized_request_fails_cleanly() -> None:
    async def main() -> tuple[Engine, list[SimRequest]]:
        eng = Engine(EngineConfig(speedup=50.0), Scheduler(64, 512, KvManager(num_blocks=10, block_size=16)))
        await eng.start()
        big = eng.submit(500, 5)
        long_out = eng.submit(list(range(100)), 100)
        ok = eng.submit(20, 5)
        got = [await asyncio.wait_for(ok.queue.get(), 5) for _ in range(5)]
        assert got == [0, 1, 2, 3, 4]
        await eng.stop()
        return eng, [big, long_out, ok]

    eng, [big, long_out, ok] = asyncio.run(main())
    assert (
        big.state is RequestState.ABORTED
        and big.error == "prompt of 500 tokens exceeds the KV cache (160 tokens)"
    )
    assert big.queue.get_nowait() == ERROR and big.queue.empty()
    assert long_out.error is not None and "plus 100 output tokens" in long_out.error
    assert long_out.queue.get_nowait() == ERROR
    assert ok.state is RequestState.FINISHED and ok.error is None
    assert eng.counters.rejected == 2
