"""The capture line (one JSON object per captured request in capture*.jsonl): its Struct, encoder and decoder."""

from __future__ import annotations

import msgspec


class CaptureLine(msgspec.Struct):
    """One captured request: its ids (the record log's ``id`` and ``wire_id``), the body sent (JSON text,
    exactly as sent, the API key redacted), the answer, tool-call and reasoning text received, how it ended, the
    answer checks it failed. A text longer than the capture's ``max_chars`` is cut there and named in
    ``cut``; ``request_chars`` / ``answer_chars`` are the full lengths."""

    id: str
    wire_id: str | None = None
    scenario: str = "default"
    api: str = "chat"
    outcome: str = "cancelled"
    status: int = 0
    finish_reason: str | None = None
    error: str | None = None
    quality_failed: list[str] = msgspec.field(default_factory=list)
    request: str = ""
    request_chars: int = 0
    answer: str = ""
    answer_chars: int = 0
    tool_calls: str = ""
    reasoning: str = ""  # the reasoning (thinking) text received, when the model sent any
    cut: list[str] = msgspec.field(
        default_factory=list
    )  # which of request, answer, tool_calls, reasoning were cut


CAPTURE_ENCODER = msgspec.json.Encoder()
CAPTURE_DECODER = msgspec.json.Decoder(CaptureLine)
