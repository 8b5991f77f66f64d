"""Server-sent-event parsing of an OpenAI stream, done once per request after the last read.

The hot path only keeps each socket read and its timestamp; this module splits the reads into
events, gives every event the time of the read that completed it, decodes all JSON payloads in
one bulk call, and extracts what the metrics need (docs/sources.md §5 checklist).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from loadtest.client.secrets import snippet
from loadtest.client.stream_chunk import Chunk, Delta, Usage

_BOM = b"\xef\xbb\xbf"
_json = msgspec.json.Encoder()
_bulk_decoder = msgspec.json.Decoder(list[Chunk])
_one_decoder = msgspec.json.Decoder(Chunk)


class OffShape:
    """Answers a parser read although they are off the API's documented shape (a tool call's
    ``arguments`` as a JSON object, ``function`` as a string, a tool call that is not an object): how
    many, and the first kind seen. Any of them makes the request a ``protocol_error``.

    A plain class with its defaults in the class body, as StreamResult."""

    count: int = 0
    first: str = ""
    sample: bytes = b""  # the first such value, as JSON

    def add(self, what: str, value: Any) -> None:
        self.count += 1
        if not self.first:
            self.first, self.sample = what, _json.encode(value)

    def describe(self) -> str:
        """One sentence for the record's error, with the value that was off (redacted, bounded)."""
        more = f" ({self.count} times)" if self.count > 1 else ""
        return f"answer off the API's shape: {self.first}{more}: {snippet(self.sample, 120)}"


class StreamResult:
    """What one SSE stream said, with the arrival time of every token-carrying event.

    A plain class, not a dataclass: the compiled build sets the class body's defaults in C, where a
    dataclass's ``__init__`` (written by the dataclasses module) would run as Python, field by field."""

    chunk_ns: list[int]
    chunk_chars: list[int]  # characters of each chunk_ns event's fragments
    first_text: str = ""  # the first token-carrying event's fragments (reasoning, text, tool-call arguments)
    tool_calls: list[dict[str, Any]]  # each call's name and arguments text
    first_token_ns: int = 0
    first_answer_ns: int = 0
    answer_text: str = ""
    reasoning_text: str = ""
    tool_text: str = ""
    finish_reason: str | None = None
    saw_done: bool = False
    events: int = 0
    usage: Usage | None = None
    error: str = ""
    malformed: int = 0
    malformed_sample: bytes = b""  # the first malformed event's data
    incomplete_tail: bool = False
    off_shape: OffShape

    def __init__(self) -> None:
        self.chunk_ns, self.chunk_chars, self.tool_calls, self.off_shape = [], [], [], OffShape()

    @property
    def complete(self) -> bool:
        """A stream is complete when it said how it finished ([DONE] or a finish_reason)."""
        return self.saw_done or self.finish_reason is not None


def normalize_newlines(chunks: list[bytes]) -> list[bytes]:
    """CRLF, CR or LF line endings (WHATWG HTML §9.2.6, docs/sources.md §5) to LF, per read. A line ends
    at the read holding its CR: a LF opening the next read right after that CR is the second half of a
    CRLF and is dropped (the read may become empty; it keeps its place and time)."""
    out: list[bytes] = []
    after_cr = False
    for c in chunks:
        if after_cr and c.startswith(b"\n"):
            c = c[1:]
        after_cr = c.endswith(b"\r")
        out.append(c.replace(b"\r\n", b"\n").replace(b"\r", b"\n"))
    return out


def data_of(event: bytes) -> bytes | None:
    """The data of one SSE event; None for comments, events without data and an empty data buffer,
    which WHATWG dispatches nothing for (a ``data:`` heartbeat)."""
    if event.startswith(b"data: ") and b"\n" not in event:
        return _dispatched(event[6:])
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if not line or line.startswith(b":"):
            continue  # comment / keep-alive
        name, _, value = line.partition(b":")
        if name == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    return _dispatched(b"\n".join(data))


def _dispatched(data: bytes) -> bytes | None:
    """An event's data, or None when it holds nothing (WHATWG: an empty data buffer dispatches nothing;
    blanks are read the same way, as no JSON could be in them)."""
    return data if data and not data.isspace() else None


def event_payloads(chunks: list[bytes], times: list[int]) -> tuple[list[bytes], list[int], bool]:
    """Each dispatched event's data and the time of the read holding its last byte, and whether bytes
    after the last blank line were kept as an event that never ended: for any SSE body (a leading
    byte-order mark, CR/CRLF endings, ``event:`` lines, comments, multi-line data). ``[DONE]`` is kept."""
    if not chunks:
        return [], [], False
    chunks, buf = _body(chunks)
    return _payloads(chunks, times, buf)


