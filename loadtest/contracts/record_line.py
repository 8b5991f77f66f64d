"""The record-log line (one JSON object per finished request in records*.jsonl): its Struct, encoder and decoder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import msgspec
from msgspec import UNSET, UnsetType


class AgenticTurn(msgspec.Struct, omit_defaults=True):
    """A recorded agent call with an expected answer (MLPerf agentic rows), as the inline accuracy check
    reads it (accuracy/scorers/agentic.py): the recorded conversation and client turn, the recorded
    answer's tool calls and intent codes, and, where tool calls were recorded, the answer's ([name,
    arguments] each, the arguments of ``bash`` calls only); the answer's reasoning and text only where
    intent codes are expected (the workflow domain)."""

    conversation: str
    turn: int
    expected_calls: list[list[str]] = msgspec.field(default_factory=list)
    expected_intents: list[str] = msgspec.field(default_factory=list)
    calls: list[list[str]] = msgspec.field(default_factory=list)
    reasoning: str = ""
    content: str = ""

    @classmethod
    def expecting(cls, conversation: str, turn: int, expected: Mapping[str, Any]) -> AgenticTurn:
        """The turn before its answer: the recorded assistant message's tool calls and intent codes."""
        calls = [
            [str(fn.get("name") or ""), str(fn.get("arguments") or "")]
            for c in expected.get("tool_calls") or ()
            if isinstance(c, dict) and isinstance(fn := c.get("function"), dict)
        ]
        codes = expected.get("intent_codes")
        intents = [c for c in codes if isinstance(c, str) and c] if isinstance(codes, list) else []
        return cls(conversation, turn, expected_calls=calls, expected_intents=intents)


