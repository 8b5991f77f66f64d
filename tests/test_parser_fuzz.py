"""No answer a server sends makes a parser raise: SSE bodies of arbitrary bytes split at arbitrary reads,
events of well-formed JSON in the wrong shapes (chat chunks, Messages events, Responses events, tool
calls) and whole JSON answers of every API are read into a record with one endpoint outcome, never
``cancelled``; and a stream's token times do not depend on its line endings (WHATWG: CR, LF, CRLF)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.client import sse
from loadtest.client.adapters import adapter_for
from loadtest.client.adapters.base import classify_http
from loadtest.client.http import Response
from loadtest.client.messages_sse import parse_messages_stream
from loadtest.client.openai import OpenAIClient, PreparedRequest
from loadtest.client.record import OUTCOMES, RequestRecord
from loadtest.client.sse import parse_stream
from loadtest.tokens.tokenizer import get_tokenizer

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLIENT = OpenAIClient("http://127.0.0.1:9", None, get_tokenizer("llama3"))  # never connects: reads only
SSE = {"content-type": "text/event-stream"}
JSON = {"content-type": "application/json"}
# Keys the readers look for, so that generated objects often take the shapes they read.
KEYS = [
    "choices",
    "delta",
    "content",
    "text",
    "tool_calls",
    "function",
    "arguments",
    "name",
    "finish_reason",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "completion_tokens_details",
    "reasoning_tokens",
    "reasoning_content",
    "reasoning",
    "error",
    "message",
    "object",
    "type",
    "index",
    "response",
    "output",
    "status",
    "delta",
    "content_block",
    "stop_reason",
    "input_tokens",
    "output_tokens",
    "partial_json",
    "thinking",
    "data",
    "embedding",
    "results",
    "relevance_score",
    "input_tokens_details",
    "output_tokens_details",
    "incomplete_details",
    "summary",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["stop", "length", "tool_calls", "message", "response.completed", "[DONE]"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=5),
    ),
    max_leaves=20,
)


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(value, json_values)


function_like = _maybe(
    st.fixed_dictionaries({}, optional={"name": _maybe(st.text(max_size=8)), "arguments": json_values})
)
tool_call_like = _maybe(st.fixed_dictionaries({}, optional={"index": json_values, "function": function_like}))
delta_like = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "content": _maybe(st.text(max_size=8)),
            "reasoning_content": json_values,
            "tool_calls": _maybe(st.lists(tool_call_like, max_size=3)),
        },
    )
)
choice_like = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "delta": delta_like,
            "message": delta_like,
            "text": json_values,
            "finish_reason": json_values,
        },
    )
)
usage_like = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": json_values,
            "completion_tokens": json_values,
            "prompt_tokens_details": _maybe(st.fixed_dictionaries({"cached_tokens": json_values})),
            "input_tokens": json_values,
            "output_tokens": json_values,
        },
    )
)
chat_chunk_like = st.fixed_dictionaries(
    {},
    optional={
        "choices": _maybe(st.lists(choice_like, max_size=3)),
        "usage": usage_like,
        "error": json_values,
        "message": json_values,
        "object": json_values,
    },
)
typed_event_like = st.fixed_dictionaries(
    {
        "type": _maybe(
            st.sampled_from(
                [
                    "message_start",
                    "content_block_delta",
                    "message_delta",
                    "message_stop",
                    "error",
                    "response.output_text.delta",
                    "response.reasoning_text.delta",
                    "response.completed",
                    "response.incomplete",
                    "response.failed",
                ]
            )
        )
    },
    optional={
        "delta": _maybe(delta_like),
        "message": json_values,
        "response": _maybe(
            st.fixed_dictionaries(
                {}, optional={"status": json_values, "usage": usage_like, "error": json_values}
            )
        ),
        "usage": usage_like,
        "error": json_values,
        "content_block": json_values,
    },
)
line_ends = st.sampled_from([b"\n", b"\r", b"\r\n"])


@st.composite
def sse_body(draw: st.DrawFn, events: st.SearchStrategy[Any]) -> bytes:
    """Events as SSE, each with its own line ending, some heartbeats, comments and [DONE]s among them."""
    out = b""
    for obj in draw(st.lists(events, max_size=6)):
        nl = draw(line_ends)
        kind = draw(st.sampled_from(["json", "json", "json", "heartbeat", "comment", "done", "named"]))
        if kind == "heartbeat":
            out += draw(st.sampled_from([b"data:", b"data: "])) + nl + nl
        elif kind == "comment":
            out += b": keep-alive" + nl + nl
        elif kind == "done":
            out += b"data: [DONE]" + nl + nl
        else:
            name = b"event: " + str(obj.get("type", "x")).encode()[:20] + nl if kind == "named" else b""
            out += name + b"data: " + json.dumps(obj).encode() + nl + nl
    return out


@st.composite
def reads(draw: st.DrawFn, body: st.SearchStrategy[bytes]) -> tuple[list[bytes], list[int]]:
    """A body cut into reads at arbitrary points, each read 10 ns after the last."""
    data = draw(body)
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=8))))
    bounds = [0, *cuts, len(data)]
    chunks = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a] or [data]
    return chunks, [10 * (i + 1) for i in range(len(chunks))]


any_bytes = st.binary(max_size=600)
# Bytes that look like SSE: fragments of the grammar in any order.
sse_soup = st.lists(
    st.sampled_from(
        [
            b"data:",
            b"data: ",
            b"event: x",
            b"\n",
            b"\r",
            b"\r\n",
            b":",
            b"{",
            b"}",
            b'"',
            b"[DONE]",
            b"\xef\xbb\xbf",
        ]
    )
    | st.binary(max_size=8),
    max_size=40,
).map(b"".join)


def _read(
    api: str, stream: bool, headers: dict[str, str], chunks: list[bytes], times: list[int]
) -> RequestRecord:
    """The adapter of ``api`` reads the answer (the client's own guard bypassed): it must not raise."""
    body: dict[str, Any] = (
        {"documents": ["a", "b"], "input": ["x"]} if api in ("rerank", "embeddings") else {}
    )
    req = PreparedRequest("r", api, body, 1, requested_output_tokens=8, stream=stream)
    rec = RequestRecord(request_id="r", api=api, stream=stream)
    resp = Response(status=200, headers=dict(headers), headers_ns=1, chunks=list(chunks), times=list(times))
    resp.complete = True
    adapter_for(api).classify(CLIENT, rec, req, resp)
    assert rec.outcome in OUTCOMES and rec.outcome != "cancelled", (rec.outcome, rec.error)
    for count in (rec.prompt_tokens_server, rec.completion_tokens_server, rec.cached_tokens_server):
        assert count is None or (isinstance(count, int) and count >= 0)
    assert isinstance(rec.answer_text, str) and isinstance(rec.tool_calls_text, str)
    return rec


@FUZZ
@given(reads(st.one_of(any_bytes, sse_soup)))
def test_sse_parsers_never_raise_on_any_bytes(body: tuple[list[bytes], list[int]]) -> None:
    chunks, times = body
    parse_stream(list(chunks), list(times))
    parse_messages_stream(list(chunks), list(times))
    for api in ("chat", "messages", "responses"):
        _read(api, True, SSE, chunks, times)


@FUZZ
@given(reads(sse_body(chat_chunk_like)))
def test_chat_streams_of_wrong_shapes_never_raise(body: tuple[list[bytes], list[int]]) -> None:
    chunks, times = body
    parse_stream(list(chunks), list(times))
    _read("chat", True, SSE, chunks, times)
    _read("completions", True, SSE, chunks, times)


@FUZZ
@given(reads(st.one_of(sse_soup, sse_body(chat_chunk_like))))
def test_the_short_body_split_reads_every_body_as_the_array_split_does(
    body: tuple[list[bytes], list[int]],
) -> None:
    """Bodies up to SMALL_BODY bytes take plain bytes splits, longer ones numpy's: the same result."""
    chunks, times = body
    results = []
    for small in (0, 1 << 30):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sse, "SMALL_BODY", small)
            results.append(_said(parse_stream(list(chunks), list(times))))
    assert results[0] == results[1]