def _body(chunks: list[bytes]) -> tuple[list[bytes], bytes]:
    """The reads without a leading byte-order mark (WHATWG: not part of the stream) and with LF line
    endings, and the whole body they make."""
    if chunks[0].startswith(_BOM):
        chunks = [chunks[0][len(_BOM) :], *chunks[1:]]
    buf = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if b"\r" in buf:
        chunks = normalize_newlines(chunks)
        buf = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return chunks, buf


def _payloads(chunks: list[bytes], times: list[int], buf: bytes) -> tuple[list[bytes], list[int], bool]:
    """``event_payloads`` of reads that ``_body`` prepared (``buf``: their whole body)."""
    parts, ev_times, incomplete = split_events(chunks, times, buf)
    payloads: list[bytes] = []
    payload_times: list[int] = []
    for part, t in zip(parts, ev_times, strict=True):
        # the typed-event shape, "event: NAME\ndata: {...}", without the general field reader
        nl = part.find(b"\n")
        if part.startswith(b"event: ") and part.startswith(b"data: ", nl + 1) and b"\n" not in part[nl + 1 :]:
            data: bytes | None = _dispatched(part[nl + 7 :])
        else:
            data = data_of(part)
        if data is not None:
            payloads.append(data)
            payload_times.append(t)
    return payloads, payload_times, incomplete


def split_events(chunks: list[bytes], times: list[int], buf: bytes) -> tuple[list[bytes], list[int], bool]:
    """The body's events (split at blank lines), the time of the read holding each one's last byte,
    and whether bytes after the last blank line were kept as an event that never ended."""
    parts = buf.split(b"\n\n")
    tail = parts.pop()  # bytes after the last blank line: an event that never ended
    incomplete = bool(tail.strip())
    if incomplete:
        parts.append(tail)
    if len(chunks) == 1:
        return parts, [times[0]] * len(parts), incomplete
    ends = np.cumsum(np.fromiter((len(p) + 2 for p in parts), dtype=np.int64, count=len(parts))) - 1
    chunk_ends = np.cumsum(np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks)))
    idx = np.minimum(np.searchsorted(chunk_ends, ends, side="right"), len(chunks) - 1)
    ev_times: list[int] = np.asarray(times, dtype=np.int64)[idx].tolist()
    return parts, ev_times, incomplete


def _general_split(
    res: StreamResult, chunks: list[bytes], times: list[int], buf: bytes
) -> tuple[list[Chunk | None], list[int]]:
    """Any valid SSE: comments, multi-line data, other fields, an unterminated last event, bad JSON."""
    payloads, payload_times, res.incomplete_tail = _payloads(chunks, times, buf)
    if b"[DONE]" in payloads:  # the stream's end: anything after it is not part of the answer
        res.saw_done = True
        end = payloads.index(b"[DONE]")
        del payloads[end:], payload_times[end:]
    if not payloads:
        return [], []
    try:
        decoded: list[Chunk | None] = list(_bulk_decoder.decode(b"[" + b",".join(payloads) + b"]"))
    except (msgspec.DecodeError, msgspec.ValidationError):
        decoded = []
        for p in payloads:
            try:
                decoded.append(_one_decoder.decode(p))
            except (msgspec.DecodeError, msgspec.ValidationError):
                decoded.append(None)
                res.malformed += 1
                res.malformed_sample = res.malformed_sample or p
        if res.incomplete_tail and decoded[-1] is None:
            # A JSON event cut by the end of the stream is truncation, not a malformed server.
            res.malformed -= 1
    return decoded, payload_times


_DONE_EVENT = b"data: [DONE]\n\n"
_PREFIX = b"data: "
_NEXT_EVENT = b"\n\n" + _PREFIX  # a blank line, then the next event's prefix
SMALL_BODY = 2048  # bytes: a body up to this size is split without numpy (its set-up costs more there)
_PREFIX_SPAN = np.arange(len(_PREFIX), dtype=np.int64)
_SPACE = 32  # a prefix is blanked to spaces: same length, so byte offsets do not move


