"""Server-sent-event parsing of an OpenAI stream, done once per request after the last read.

The hot path only keeps each socket read and its timestamp; this module splits the reads into
events, gives every event the time of the read that completed it, decodes all JSON payloads in
one bulk call, and extracts what the metrics need (REFERENCE.md §5 checklist).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import numpy as np


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: dict | None = None
    completion_tokens_details: dict | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: dict | str | None = None
    object: str | None = None
    message: str | None = None


_bulk_decoder = msgspec.json.Decoder(list[_Chunk])
_one_decoder = msgspec.json.Decoder(_Chunk)


@dataclass(slots=True)
class StreamResult:
    """What one SSE stream said, with the arrival time of every token-carrying event."""

    chunk_ns: list[int] = field(default_factory=list)
    first_token_ns: int = 0
    first_answer_ns: int = 0
    answer_text: str = ""
    reasoning_text: str = ""
    tool_text: str = ""
    finish_reason: str | None = None
    saw_done: bool = False
    events: int = 0
    usage: _Usage | None = None
    error: str = ""
    malformed: int = 0
    incomplete_tail: bool = False

    @property
    def complete(self) -> bool:
        """A stream is complete when it said how it finished ([DONE] or a finish_reason)."""
        return self.saw_done or self.finish_reason is not None


def _normalize_newlines(chunks: list[bytes]) -> list[bytes]:
    """CRLF or CR line endings to LF, per read, keeping a CR split across reads together."""
    out: list[bytes] = []
    carry = b""
    for c in chunks:
        s = carry + c
        carry = b""
        if s.endswith(b"\r"):
            carry, s = b"\r", s[:-1]
        out.append(s.replace(b"\r\n", b"\n").replace(b"\r", b"\n"))
    if carry:
        out[-1] += b"\n"
    return out


def _data_of(event: bytes) -> bytes | None:
    """The data field of one SSE event (None for comments and events without data)."""
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:]
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if not line or line.startswith(b":"):
            continue  # comment / keep-alive
        name, _, value = line.partition(b":")
        if name == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(data) if data else None


def parse_stream(chunks: list[bytes], times: list[int]) -> StreamResult:
    """Parse the reads of one SSE response body; ``times[i]`` is when ``chunks[i]`` arrived."""
    res = StreamResult()
    if not chunks:
        return res
    if any(b"\r" in c for c in chunks):
        chunks = _normalize_newlines(chunks)
    buf = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    parts = buf.split(b"\n\n")
    tail = parts.pop()  # bytes after the last blank line: an event that never ended
    if tail.strip():
        parts.append(tail)
        res.incomplete_tail = True
    # Time of each event = arrival of the read holding its last byte.
    if len(chunks) == 1:
        ev_times = [times[0]] * len(parts)
    else:
        ends = np.cumsum(np.fromiter((len(p) + 2 for p in parts), dtype=np.int64, count=len(parts))) - 1
        chunk_ends = np.cumsum(np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks)))
        idx = np.minimum(np.searchsorted(chunk_ends, ends, side="right"), len(chunks) - 1)
        ev_times = np.asarray(times, dtype=np.int64)[idx].tolist()

    payloads: list[bytes] = []
    payload_times: list[int] = []
    for part, t in zip(parts, ev_times, strict=True):
        data = _data_of(part)
        if data is None:
            continue
        if data == b"[DONE]":
            res.saw_done = True
            continue
        payloads.append(data)
        payload_times.append(t)
    res.events = len(payloads)
    if not payloads:
        return res
    try:
        decoded: list[_Chunk | None] = list(_bulk_decoder.decode(b"[" + b",".join(payloads) + b"]"))
    except (msgspec.DecodeError, msgspec.ValidationError):
        decoded = []
        for p in payloads:
            try:
                decoded.append(_one_decoder.decode(p))
            except (msgspec.DecodeError, msgspec.ValidationError):
                decoded.append(None)
                res.malformed += 1
    if res.incomplete_tail and decoded[-1] is None:
        # A JSON event cut by the end of the stream is truncation, not a malformed server.
        res.malformed -= 1

    answer: list[str] = []
    reasoning: list[str] = []
    tools: list[str] = []
    chunk_ns = res.chunk_ns
    for ch, t in zip(decoded, payload_times, strict=True):
        if ch is None:
            continue
        if ch.error is not None or ch.object == "error":
            err = ch.error
            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err or ch.message or "")
            res.error = res.error or (msg or "error frame")
            continue
        if ch.usage is not None:
            res.usage = ch.usage
        if not ch.choices:
            continue
        token = False
        for c in ch.choices:
            d = c.delta
            if d is not None:
                if d.content:
                    answer.append(d.content)
                    token = True
                    if not res.first_answer_ns:
                        res.first_answer_ns = t
                r = d.reasoning_content or d.reasoning
                if r:
                    reasoning.append(r)
                    token = True
                if d.tool_calls:
                    for tc in d.tool_calls:
                        fn = tc.get("function") or {}
                        frag = (fn.get("name") or "") + (fn.get("arguments") or "")
                        if frag:
                            tools.append(frag)
                            token = True
            elif c.text:
                answer.append(c.text)
                token = True
                if not res.first_answer_ns:
                    res.first_answer_ns = t
            if c.finish_reason is not None:
                res.finish_reason = c.finish_reason
        if token:
            chunk_ns.append(t)
    if chunk_ns:
        res.first_token_ns = chunk_ns[0]
    res.answer_text = "".join(answer)
    res.reasoning_text = "".join(reasoning)
    res.tool_text = "".join(tools)
    return res
