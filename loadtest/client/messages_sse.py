"""Anthropic Messages streams (typed SSE events) parsed once per request: event times, bulk msgspec decode."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from loadtest.client.sse import event_payloads
from loadtest.client.usage_counts import UsageCounts


class Usage(UsageCounts):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class Block(msgspec.Struct, gc=False):
    """A content block (``content_block_start``'s, or one of a whole message's ``content``)."""

    type: str = ""
    text: str | None = None
    thinking: str | None = None
    input: dict | None = None  # tool_use: the arguments, whole


class Delta(msgspec.Struct, gc=False):
    """``content_block_delta``'s delta (text, thinking, input_json, signature) or ``message_delta``'s."""

    type: str | None = None
    text: str | None = None
    thinking: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None


class ApiError(msgspec.Struct, gc=False):
    type: str | None = None
    message: str | None = None


class Message(msgspec.Struct, gc=False):
    """A Message object: ``message_start``'s (empty content) or a whole answer."""

    type: str = ""
    content: list[Block] | None = None
    stop_reason: str | None = None
    usage: Usage | None = None
    error: ApiError | None = None


class Event(msgspec.Struct, gc=False):
    type: str = ""
    message: Message | None = None
    content_block: Block | None = None
    delta: Delta | None = None
    usage: Usage | None = None
    error: ApiError | str | None = None  # an OpenAI-style frame's error object reads as ApiError too


_bulk = msgspec.json.Decoder(list[Event])
_one = msgspec.json.Decoder(Event)
message_decoder = msgspec.json.Decoder(Message)

# stop_reason → the record's finish reason (chat's names, so figures and SLOs read one vocabulary)
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}


def finish_reason(stop_reason: str | None) -> str | None:
    """chat's finish reason for a Messages ``stop_reason`` (others, e.g. refusal, kept as they are)."""
    return None if stop_reason is None else FINISH_REASONS.get(stop_reason, stop_reason)


@dataclass(slots=True)
class MessagesStream:
    """What one Messages stream said, with the arrival time of every token-carrying delta."""

    chunk_ns: list[int] = field(default_factory=list)
    chunk_chars: list[int] = field(default_factory=list)  # characters of each chunk_ns delta's fragment
    first_text: str = ""  # the first token-carrying delta's fragment
    first_token_ns: int = 0
    first_answer_ns: int = 0
    answer_text: str = ""
    reasoning_text: str = ""
    tool_text: str = ""
    stop_reason: str | None = None
    saw_stop: bool = False  # message_stop
    events: int = 0
    usage: Usage = field(default_factory=Usage)
    error: str = ""
    malformed: int = 0
    malformed_sample: bytes = b""  # the first malformed event's data
    incomplete_tail: bool = False

    @property
    def complete(self) -> bool:
        """Complete when the stream said how it ended (message_stop, or message_delta's stop_reason)."""
        return self.saw_stop or self.stop_reason is not None


def _payloads(res: MessagesStream, chunks: list[bytes], times: list[int]) -> tuple[list[bytes], list[int]]:
    """Each event's data and the time of the read holding its last byte; a proxy's OpenAI-style
    ``[DONE]`` end marker is no event."""
    payloads, payload_times, incomplete = event_payloads(chunks, times)
    res.incomplete_tail = res.incomplete_tail or incomplete
    if b"[DONE]" in payloads:
        keep = [i for i, p in enumerate(payloads) if p != b"[DONE]"]
        payloads, payload_times = [payloads[i] for i in keep], [payload_times[i] for i in keep]
    return payloads, payload_times


def _decode(res: MessagesStream, payloads: list[bytes]) -> list[Event | None]:
    """All payloads in one decode; one by one (None for a bad one) when that fails."""
    try:
        return list(_bulk.decode(b"[" + b",".join(payloads) + b"]"))
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    out: list[Event | None] = []
    for p in payloads:
        try:
            out.append(_one.decode(p))
        except (msgspec.DecodeError, msgspec.ValidationError):
            out.append(None)
            res.malformed += 1
            res.malformed_sample = res.malformed_sample or p
    if res.incomplete_tail and out and out[-1] is None:
        res.malformed -= 1  # an event cut by the end of the stream is truncation, not a malformed server
    return out


def _error_text(err: ApiError | str | None) -> str:
    if isinstance(err, ApiError):
        return f"{err.type or 'error'}: {err.message or ''}".rstrip(": ")
    return str(err or "error event")


_PROMPT_COUNTS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def _usage(res: MessagesStream, u: Usage, final: bool) -> None:
    """Counts seen so far, the later event's winning. Only message_delta's (``final``) output_tokens is the
    answer's (cumulative); message_start's is a placeholder before any token."""
    have = res.usage
    for name in (*_PROMPT_COUNTS, "output_tokens") if final else _PROMPT_COUNTS:
        v = getattr(u, name)
        if v is not None:
            setattr(have, name, v)


def parse_messages_stream(chunks: list[bytes], times: list[int]) -> MessagesStream:
    """Parse the reads of one Messages SSE body; ``times[i]`` is when ``chunks[i]`` arrived."""
    res = MessagesStream()
    if not chunks:
        return res
    payloads, payload_times = _payloads(res, chunks, times)
    decoded = _decode(res, payloads) if payloads else []
    res.events = len(decoded)
    answer: list[str] = []
    reasoning: list[str] = []
    tools: list[str] = []
    add_time = res.chunk_ns.append
    for ev, t in zip(decoded, payload_times, strict=True):
        if ev is None:
            continue
        kind = ev.type
        d = ev.delta
        if kind == "content_block_delta" and d is not None:
            if d.text:
                fragment = d.text
                answer.append(fragment)
                res.first_answer_ns = res.first_answer_ns or t
            elif d.thinking:
                fragment = d.thinking
                reasoning.append(fragment)
            elif d.partial_json:
                fragment = d.partial_json
                tools.append(fragment)  # output tokens are the tool's arguments
                res.first_answer_ns = res.first_answer_ns or t
            else:
                continue  # signature_delta, an empty fragment: no token
            if not res.chunk_ns:
                res.first_text = fragment
            add_time(t)
            res.chunk_chars.append(len(fragment))
        elif kind == "message_start" and ev.message is not None and ev.message.usage is not None:
            _usage(res, ev.message.usage, final=False)
        elif kind == "message_delta":
            if d is not None and d.stop_reason is not None:
                res.stop_reason = d.stop_reason
            if ev.usage is not None:
                _usage(res, ev.usage, final=True)
        elif kind == "message_stop":
            res.saw_stop = True
        elif kind == "error" or ev.error is not None:
            res.error = res.error or _error_text(ev.error)
    if res.chunk_ns:
        res.first_token_ns = res.chunk_ns[0]
    res.answer_text = "".join(answer)
    res.reasoning_text = "".join(reasoning)
    res.tool_text = "".join(tools)
    return res