def _fast_split(
    joined: list[bytes], need_ends: bool
) -> tuple[list[Chunk], np.ndarray | list[int], bool] | None:
    """The common shape, in a few C-speed passes: every event one ``data: `` line, LF endings.

    ``joined`` holds the whole body as its one item, which this takes (so the caller keeps no copy).
    One pass finds the newlines; the line starts are checked for the prefix and blanked in one copy
    (numpy indexing, per event, not per byte); the joined body is dropped before the payloads are decoded as
    JSON lines in one call, so a huge stream holds its reads, one blanked copy and the decoded events
    at once, no more. Returns the decoded events, the byte offset where each event ends and whether
    [DONE] ended the stream; None for any other shape (the general path handles it). ``need_ends``:
    whether the ends are wanted (a body of one read gives every event that read's time); a short
    body's are then not looked for.
    """
    buf = joined.pop()
    saw_done = buf.endswith(_DONE_EVENT)
    size = len(buf) - len(_DONE_EVENT) if saw_done else len(buf)
    if size <= 0 or not buf.startswith(_PREFIX):
        return None
    if size <= SMALL_BODY:
        return _small_split(buf, size, saw_done, need_ends)
    newlines = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8, count=size) == 10)
    n_events = len(newlines) // 2
    # Every newline is half of an event terminator: one line per event, nothing unterminated.
    if n_events == 0 or len(newlines) != 2 * n_events or newlines[-1] != size - 1:
        return None
    ends = newlines[1::2]
    if (ends - newlines[0::2] != 1).any():
        return None
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    prefix_at = (starts[:, None] + _PREFIX_SPAN).ravel()
    if prefix_at[-1] >= size:  # the last line is shorter than the prefix
        return None
    blanked = bytearray(memoryview(buf)[:size])
    del buf, newlines
    view = np.frombuffer(blanked, dtype=np.uint8)
    if view[prefix_at].tobytes() != _PREFIX * n_events:
        return None  # a line that is not one ``data: `` field: a comment, another field
    view[prefix_at] = _SPACE
    del view
    try:
        decoded = _one_decoder.decode_lines(blanked)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # bad JSON: let the general path say which
    if len(decoded) != n_events:
        return None  # an empty data line (a heartbeat) decodes to nothing: the general path skips it
    return decoded, ends, saw_done


def _small_split(
    buf: bytes, size: int, saw_done: bool, need_ends: bool
) -> tuple[list[Chunk], list[int], bool] | None:
    """_fast_split's shape for a short body (a few events) in a few bytes scans, no array set-up (which
    costs more than such a body's whole parse). ``buf`` starts with the prefix (checked by the caller).
    The body must end with a blank line; split at each blank line followed by the prefix, its events'
    payloads are the parts, joined into one JSON array and decoded in one call. Every event is then
    one ``data: `` line: a part holding a newline (a comment, another field, a second line, a blank
    line not followed by the prefix) fails the check, and an empty payload (a heartbeat) or one
    that is not an event object fails the decode; each goes to the general path, which says which."""
    if not buf.endswith(b"\n\n", 0, size):
        return None
    parts = buf[len(_PREFIX) : size - 2].split(_NEXT_EVENT)
    joined = b"[" + b",".join(parts) + b"]"
    if joined.find(b"\n") >= 0:
        return None
    try:
        decoded = _bulk_decoder.decode(joined)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if len(decoded) != len(parts):
        return None  # "[]": the one event's payload was empty
    ends: list[int] = []  # where each event's blank line ends
    at = buf.find(b"\n\n", 0, size) if need_ends else -1
    while at >= 0:
        ends.append(at + 1)
        at = buf.find(b"\n\n", at + 2, size)
    return decoded, ends, saw_done


