"""The Anthropic Messages API (``api: messages``, POST /v1/messages): typed SSE events or one Message object."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import msgspec

from loadtest.client.adapters.base import (
    RoutedAdapter,
    done_time,
    is_context_length_error,
    json_encoder,
    keep_answer,
    not_sse,
)
from loadtest.client.http import Response
from loadtest.client.messages_sse import (
    Message,
    MessagesStream,
    Usage,
    finish_reason,
    message_decoder,
    parse_messages_stream,
)
from loadtest.client.secrets import snippet

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord

ANTHROPIC_VERSION = "2023-06-01"  # the API version header every request carries (docs/sources.md §9)


class MessagesAdapter(RoutedAdapter):
    names: ClassVar[tuple[str, ...]] = ("messages",)
    route: ClassVar[str] = "/messages"
    # sent unless the profile's request.headers name the header (its value wins)
    default_headers: ClassVar[tuple[tuple[str, str], ...]] = (("anthropic-version", ANTHROPIC_VERSION),)

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        rec.done_ns = done_time(resp)
        if self.streams(req):
            _stream(client, rec, resp)
        else:
            _whole(client, rec, resp)


def _usage(rec: RequestRecord, u: Usage | None) -> None:
    """Server counts: Messages' input_tokens leaves out the prompt tokens read from or written to the cache,
    so the prompt is their sum (docs/api-surface.md, "Messages")."""
    if u is None:
        return
    if u.input_tokens is not None:
        cached = u.cache_read_input_tokens or 0
        rec.prompt_tokens_server = u.input_tokens + cached + (u.cache_creation_input_tokens or 0)
        rec.cached_tokens_server = u.cache_read_input_tokens
    rec.completion_tokens_server = u.output_tokens


def _whole(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
    if resp.broken:
        rec.outcome, rec.error = resp.broken_outcome, resp.broken
        return
    try:
        msg: Message = message_decoder.decode(resp.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        rec.outcome, rec.error = "protocol_error", f"not a Messages API object: {snippet(resp.body)}"
        return
    if msg.type == "error" or msg.error is not None:
        err = msg.error
        rec.outcome = "stream_error"
        rec.error = f"error in a 200 answer: {err.type if err else ''}: {err.message if err else ''}"
        return
    if msg.type != "message" or msg.content is None:
        rec.outcome, rec.error = "protocol_error", f"not a Messages API object: {snippet(resp.body)}"
        return
    answer, tools, reasoning = [], [], []
    for b in msg.content:
        if b.type == "text":
            answer.append(b.text or "")
        elif b.type == "thinking":
            reasoning.append(b.thinking or "")
        elif b.type == "tool_use":
            tools.append(json_encoder.encode(b.input or {}).decode())
    keep_answer(client, rec, "".join(answer), "".join(tools), "".join(reasoning))
    rec.first_token_ns = rec.first_answer_ns = rec.done_ns
    rec.finish_reason = finish_reason(msg.stop_reason)
    _usage(rec, msg.usage)
    if not rec.mark_empty(bool(rec.answer_text or rec.tool_calls_text or reasoning), "message"):
        rec.outcome = "ok"


def _stream(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
    if not_sse(rec, resp):
        return
    s = parse_messages_stream(resp.chunks, resp.times)
    rec.chunk_ns, rec.chunk_chars = s.chunk_ns, s.chunk_chars
    rec.first_token_ns, rec.first_answer_ns = s.first_token_ns, s.first_answer_ns
    rec.finish_reason = finish_reason(s.stop_reason)
    first = s.first_text if s.chunk_ns else None
    keep_answer(client, rec, s.answer_text, s.tool_text, s.reasoning_text, first)
    _usage(rec, s.usage)
    _stream_outcome(rec, resp, s)


def _stream_outcome(rec: RequestRecord, resp: Response, s: MessagesStream) -> None:
    """An ``error`` event is a stream_error (context_length when it says so); then chat's order of checks."""
    if s.error:
        rec.outcome, rec.error = "stream_error", f"error event: {s.error}"
        if is_context_length_error(s.error):
            rec.outcome = "context_length"
    elif s.malformed:
        bad = snippet(s.malformed_sample, 120)
        rec.outcome, rec.error = "stream_error", f"{s.malformed} malformed event(s) in the stream: {bad}"
    elif resp.broken and not s.complete:
        rec.outcome, rec.error = resp.broken_outcome, resp.broken
    elif not s.complete:
        rec.outcome, rec.error = "truncated", "stream ended without message_stop or a stop_reason"
    elif s.events == 0:
        rec.outcome, rec.error = "protocol_error", "SSE stream held no data events"
    elif not rec.mark_empty(bool(s.answer_text or s.tool_text or s.reasoning_text), "stream"):
        rec.outcome = "ok"
