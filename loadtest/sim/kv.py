"""KV-cache capacity management seam for the scheduler (unlimited for now)."""

from __future__ import annotations

from typing import Protocol

from loadtest.sim.request import SimRequest


class KvManager(Protocol):
    """Decides whether a request may grow its KV cache by ``n_new`` tokens this step.

    A paged implementation (16-token blocks, prefix cache, LRU eviction) will replace the
    unlimited one; the scheduler preempts when ``allocate`` refuses a running request.
    """

    def allocate(self, req: SimRequest, n_new: int) -> bool:
        """Reserve room for ``n_new`` more tokens of ``req``; False if it does not fit."""
        ...

    def free(self, req: SimRequest) -> None:
        """Release everything ``req`` holds (finished, aborted or preempted)."""
        ...

    def cached_prefix_tokens(self, req: SimRequest) -> int:
        """Prompt tokens already in the cache (prefix-cache hit) when ``req`` is admitted."""
        ...

    def usage(self) -> float:
        """Fraction of KV capacity in use (0..1)."""
        ...


class UnlimitedKv:
    """Infinite KV capacity, no prefix cache."""

    def allocate(self, req: SimRequest, n_new: int) -> bool:
        return True

    def free(self, req: SimRequest) -> None:
        return None

    def cached_prefix_tokens(self, req: SimRequest) -> int:
        return 0

    def usage(self) -> float:
        return 0.0
