"""The ``choices`` shape's answers (chat completions, completions, raw replay of either) read into a record:
a streamed one (SSE chunks, a finish reason, [DONE], usage) and a whole one (one chat.completion or
text_completion object). Compiled with the rest of a request's path (loadtest/compiled.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from loadtest.client.adapters.base import (
    count_at,
    done_time,
    is_context_length_error,
    json_decoder,
    keep_answer,
    list_at,
    not_sse,
    obj_at,
    text_at,
)
from loadtest.client.http import Response
from loadtest.client.secrets import snippet
from loadtest.client.sse import OffShape, parse_stream, read_tool_call

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient
    from loadtest.client.record import RequestRecord


def classify_choices_stream(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
    """A streamed answer of the ``choices`` shape: SSE chunks, a finish reason, [DONE], usage."""
    if not_sse(rec, resp):
        return
    s = parse_stream(resp.chunks, resp.times)
    rec.chunk_ns = s.chunk_ns
    rec.chunk_chars = s.chunk_chars
    rec.first_token_ns = s.first_token_ns
    rec.first_answer_ns = s.first_answer_ns
    rec.finish_reason = s.finish_reason
    rec.done_ns = done_time(resp)
    first = s.first_text if s.chunk_ns else None
    keep_answer(client, rec, s.answer_text, s.tool_text, s.reasoning_text, first, s.tool_calls)
    if s.usage is not None:
        u = s.usage
        rec.prompt_tokens_server = u.prompt_tokens
        rec.completion_tokens_server = u.completion_tokens
        if u.prompt_tokens_details:
            rec.cached_tokens_server = count_at(u.prompt_tokens_details, "cached_tokens")
        if u.completion_tokens_details:
            rec.reasoning_tokens_server = count_at(u.completion_tokens_details, "reasoning_tokens")
    if s.error:
        rec.outcome, rec.error = "stream_error", f"error frame: {s.error}"
    elif s.malformed:
        bad = snippet(s.malformed_sample, 120)
        rec.outcome, rec.error = "stream_error", f"{s.malformed} malformed event(s) in the stream: {bad}"
    elif s.off_shape.count:
        rec.outcome, rec.error = "protocol_error", s.off_shape.describe()
    elif resp.broken and not s.complete:
        rec.outcome, rec.error = resp.broken_outcome, resp.broken
    elif not s.complete:
        rec.outcome = "truncated"
        rec.error = "stream ended without finish_reason or [DONE]"
    elif s.events == 0:
        rec.outcome, rec.error = "protocol_error", "SSE stream held no data events"
    elif not rec.mark_empty(bool(s.answer_text or s.tool_text or s.reasoning_text), "stream"):
        rec.outcome = "ok"
    if rec.outcome == "stream_error" and is_context_length_error(rec.error):
        rec.outcome = "context_length"


def classify_choices_object(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
    """A whole answer of the ``choices`` shape (chat.completion or text_completion): the body is the
    first (and last) token."""
    rec.done_ns = done_time(resp)
    if resp.broken:
        rec.outcome, rec.error = resp.broken_outcome, resp.broken
        return
    try:
        obj = json_decoder.decode(resp.body)
    except msgspec.DecodeError:
        rec.outcome, rec.error = "protocol_error", f"response is not JSON: {snippet(resp.body)}"
        return
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
        rec.outcome = "stream_error" if isinstance(obj, dict) and "error" in obj else "protocol_error"
        rec.error = f"not an OpenAI completion object: {snippet(resp.body)}"
        return
    text, reasoning, tools = "", "", ""
    calls: list[dict[str, Any]] = []
    off = OffShape()
    for c in obj["choices"]:
        msg = obj_at(c, "message")
        text += text_at(msg, "content") + text_at(c, "text")
        reasoning += text_at(msg, "reasoning_content") or text_at(msg, "reasoning")
        for call in list_at(msg, "tool_calls"):
            args = read_tool_call(call, off)[0]
            tools += args
            calls.append({"name": text_at(obj_at(call, "function"), "name"), "arguments": args})
        rec.finish_reason = text_at(c, "finish_reason") or rec.finish_reason
    rec.first_token_ns = rec.done_ns
    rec.first_answer_ns = rec.done_ns
    keep_answer(client, rec, text, tools, reasoning, calls=calls)
    usage = obj_at(obj, "usage")
    rec.prompt_tokens_server = count_at(usage, "prompt_tokens")
    rec.completion_tokens_server = count_at(usage, "completion_tokens")
    rec.cached_tokens_server = count_at(obj_at(usage, "prompt_tokens_details"), "cached_tokens")
    rec.reasoning_tokens_server = count_at(obj_at(usage, "completion_tokens_details"), "reasoning_tokens")
    if off.count:
        rec.outcome, rec.error = "protocol_error", off.describe()
    elif not rec.mark_empty(bool(text or reasoning or tools) or _has_tool_call(obj), "answer"):
        rec.outcome = "ok"


def _has_tool_call(obj: dict[str, Any]) -> bool:
    return any(list_at(obj_at(c, "message"), "tool_calls") for c in list_at(obj, "choices"))
