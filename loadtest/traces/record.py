"""One request of a trace, whatever format it was read from."""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_TOKENS = 512
"""Tokens per hash block in Mooncake-style traces (Qwen-Bailian traces use 16)."""

FORMAT_BLOCK_TOKENS = {"mooncake": 512, "bailian": 16, "loadtest": BLOCK_TOKENS}
"""Tokens per hash block by trace format (docs/traces.md): Mooncake's 512, Qwen-Bailian's 16 (its
README: "16 tokens per block"); this project's own JSONL follows Mooncake."""


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
