"""One request of a trace, whatever format it was read from."""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_TOKENS = 512
"""Tokens per hash block in Mooncake-style traces (Qwen-Bailian traces use 16)."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """A request: when it arrived, how long its prompt and answer were, what prefix it shared."""

    timestamp_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    session_id: str | None = None
    turn: int | None = None
    parent_id: str | None = None
    kind: str | None = None
    model: str | None = None
