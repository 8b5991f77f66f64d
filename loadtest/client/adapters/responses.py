"""The Responses API (``api: responses``, POST /v1/responses): typed SSE events or one ``response`` object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from loadtest.client.adapters.base import (
    RoutedAdapter,
    done_time,
    json_decoder,
    json_object,
    keep_answer,
)
from loadtest.client.http import Response
from loadtest.client.secrets import snippet

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord


class ResponsesAdapter(RoutedAdapter):
    names: tuple[str, ...] = ("responses",)
    route = "/responses"

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        rec.done_ns = done_time(resp)
        if self.streams(req):
            _stream(client, rec, resp)
        else:
            _whole(client, rec, resp)


def _usage(rec: RequestRecord, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    rec.prompt_tokens_server = usage.get("input_tokens")
    rec.completion_tokens_server = usage.get("output_tokens")
    rec.cached_tokens_server = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    rec.reasoning_tokens_server = (usage.get("output_tokens_details") or {}).get("reasoning_tokens")


def _finish_reason(response: dict[str, Any]) -> str:
    if response.get("status") == "incomplete":
        why = (response.get("incomplete_details") or {}).get("reason")
        return "length" if why == "max_output_tokens" else str(why or "incomplete")
    return "stop"


def _whole(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
    obj = json_object(rec, resp)
    if obj is None:
        return
    if obj.get("object") != "response" or not isinstance(obj.get("output"), list):
        rec.outcome, rec.error = "protocol_error", f"not a Responses API object: {snippet(resp.body)}"
        return
    answer, reasoning = _output_texts(obj["output"])
    keep_answer(client, rec, answer, "", reasoning)
    rec.first_token_ns = rec.first_answer_ns = rec.done_ns
    rec.finish_reason = _finish_reason(obj)
    _usage(rec, obj.get("usage"))
    if obj.get("status") not in ("completed", "incomplete"):
        rec.outcome, rec.error = "stream_error", f"response status {obj.get('status')!r}"
    elif not rec.mark_empty(bool(answer or reasoning), "response"):
        rec.outcome = "ok"


def _output_texts(output: list[Any]) -> tuple[str, str]:
    """(answer text, reasoning text) of a response's output items."""
    answer, reasoning = [], []
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            answer += [c.get("text") or "" for c in item.get("content") or [] if isinstance(c, dict)]
        elif item.get("type") == "reasoning":
            parts = (item.get("content") or []) + (item.get("summary") or [])
            reasoning += [c.get("text") or "" for c in parts if isinstance(c, dict)]
        elif item.get("type") == "function_call":
            answer.append(str(item.get("arguments") or ""))
    return "".join(answer), "".join(reasoning)


@dataclass(slots=True)
class Events:
    """A Responses API stream: each event's decoded data and the time of the read that completed it."""

    items: list[tuple[dict[str, Any] | None, int]] = field(default_factory=list)
    tail: bool = False  # bytes after the last blank line: an event that never ended


def split_events(chunks: list[bytes], times: list[int]) -> Events:
    out = Events()
    buf = b"".join(chunks).replace(b"\r\n", b"\n")
    ends: list[int] = []
    total = 0
    for c in chunks:
        total += len(c.replace(b"\r\n", b"\n"))
        ends.append(total)
    pos, k = 0, 0
    while True:
        j = buf.find(b"\n\n", pos)
        if j < 0:
            out.tail = bool(buf[pos:].strip())
            break
        event = buf[pos:j]
        pos = j + 2
        while k < len(ends) - 1 and ends[k] < pos:
            k += 1
        data = [ln[5:].lstrip(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
        if not data:
            continue
        try:
            obj = json_decoder.decode(b"\n".join(data))
        except msgspec.DecodeError:
            obj = None
        out.items.append((obj if isinstance(obj, dict) or obj is None else None, times[k] if times else 0))
    return out


_TEXT_DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta")
_REASONING_DELTAS = (
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning.delta",
)


def _stream(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
    if "text/event-stream" not in resp.content_type:
        rec.outcome = "protocol_error"
        rec.error = (
            f"expected an SSE stream (text/event-stream), got content-type {resp.content_type or 'none'}"
        )
        return
    ev = split_events(resp.chunks, resp.times)
    answer: list[str] = []
    reasoning: list[str] = []
    complete, error, malformed = None, "", 0
    for obj, t in ev.items:
        if obj is None:
            malformed += 1
            continue
        kind = obj.get("type")
        if kind in _TEXT_DELTAS or kind in _REASONING_DELTAS:
            delta = obj.get("delta")
            if not isinstance(delta, str) or not delta:
                continue
            rec.chunk_ns.append(t)
            rec.first_token_ns = rec.first_token_ns or t
            if kind in _TEXT_DELTAS:
                rec.first_answer_ns = rec.first_answer_ns or t
                answer.append(delta)
            else:
                reasoning.append(delta)
        elif kind in ("response.completed", "response.incomplete"):
            complete = obj.get("response") or {}
        elif kind in ("error", "response.failed"):
            err = obj.get("message") or ((obj.get("response") or {}).get("error") or {}).get("message")
            error = str(err or kind)
    keep_answer(client, rec, "".join(answer), "", "".join(reasoning))
    if complete is not None:
        rec.finish_reason = _finish_reason(complete)
        _usage(rec, complete.get("usage"))
    if error:
        rec.outcome, rec.error = "stream_error", f"error event: {error}"
    elif malformed and not (ev.tail and malformed == 1 and ev.items[-1][0] is None):
        rec.outcome, rec.error = "stream_error", f"{malformed} malformed event(s) in the stream"
    elif resp.broken and complete is None:
        rec.outcome, rec.error = resp.broken_outcome, resp.broken
    elif complete is None:
        rec.outcome, rec.error = "truncated", "stream ended without response.completed"
    elif not ev.items:
        rec.outcome, rec.error = "protocol_error", "SSE stream held no data events"
    elif not rec.mark_empty(bool(answer or reasoning), "stream"):
        rec.outcome = "ok"
