"""The Responses API (``api: responses``, POST /v1/responses): typed SSE events or one ``response`` object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from loadtest.client.adapters.base import (
    RoutedAdapter,
    count_at,
    done_time,
    json_decoder,
    json_object,
    keep_answer,
    list_at,
    not_sse,
    obj_at,
    text_at,
)
from loadtest.client.http import Response
from loadtest.client.secrets import snippet
from loadtest.client.sse import OffShape, event_payloads, read_tool_call

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord


class ResponsesAdapter(RoutedAdapter):
    names: ClassVar[tuple[str, ...]] = ("responses",)
    route: ClassVar[str] = "/responses"

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
    rec.prompt_tokens_server = count_at(usage, "input_tokens")
    rec.completion_tokens_server = count_at(usage, "output_tokens")
    rec.cached_tokens_server = count_at(obj_at(usage, "input_tokens_details"), "cached_tokens")
    rec.reasoning_tokens_server = count_at(obj_at(usage, "output_tokens_details"), "reasoning_tokens")


def _finish_reason(response: dict[str, Any]) -> str:
    if response.get("status") == "incomplete":
        why = obj_at(response, "incomplete_details").get("reason")
        return "length" if why == "max_output_tokens" else str(why or "incomplete")
    return "stop"


def _whole(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
    obj = json_object(rec, resp)
    if obj is None:
        return
    if obj.get("object") != "response" or not isinstance(obj.get("output"), list):
        rec.outcome, rec.error = "protocol_error", f"not a Responses API object: {snippet(resp.body)}"
        return
    off = OffShape()
    answer, reasoning = _output_texts(obj["output"], off)
    keep_answer(client, rec, answer, "", reasoning)
    rec.first_token_ns = rec.first_answer_ns = rec.done_ns
    rec.finish_reason = _finish_reason(obj)
    _usage(rec, obj.get("usage"))
    if off.count:
        rec.outcome, rec.error = "protocol_error", off.describe()
    elif obj.get("status") not in ("completed", "incomplete"):
        rec.outcome, rec.error = "stream_error", f"response status {obj.get('status')!r}"
    elif not rec.mark_empty(bool(answer or reasoning), "response"):
        rec.outcome = "ok"


def _output_texts(output: list[Any], off: OffShape) -> tuple[str, str]:
    """(answer text, reasoning text) of a response's output items; a function call's arguments are read
    as chat's tool calls are (``read_tool_call``: a string, else its JSON text noted in ``off``)."""
    answer: list[str] = []
    reasoning: list[str] = []
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            answer += [text_at(c, "text") for c in list_at(item, "content")]
        elif item.get("type") == "reasoning":
            parts = list_at(item, "content") + list_at(item, "summary")
            reasoning += [text_at(c, "text") for c in parts]
        elif item.get("type") == "function_call":
            answer.append(read_tool_call({"function": item}, off)[0])
    return "".join(answer), "".join(reasoning)


@dataclass(slots=True)
class Events:
    """A Responses API stream: each event's decoded data (None: not a JSON object) and the time of the
    read that completed it."""

    items: list[tuple[dict[str, Any] | None, int]] = field(default_factory=list)
    tail: bool = False  # bytes after the last blank line: an event that never ended
    bad: bytes = b""  # the first event that is not a JSON object


def split_events(chunks: list[bytes], times: list[int]) -> Events:
    payloads, payload_times, tail = event_payloads(chunks, times)
    out = Events(tail=tail)
    for data, t in zip(payloads, payload_times, strict=True):
        try:
            obj = json_decoder.decode(data)
        except msgspec.DecodeError:
            obj = None
        if not isinstance(obj, dict):
            obj, out.bad = None, out.bad or data
        out.items.append((obj, t))
    return out


_TEXT_DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta")
_REASONING_DELTAS = (
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning.delta",
)


def _stream(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
    if not_sse(rec, resp):
        return
    ev = split_events(resp.chunks, resp.times)
    answer: list[str] = []
    reasoning: list[str] = []
    complete, error, malformed = None, "", 0
    first: str | None = None
    for obj, t in ev.items:
        if obj is None:
            malformed += 1
            continue
        kind = obj.get("type")
        if kind in _TEXT_DELTAS or kind in _REASONING_DELTAS:
            delta = obj.get("delta")
            if not isinstance(delta, str) or not delta:
                continue
            if not rec.chunk_ns:
                first = delta
            rec.chunk_ns.append(t)
            rec.chunk_chars.append(len(delta))
            rec.first_token_ns = rec.first_token_ns or t
            if kind in _TEXT_DELTAS:
                rec.first_answer_ns = rec.first_answer_ns or t
                answer.append(delta)
            else:
                reasoning.append(delta)
        elif kind in ("response.completed", "response.incomplete"):
            complete = obj_at(obj, "response")
        elif kind in ("error", "response.failed"):
            err = obj.get("message") or obj_at(obj_at(obj, "response"), "error").get("message")
            error = str(err or kind)
    keep_answer(client, rec, "".join(answer), "", "".join(reasoning), first)
    if complete is not None:
        rec.finish_reason = _finish_reason(complete)
        _usage(rec, complete.get("usage"))
    if error:
        rec.outcome, rec.error = "stream_error", f"error event: {error}"
    elif malformed and not (ev.tail and malformed == 1 and ev.items[-1][0] is None):
        bad = snippet(ev.bad, 120)
        rec.outcome, rec.error = "stream_error", f"{malformed} malformed event(s) in the stream: {bad}"
    elif resp.broken and complete is None:
        rec.outcome, rec.error = resp.broken_outcome, resp.broken
    elif complete is None:
        rec.outcome, rec.error = "truncated", "stream ended without response.completed"
    elif not ev.items:
        rec.outcome, rec.error = "protocol_error", "SSE stream held no data events"
    elif not rec.mark_empty(bool(answer or reasoning), "stream"):
        rec.outcome = "ok"
