"""KV-cache managers: a paged block allocator with a prefix cache, and an unlimited stand-in."""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from loadtest.sim.prefix_cache import extend_block_hashes
from loadtest.sim.request import SimRequest


class KvBackend(Protocol):
    """What the scheduler needs from a KV cache; it preempts when ``allocate`` refuses a running request."""

    prefix_caching: bool
    capacity_tokens: int | None  # None: unlimited

    def cached_prefix_tokens(self, req: SimRequest) -> int:
        """Leading tokens of ``req`` already in the cache (block aligned, < num_tokens); no side effects."""
        ...

    def allocate(self, req: SimRequest, n_new: int) -> bool:
        """Hold blocks for ``num_computed + n_new`` tokens of ``req``; False (allocating nothing) if they don't fit.

        A request without blocks whose ``num_computed`` was set from ``cached_prefix_tokens``
        first takes references on those cached blocks.
        """
        ...

    def free(self, req: SimRequest) -> None:
        """Release everything ``req`` holds (finished, aborted or preempted); idempotent."""
        ...

    def usage(self) -> float:
        """Fraction of KV capacity in use (0..1)."""
        ...


class UnlimitedKv:
    """Infinite KV capacity, no prefix cache."""

    prefix_caching = False
    capacity_tokens: int | None = None

    def cached_prefix_tokens(self, req: SimRequest) -> int:
        return 0

    def allocate(self, req: SimRequest, n_new: int) -> bool:
        return True

    def free(self, req: SimRequest) -> None:
        return None

    def usage(self) -> float:
        return 0.0


class KvManager:
    """Paged KV cache (vLLM V1 style): per-request block tables, ref counts, content-hash prefix cache.

    Free blocks sit in an LRU queue (oldest first). A freed block keeps its hash and stays
    findable until it is reused; a prefix hit on it takes it back out of the queue. A finished
    request's blocks are queued tail first, so its prefix blocks are evicted last.
    """

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = enable_prefix_caching
        self.capacity_tokens: int | None = num_blocks * block_size
        # Blocks from ``_fresh`` up were never used: free, unhashed, taken in order before any freed
        # block (as a queue of all blocks would give them), so a rack-sized cache costs nothing up front.
        self._fresh = 0
        self._ref: list[int] = []  # per used block id (< _fresh)
        self._hash: list[int | None] = []
        self._free: OrderedDict[int, None] = OrderedDict()  # freed blocks, oldest first
        self._cache: dict[int, int] = {}  # block hash -> block id
        self._tables: dict[SimRequest, list[int]] = {}
        self._hashed: dict[SimRequest, int] = {}  # full blocks of the request already offered to the cache

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody references (including cached ones that may be evicted)."""
        return len(self._free) + self.num_blocks - self._fresh

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cache)

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def block_table(self, req: SimRequest) -> list[int]:
        return list(self._tables.get(req, ()))

    def cached_prefix_tokens(self, req: SimRequest) -> int:
        if not self.prefix_caching:
            return 0
        bs = self.block_size
        hashes = extend_block_hashes(req, (req.num_tokens - 1) // bs, bs)
        hits = 0
        for h in hashes[: (req.num_tokens - 1) // bs]:
            if h not in self._cache:
                break
            hits += 1
        return hits * bs

    # ---- changes -------------------------------------------------------------------------
    def allocate(self, req: SimRequest, n_new: int) -> bool:
        bs = self.block_size
        table = self._tables.get(req)
        if table is not None:  # the common case: a running request extending its own blocks
            end = req.num_computed + n_new
            need = -(-end // bs) - len(table)
            if need > self.num_free_blocks:
                return False
            for _ in range(need):
                table.append(self._take_free())
            # Blocks the known tokens just filled up (a speculative step's drafts are not known yet).
            known = min(end, req.num_tokens)
            if self.prefix_caching and known // bs > self._hashed.get(req, 0):
                self._cache_full_blocks(req, table, known)
            return True
        # First allocation: take the prefix-cache hits, then fresh blocks.
        table = []
        n_hit = req.num_computed // bs
        hit_blocks = [self._cache[h] for h in req.block_hashes[:n_hit]] if n_hit else []
        need = max(0, -(-(req.num_computed + n_new) // bs) - len(hit_blocks))
        reclaimed = sum(1 for b in hit_blocks if self._ref[b] == 0)
        if need + reclaimed > self.num_free_blocks:
            return False
        for b in hit_blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
            table.append(b)
        for _ in range(need):
            table.append(self._take_free())
        self._tables[req] = table
        if self.prefix_caching:
            self._cache_full_blocks(req, table, min(req.num_computed + n_new, req.num_tokens))
        return True

    def free(self, req: SimRequest) -> None:
        table = self._tables.pop(req, None)
        self._hashed.pop(req, None)
        if not table:
            return
        for b in reversed(table):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def _take_free(self) -> int:
        if self._fresh < self.num_blocks:
            b = self._fresh
            self._fresh += 1
            self._ref.append(1)
            self._hash.append(None)
            return b
        b, _ = self._free.popitem(last=False)
        h = self._hash[b]
        if h is not None:  # evict: the least recently used cached block goes
            if self._cache.get(h) == b:
                del self._cache[h]
            self._hash[b] = None
        self._ref[b] = 1
        return b

    def _cache_full_blocks(self, req: SimRequest, table: list[int], n_tokens: int) -> None:
        """Offer the request's blocks that ``n_tokens`` fill completely to the prefix cache."""
        bs = self.block_size
        full = n_tokens // bs
        start = self._hashed.get(req, 0)
        if full <= start:
            return
        hashes = extend_block_hashes(req, full, bs)
        for k in range(start, full):
            b, h = table[k], hashes[k]
            if self._hash[b] is None and h not in self._cache:
                self._cache[h] = b
                self._hash[b] = h
        self._hashed[req] = full
