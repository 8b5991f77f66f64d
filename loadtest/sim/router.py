"""Routing policies over engine replicas: round-robin, session affinity and KV-aware (docs/sources.md §28)."""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, get_args

from loadtest.profile.schema import RouterName

ROUTERS: tuple[str, ...] = get_args(RouterName)
VNODES = 64  # points per replica on the session ring


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """What a policy sees of one replica for one request: the request's prompt blocks it already caches
    (leading, in blocks), its prompt work not yet computed (blocks), its KV blocks in use, its requests."""

    cached_blocks: int = 0
    prefill_backlog_blocks: int = 0
    active_blocks: int = 0
    requests: int = 0


class Policy(Protocol):
    """Picks the replica of one request."""

    name: str
    needs_state: bool  # whether ``pick`` reads the replicas' states (else it is given none)

    def pick(self, states: Sequence[ReplicaState], prompt_blocks: int, session: str | None) -> int: ...


class RoundRobin:
    """Each request to the next replica in turn."""

    name = "round-robin"
    needs_state = False

    def __init__(self, n: int) -> None:
        self._next = itertools.cycle(range(n))

    def pick(self, states: Sequence[ReplicaState], prompt_blocks: int, session: str | None) -> int:
        return next(self._next)


def _point(key: str) -> int:
    """A stable 64-bit point on the ring (the same in every process, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class SessionAffinity:
    """A consistent hash of the session key (``VNODES`` points a replica on a ring): every call of one
    conversation to one replica; a request without a key goes round-robin."""

    name = "session"
    needs_state = False

    def __init__(self, n: int) -> None:
        ring = sorted((_point(f"replica-{i}-{v}"), i) for i in range(n) for v in range(VNODES))
        self._points = [p for p, _ in ring]
        self._owners = [i for _, i in ring]
        self._fallback = RoundRobin(n)

    def pick(self, states: Sequence[ReplicaState], prompt_blocks: int, session: str | None) -> int:
        if not session:
            return self._fallback.pick(states, prompt_blocks, session)
        k = bisect.bisect(self._points, _point(session)) % len(self._points)
        return self._owners[k]


def kv_cost(state: ReplicaState, prompt_blocks: int, overlap_weight: float = 1.0) -> float:
    """Dynamo's KV router cost of sending a request of ``prompt_blocks`` to a replica (lower is better):
    ``overlap_weight · prefill_blocks + decode_blocks``, prefill blocks being the replica's prompt work
    not yet computed plus the request's blocks it does not cache, decode blocks its KV blocks in use
    plus the request's (docs/sources.md §28)."""
    prefill = state.prefill_backlog_blocks + max(prompt_blocks - state.cached_blocks, 0)
    decode = state.active_blocks + prompt_blocks
    return overlap_weight * prefill + decode


class KvAware:
    """The replica of least ``kv_cost``; ties to the one with fewer requests, then in turn."""

    name = "kv"
    needs_state = True

    def __init__(self, n: int, overlap_weight: float = 1.0) -> None:
        self.overlap_weight = overlap_weight
        self._turn = itertools.cycle(range(n))
        self._n = n

    def pick(self, states: Sequence[ReplicaState], prompt_blocks: int, session: str | None) -> int:
        start = next(self._turn)
        order = [(start + k) % self._n for k in range(self._n)]
        return min(
            order,
            key=lambda i: (kv_cost(states[i], prompt_blocks, self.overlap_weight), states[i].requests),
        )


def make_policy(name: str, n: int, overlap_weight: float = 1.0) -> Policy:
    """The policy called ``name`` over ``n`` replicas; ValueError for an unknown name."""
    if name == "round-robin":
        return RoundRobin(n)
    if name == "session":
        return SessionAffinity(n)
    if name == "kv":
        return KvAware(n, overlap_weight)
    raise ValueError(f"router {name!r}: give one of {', '.join(ROUTERS)}")