def _said(res: sse.StreamResult) -> dict[str, Any]:
    """Every value a parse gave, by name (StreamResult is a plain class, compared value by value)."""
    said = {n: getattr(res, n) for n in dir(res) if not n.startswith("_") and not callable(getattr(res, n))}
    off = said.pop("off_shape")
    return {**said, "off_shape": (off.count, off.first, off.sample)}


@FUZZ
@given(reads(sse_body(typed_event_like)))
def test_messages_and_responses_streams_of_wrong_shapes_never_raise(
    body: tuple[list[bytes], list[int]],
) -> None:
    chunks, times = body
    _read("messages", True, SSE, chunks, times)
    _read("responses", True, SSE, chunks, times)


whole_answer = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"choices": _maybe(st.lists(choice_like, max_size=3))}, optional={"usage": usage_like}
    ),
    typed_event_like,
    st.fixed_dictionaries(
        {"object": st.just("response"), "output": _maybe(st.lists(json_values, max_size=3))},
        optional={"status": json_values, "usage": usage_like},
    ),
    st.fixed_dictionaries(
        {"type": st.just("message"), "content": _maybe(st.lists(json_values, max_size=3))},
        optional={"usage": usage_like, "stop_reason": json_values},
    ),
    st.fixed_dictionaries(
        {"data": _maybe(st.lists(json_values, max_size=2))}, optional={"usage": usage_like}
    ),
    st.fixed_dictionaries(
        {"results": _maybe(st.lists(json_values, max_size=3))}, optional={"usage": usage_like}
    ),
).map(lambda obj: json.dumps(obj).encode())


