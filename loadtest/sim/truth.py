"""Ground truth: per-request emit timestamps and server-side counters."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

OUTCOME_OK = "ok"
OUTCOME_CLIENT_DISCONNECTED = "client_disconnected"
OUTCOME_ERROR = "error"
OUTCOME_SERVER_SHUTDOWN = "server_shutdown"


@dataclass
class TruthRecord:
    """When the server handed each piece of one response to the transport (perf_counter_ns)."""

    request_id: str
    response_id: str
    path: str
    stream: bool
    arrival_ns: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    done_ns: int | None = None
    outcome: str = OUTCOME_OK  # ok, a fault kind, client_disconnected, server_shutdown or error
    finish_reason: str | None = None
    fault: str | None = None  # the injected fault's kind
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    reasoning_tokens: int = 0
    num_preemptions: int = 0
    draft_tokens: int = 0  # speculative decoding: draft tokens verified for this request
    accepted_tokens: int = 0  # of those, accepted
    # Disaggregated serving: when the prefill instance finished the prompt, when its KV reached decode.
    prefill_done_ns: int | None = None
    kv_arrived_ns: int | None = None
    replica: int | None = None  # the replica that served it (replicas behind a router), else None

    def to_json(self) -> str:
        return _encode(self).decode()


_encode = msgspec.json.Encoder().encode


class TruthLog:
    """Finished requests' records: kept in memory (bounded) and appended to a JSONL file if given.

    Records are kept as their encoded JSON lines: compact, and invisible to the garbage collector,
    so a long run's truth never makes collections (and the engine's steps) slower.
    """

    def __init__(self, path: str | Path | None = None, keep: int = 200_000) -> None:
        self.lines: deque[bytes] = deque(maxlen=keep)
        self.path = Path(path) if path is not None else None
        self._fh: TextIO | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8", buffering=1)

    def add(self, rec: TruthRecord) -> None:
        line = _encode(rec) + b"\n"
        self.lines.append(line)
        if self._fh is not None:
            self._fh.write(line.decode())

    def jsonl(self) -> str:
        return b"".join(self.lines).decode()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class SimStats:
    """Counters served at /sim/stats."""

    requests_received: int = 0
    requests_completed: int = 0
    requests_rejected: int = 0
    completion_tokens_total: int = 0
    prompt_tokens_total: int = 0
    requests_by_outcome: Counter[str] = field(default_factory=Counter)
    requests_by_path: Counter[str] = field(default_factory=Counter)
    rejected_by_status: Counter[str] = field(default_factory=Counter)
    faults_injected: Counter[str] = field(default_factory=Counter)

    def received(self, path: str) -> None:
        self.requests_received += 1
        self.requests_by_path[path] += 1

    def rejected(self, status: int) -> None:
        self.requests_rejected += 1
        self.rejected_by_status[str(status)] += 1

    def finished(self, rec: TruthRecord) -> None:
        self.requests_completed += 1
        self.requests_by_outcome[rec.outcome] += 1
        if rec.fault is not None:
            self.faults_injected[rec.fault] += 1
        self.completion_tokens_total += rec.completion_tokens
        self.prompt_tokens_total += rec.prompt_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests_received": self.requests_received,
            "requests_completed": self.requests_completed,
            "requests_rejected": self.requests_rejected,
            "requests_by_outcome": dict(self.requests_by_outcome),
            "requests_by_path": dict(self.requests_by_path),
            "rejected_by_status": dict(self.rejected_by_status),
            "faults_injected": dict(self.faults_injected),
            "completion_tokens_total": self.completion_tokens_total,
            "prompt_tokens_total": self.prompt_tokens_total,
        }