def parse_stream(chunks: list[bytes], times: list[int]) -> StreamResult:
    """Parse the reads of one SSE response body; ``times[i]`` is when ``chunks[i]`` arrived."""
    res = StreamResult()
    if not chunks:
        return res
    chunks, buf = _body(chunks)
    decoded: Sequence[Chunk | None]  # the general path leaves None for a payload that is not JSON
    joined = [buf]
    del buf
    fast = _fast_split(joined, need_ends=len(chunks) > 1)
    if fast is not None:
        decoded, ends, res.saw_done = fast
        if len(chunks) == 1:
            payload_times = [times[0]] * len(decoded)
        else:
            chunk_ends = np.cumsum(np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks)))
            idx = np.searchsorted(chunk_ends, ends, side="right")
            payload_times = np.asarray(times, dtype=np.int64)[idx].tolist()
    else:
        buf = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        decoded, payload_times = _general_split(res, chunks, times, buf)
    res.events = len(decoded)
    if not decoded:
        return res
    answer: list[str] = []
    reasoning: list[str] = []
    tools: list[str] = []
    calls: dict[int, list[str]] = {}
    add_answer = answer.append
    add_time = res.chunk_ns.append
    add_chars = res.chunk_chars.append
    first_answer = 0
    need_first = True
    if len(payload_times) != len(decoded):
        raise ValueError(f"{len(decoded)} events but {len(payload_times)} event times")
    for i in range(len(decoded)):  # indexed: compiled, a C loop (zip is an iterator object)
        ch = decoded[i]
        if ch is None:
            continue
        t = payload_times[i]
        choices = ch.choices
        if choices:
            token = False
            chars = 0
            for c in choices:
                d = c.delta
                if d is not None:
                    content = d.content
                    if content:
                        add_answer(content)
                        chars += len(content)
                        token = True
                        if not first_answer:
                            first_answer = t
                    if d.reasoning_content or d.reasoning or d.tool_calls:
                        carried, n = _reasoning_and_tools(d, reasoning, tools, calls, res.off_shape)
                        token = carried or token
                        chars += n
                elif c.text:
                    add_answer(c.text)
                    chars += len(c.text)
                    token = True
                    if not first_answer:
                        first_answer = t
                if c.finish_reason is not None:
                    res.finish_reason = c.finish_reason
            if token:
                add_time(t)
                add_chars(chars)
                if need_first:  # events before it carried nothing: the lists hold its fragments
                    res.first_text = "".join(reasoning) + "".join(answer) + "".join(tools)
                    need_first = False
        if ch.usage is not None:
            res.usage = ch.usage
        if ch.error is not None or (ch.message is not None and choices is None):
            err = ch.error
            msg = err.get("message") or err if isinstance(err, dict) else err or ch.message or ""
            res.error = res.error or (str(msg) or "error frame")
    if res.chunk_ns:
        res.first_token_ns = res.chunk_ns[0]
    res.tool_calls = [{"name": name, "arguments": "".join(args)} for name, *args in calls.values()]
    res.first_answer_ns = first_answer
    res.answer_text = "".join(answer)
    res.reasoning_text = "".join(reasoning)
    res.tool_text = "".join(tools)
    return res


def _reasoning_and_tools(
    d: Delta, reasoning: list[str], tools: list[str], calls: dict[int, list[str]], off: OffShape
) -> tuple[bool, int]:
    """Collect reasoning text and tool-call fragments of one delta (each call's name and arguments in
    ``calls``, by its index); whether any was non-empty, and the characters they held."""
    token = False
    chars = 0
    r = d.reasoning_content or d.reasoning
    if r:
        reasoning.append(r)
        chars += len(r)
        token = True
    for tc in d.tool_calls or ():
        args, carried = read_tool_call(tc, off)
        if args:
            tools.append(args)  # output tokens are the arguments; the name is a header, like the role
            chars += len(args)
        if carried:
            _add_call(calls, tc, args)
        token = token or carried  # the call's first fragment is the first token the client sees
    return token, chars


def _add_call(calls: dict[int, list[str]], tc: dict[str, Any], args: str) -> None:
    """One streamed tool-call fragment into ``calls``: index → [name, arguments pieces...]."""
    index = tc.get("index")
    key = index if isinstance(index, int) else len(calls)
    fn = tc.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    call = calls.setdefault(key, [""])
    if isinstance(name, str) and name:
        call[0] = name
    if args:
        call.append(args)


def read_tool_call(tc: Any, off: OffShape) -> tuple[str, bool]:
    """A tool call's (or a streamed fragment's) arguments text, and whether it carried a name or arguments.

    ``arguments`` is a string (OpenAI's chat API); sent as JSON of another type (llama.cpp and TGI
    have sent an object) it is read as its JSON text and noted in ``off``, as are a ``function`` that
    is not an object and a tool call that is not an object."""
    if not isinstance(tc, dict):
        off.add(f"a tool call that is a JSON {_json_type(tc)}, not an object", tc)
        return "", False
    fn = tc.get("function")
    if fn is None:
        return "", False
    if not isinstance(fn, dict):
        off.add(f"a tool call's function that is a JSON {_json_type(fn)}, not an object", fn)
        return "", bool(fn)
    args = fn.get("arguments")
    if args is None or isinstance(args, str):
        text = args or ""
    else:
        off.add(f"tool call arguments as a JSON {_json_type(args)}, not a string", args)
        text = _json.encode(args).decode()
    return text, bool(text or fn.get("name"))


def _json_type(value: Any) -> str:
    """The JSON type name of a decoded value."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"