class RecordLine(msgspec.Struct):
    """One line of the record log, its fields in the order they are written (``RequestRecord.to_log``).

    ``t`` is the scheduled wall-clock epoch (s); every ``*_us`` is µs after it (None: did not happen).
    Every field has a default, what a fresh ``RequestRecord`` writes, so that lines of older versions
    (without ``wire_id``, ``attempt``, ``retry_of``, ``endpoint``) still decode.
    """

    id: str = ""
    wire_id: str | None = None  # the X-Request-Id header the request carried
    scenario: str = "default"
    api: str = "chat"
    stream: bool = True
    worker: int = 0
    t: float = 0.0
    outcome: str = "cancelled"
    status: int = 0
    error: str | None = None
    finish_reason: str | None = None
    sent_us: int | None = None
    headers_us: int | None = None
    ttft_us: int | None = None
    first_answer_us: int | None = None
    e2e_us: int | None = None
    tpot_us: float | None = None
    chunks_us: list[int] = msgspec.field(default_factory=list)
    requested_output_tokens: int | None = None
    prompt_tokens: int = 0  # the client tokenizer's counts
    output_tokens: int = 0
    reasoning_tokens: int = 0
    usage_prompt_tokens: int | None = None  # the server's usage, when it sent one
    usage_completion_tokens: int | None = None
    usage_cached_tokens: int | None = None
    usage_reasoning_tokens: int | None = None
    attempt: int = 0  # 0 = the original request, 1.. = retries
    retry_of: str | None = None
    endpoint: int = 0  # index of the endpoint (replica), in the run's --host order
    inputs: int | UnsetType = UNSET  # embeddings: the inputs the request carried; written only when non-zero
    # Token gaps whose later event arrived in one read with another token event (docs/metrics.md,
    # "Merged gaps"); written only when non-zero.
    merged_gaps: int | UnsetType = UNSET
    # The answer checks an ok answer failed (client/quality.py: empty, finish_reason, length, json,
    # match); written only when one failed.
    quality_failed: list[str] | UnsetType = UNSET
    # Characters of each token-carrying event's fragments (text, reasoning, tool-call arguments), one per
    # ``chunks_us`` entry; written only for a streamed answer that had one (docs/metrics.md, "Conventions").
    chunk_chars: list[int] | UnsetType = UNSET
    # Written by earlier versions only: the first output-bearing event's tokens. A line without
    # ``endpoints_tpot_tokens`` takes the Endpoints output count less this for its TPOT.
    first_chunk_tokens: int | UnsetType = UNSET
    # The answer's MLPerf Endpoints token count as its reference client makes it (tokens/assistant.py): a
    # text-only answer's plain count, one with reasoning or tool calls through the model's chat template.
    endpoints_output_tokens: int | UnsetType = UNSET
    # The Endpoints TPOT's denominator: the tokens of what followed the first output-bearing chunk,
    # counted the same way; written only for a streamed answer with a first chunk.
    endpoints_tpot_tokens: int | UnsetType = UNSET
    # The connection this request opened, in µs: [name resolution, TCP connect, a proxy's CONNECT tunnel,
    # TLS handshake] (0 where not done); absent when it went on a kept-alive connection.
    new_connection: list[int] | UnsetType = UNSET
    # The conversation (multi-turn chat, agent, recorded agent session) the call belongs to, and whether it
    # was the conversation's planned last call; written only for a session's calls (docs/metrics.md,
    # "Conversations").
    session: str | UnsetType = UNSET
    session_last: bool | UnsetType = UNSET
    # A job API's parts, in µs (video_jobs): [submit, queued, generating, download]: the create request,
    # its answer to the first poll that saw the job running, then to the poll that saw it completed, then
    # the content's download; written only for a job (docs/api-surface.md, "Video generation").
    job_us: list[int] | UnsetType = UNSET
    # A recorded agent call with an expected answer: what the inline accuracy check reads (AgenticTurn);
    # written only for such calls.
    agentic: AgenticTurn | UnsetType = UNSET

    @property
    def n_inputs(self) -> int:
        """``inputs`` as a number (0 when the line has none)."""
        return self.inputs if isinstance(self.inputs, int) else 0

    @property
    def failed_checks(self) -> list[str]:
        """``quality_failed`` as a list (empty when the line has none)."""
        return self.quality_failed if isinstance(self.quality_failed, list) else []

    @property
    def chunk_lengths(self) -> list[int]:
        """``chunk_chars`` as a list (empty when the line has none)."""
        return self.chunk_chars if isinstance(self.chunk_chars, list) else []

    @property
    def first_tokens(self) -> int | None:
        """``first_chunk_tokens`` as a number (None when the line has none)."""
        return self.first_chunk_tokens if isinstance(self.first_chunk_tokens, int) else None

    @property
    def opened(self) -> list[int] | None:
        """``new_connection`` as a list (None when the request reused a connection)."""
        return self.new_connection if isinstance(self.new_connection, list) else None

    @property
    def tokens_after_first(self) -> int | None:
        """``endpoints_tpot_tokens`` as a number (None when the line has none)."""
        return self.endpoints_tpot_tokens if isinstance(self.endpoints_tpot_tokens, int) else None

    @property
    def templated_output_tokens(self) -> int | None:
        """``endpoints_output_tokens`` as a number (None when the line has none)."""
        return self.endpoints_output_tokens if isinstance(self.endpoints_output_tokens, int) else None

    @property
    def n_merged_gaps(self) -> int:
        """``merged_gaps`` as a number (0 when the line has none)."""
        return self.merged_gaps if isinstance(self.merged_gaps, int) else 0


# The one encoder and decoder of record-log lines (a line is ``LINE_ENCODER.encode(line) + b"\n"``).
LINE_ENCODER = msgspec.json.Encoder()
LINE_DECODER = msgspec.json.Decoder(RecordLine)

# A line as a RecordLine, or in its dict form (a decoded JSON object: ``to_dict``, tests).
LineLike: TypeAlias = RecordLine | Mapping[str, Any]


def as_line(line: LineLike) -> RecordLine:
    """A RecordLine as it is; a mapping converted (missing keys take the defaults; a wrongly typed value
    raises ``msgspec.ValidationError`` naming its key)."""
    if isinstance(line, RecordLine):
        return line
    return msgspec.convert(line, RecordLine)


def to_dict(line: RecordLine) -> dict[str, Any]:
    """The dict form: the keys and values ``json.loads`` gives for the line's bytes."""
    out: dict[str, Any] = msgspec.to_builtins(line)
    return out
