"""The engine-side state of one generation request."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum

SHUTDOWN = -1  # put on a request's queue instead of a token index when the engine stops


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
    or ``SHUTDOWN`` if the engine stops first.
    """

    request_id: str
    prompt_tokens: int
    target_tokens: int
    arrival_s: float
    num_computed: int = 0
    num_output: int = 0
    state: RequestState = RequestState.WAITING
    queue: asyncio.Queue[int] = field(default_factory=asyncio.Queue)

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