@FEW
@given(st.one_of(whole_answer, any_bytes))
def test_whole_answers_of_every_api_never_raise(body: bytes) -> None:
    for api in ("chat", "completions", "responses", "messages", "embeddings", "rerank"):
        _read(api, False, JSON, [body], [10])


def _token_times(chunks: list[bytes]) -> list[int]:
    return parse_stream(chunks, [10 * (i + 1) for i in range(len(chunks))]).chunk_ns


@FUZZ
@given(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=5), st.data())
def test_token_times_do_not_depend_on_the_line_endings(tokens: list[str], data: st.DataObject) -> None:
    """LF and CR endings have the same length: cut at the same points, every token has the same read
    (a CR at the end of a read ends the event at that read, as a LF does)."""
    lf = b"".join(
        b"data: " + json.dumps({"choices": [{"delta": {"content": t}}]}).encode() + b"\n\n" for t in tokens
    )
    lf += b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    cr = lf.replace(b"\n", b"\r")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(lf) - 1), max_size=10))))
    bounds = [0, *cuts, len(lf)]
    split = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    want = _token_times([lf[a:b] for a, b in split])
    assert len(want) == len(tokens)
    assert _token_times([cr[a:b] for a, b in split]) == want
    # CRLF, its LF sometimes opening the next read: the line ends at the read holding its CR.
    crlf = [lf[a:b].replace(b"\n", b"\r\n") for a, b in split]
    for i in range(len(crlf) - 1):
        if crlf[i].endswith(b"\r\n") and data.draw(st.booleans()):
            crlf[i], crlf[i + 1] = crlf[i][:-1], b"\n" + crlf[i + 1]
    assert _token_times(crlf) == want


@FEW
@given(
    st.sampled_from([100, 200, 204, 301, 307, 400, 401, 413, 422, 429, 500, 503]),
    st.sampled_from(["", "identity", "gzip", "deflate", "br", "GZIP", "x-unknown"]),
    st.sampled_from(
        ["text/event-stream", "Text/Event-Stream; charset=UTF-8", "application/json", "", "text/html"]
    ),
    st.sampled_from(["", "7", "-1", "soon", "Wed, 21 Oct 2015 07:28:00 GMT"]),
    st.one_of(whole_answer, any_bytes, sse_soup),
    st.sampled_from(["chat", "messages", "responses", "embeddings", "rerank"]),
    st.booleans(),
)
def test_any_status_and_headers_are_read_into_one_outcome(
    status: int, coding: str, ctype: str, retry: str, body: bytes, api: str, stream: bool
) -> None:
    """What every answer goes through (status, redirects, content coding) and then its API's reader."""
    headers = {"content-type": ctype, "content-encoding": coding, "retry-after": retry}
    req = PreparedRequest("h", api, {"documents": ["a"], "input": ["x"]}, 1, 4, stream=stream)
    rec = RequestRecord(request_id="h", api=api, stream=stream)
    resp = Response(status=status, headers=headers, headers_ns=1, chunks=[body[:7], body[7:]], times=[5, 6])
    if not classify_http(rec, resp):
        adapter_for(api).classify(CLIENT, rec, req, resp)
    assert rec.outcome in OUTCOMES and rec.outcome != "cancelled", (rec.outcome, rec.error)


@pytest.mark.parametrize(
    ("api", "stream", "headers", "body"),
    [
        (
            "chat",
            True,
            SSE,
            b'data: {"choices":[{"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":-3,"completion_tokens":-1}}\n\ndata: [DONE]\n\n',
        ),
        (
            "messages",
            True,
            SSE,
            b'event: message_start\ndata: {"type":"message_start","message":'
            b'{"usage":{"input_tokens":-5,"output_tokens":1}}}\n\nevent: content_block_delta\ndata: '
            b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}\n\n'
            b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
            b'"usage":{"output_tokens":-2}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n',
        ),
        (
            "messages",
            False,
            JSON,
            b'{"type":"message","content":[{"type":"text","text":"hi"}],'
            b'"stop_reason":"end_turn","usage":{"input_tokens":-5,"output_tokens":-2,'
            b'"cache_read_input_tokens":-1}}',
        ),
        (
            "rerank",
            False,
            JSON,
            b'{"results":[{"index":0,"relevance_score":0.5},'
            b'{"index":1,"relevance_score":0.2}],"usage":{"total_tokens":-4,"prompt_tokens":-4}}',
        ),
    ],
)
def test_a_usage_count_below_zero_reads_as_not_reported(
    api: str, stream: bool, headers: dict[str, str], body: bytes
) -> None:
    """A server's negative token count is no count: the answer stays ok, the server's counts are absent
    (the client's own count is the one the figures use), never a negative number in a figure."""
    rec = _read(api, stream, headers, [body], [10])
    assert rec.outcome == "ok", rec.error
    assert rec.prompt_tokens_server is None and rec.completion_tokens_server is None
    assert rec.cached_tokens_server in (None, 0)
    assert rec.output_tokens >= 0 and rec.input_tokens >= 0
