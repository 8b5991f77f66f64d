"""The engine-side state of one generation request."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

# Sentinels put on a request's queue instead of a token index:
SHUTDOWN = -1  # the engine stopped before the request finished
ERROR = -2  # the engine refused the request (state ABORTED, reason in ``SimRequest.error``)

_uids = itertools.count()


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine: prompt, target output length, progress, and its token queue.

    ``num_computed`` counts tokens whose KV is computed; the next token is sampled once all
    ``num_tokens`` (the prompt plus every token generated so far) are computed.
    The queue receives the index of each generated token (0, 1, ...) at the end of its step,
    then nothing more once ``target_tokens`` are out; or ``SHUTDOWN`` if the engine stops first;
    or ``ERROR`` (with ``error`` set, before any token) if the request can never fit the KV cache.

    ``prompt_ids`` (None for a count-only prompt) keys the prefix cache; ``num_cached_tokens``
    is the prefix-cache hit at first scheduling (``usage.prompt_tokens_details.cached_tokens``).
    A preempted request goes back to waiting with ``num_computed = 0`` and later recomputes
    its prompt and the tokens it already generated (already-streamed tokens are not resent).
    """

    request_id: str
    prompt_tokens: int
    target_tokens: int
    arrival_s: float
    prompt_ids: tuple[int, ...] | None = None
    num_computed: int = 0
    num_output: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified for this request
    num_accepted_tokens: int = 0  # of those, accepted
    last_emitted: int = 1  # tokens the latest step produced for this request
    # Disaggregated serving (sim/disagg.py): the prompt's KV came from a prefill instance; when its
    # prefill ended there and when its KV reached the decode instance (perf_counter_ns).
    kv_transferred: bool = False
    prefill_done_ns: int | None = None
    kv_arrived_ns: int | None = None
    replica: int | None = None  # the replica the router sent it to (sim/replicas.py), None with one engine
    routed_cached_tokens: int = 0  # its prompt tokens that replica held cached when the router picked it
    error: str | None = None
    state: RequestState = RequestState.WAITING
    queue: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    # Optional synchronous receiver of the same values, called by the engine at the end of the step
    # instead of queueing them (lets the server write every stream's chunk in the step itself).
    sink: Callable[[int], None] | None = None
    # The same for several tokens of one step (speculative decoding): first index and count, written
    # as one chunk; None: ``sink`` gets each index.
    sink_run: Callable[[int, int], None] | None = None

    def deliver(self, value: int) -> None:
        """Hand a token index or a sentinel to the server side."""
        if self.sink is not None:
            self.sink(value)
        else:
            self.queue.put_nowait(value)

    def deliver_run(self, first: int, n: int) -> None:
        """Hand the ``n`` token indices from ``first`` that one step produced to the server side."""
        if n > 1 and self.sink_run is not None:
            self.sink_run(first, n)
            return
        for index in range(first, first + n):
            self.deliver(index)

    uid: int = field(default_factory=lambda: next(_uids), repr=False)
    block_hashes: list[int] = field(default_factory=list, repr=False)

    @property
    def num_tokens(self) -> int:
        """Tokens that must be in the KV cache before the next token is sampled."""
        return self.prompt_tokens + self.num_output

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.prompt_tokens

    @property
    def done(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.ABORTED)
