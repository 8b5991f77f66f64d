"""What every API adapter is (``ApiAdapter``) and the parts all of them share: the HTTP status, redirect
and content-coding checks, context-length detection, the server's error message, the response size cap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

import msgspec
from mypy_extensions import mypyc_attr

from loadtest.client.apis import extra_body
from loadtest.client.http import Endpoint, Response, decode_content, is_media_type
from loadtest.client.secrets import snippet
from loadtest.contracts.record_line import AgenticTurn

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord

json_encoder = msgspec.json.Encoder()
json_decoder = msgspec.json.Decoder()


# Compiled (loadtest/compiled.py), the adapters other modules subclass allow Python subclasses; what a
# subclass sets per API is a ClassVar, which compiled code reads from the subclass, not the base.
@mypyc_attr(allow_interpreted_subclasses=True)
class RoutedAdapter:
    """What most adapters share: the path under the endpoint's API prefix, a streamed answer when the
    request asks for one, and the body as ``openai_body`` with the ``stream`` flag."""

    names: ClassVar[tuple[str, ...]] = ()
    route: ClassVar[str] = ""
    accept: ClassVar[str | None] = None
    capped_by_tokens: ClassVar[bool] = True
    default_headers: ClassVar[tuple[tuple[str, str], ...]] = ()

    def path(self, endpoint: Endpoint, req: PreparedRequest) -> str:
        return endpoint.api_path(self.route)

    def streams(self, req: PreparedRequest) -> bool:
        return bool(req.stream)

    def body(self, client: OpenAIClient, req: PreparedRequest) -> bytes:
        body = openai_body(client, req)
        body["stream"] = self.streams(req)
        return json_encoder.encode(body)


@mypyc_attr(allow_interpreted_subclasses=True)
class JsonAdapter(RoutedAdapter):
    """An API answered with one JSON object, never streamed, whose size does not follow max tokens."""

    accept: ClassVar[str | None] = "application/json"
    capped_by_tokens: ClassVar[bool] = False

    def streams(self, req: PreparedRequest) -> bool:
        return False

    def body(self, client: OpenAIClient, req: PreparedRequest) -> bytes:
        return json_encoder.encode(openai_body(client, req))


def openai_body(client: OpenAIClient, req: PreparedRequest) -> dict[str, Any]:
    """A copy of the request's body with the profile's extra fields and the client's model."""
    body = dict(req.body)
    extra_body(client, body)  # the profile's request.extra_body
    if client.model:
        body["model"] = client.model
    return body


def keep_agentic(turn: AgenticTurn, answer: str, reasoning: str, calls: Sequence[dict[str, Any]]) -> None:
    """What the inline accuracy check reads of an answer, and no more: where the recorded answer made tool
    calls, the answer's calls (``bash`` ones with their arguments, the check's input; others by name);
    where it names intent codes (the workflow domain), the answer's reasoning and text."""
    if turn.expected_calls:
        named = [(str(c.get("name") or ""), str(c.get("arguments") or "")) for c in calls]
        turn.calls = [[name, args if name == "bash" else ""] for name, args in named]
    if turn.expected_intents:
        turn.reasoning, turn.content = reasoning, answer


def keep_answer(
    client: OpenAIClient,
    rec: RequestRecord,
    answer: str,
    tools: str,
    reasoning: str,
    first: str | None = None,
    calls: Sequence[dict[str, Any]] = (),
) -> None:
    """An answer's texts on its record, and the client's token counts of them: the output is the
    answer, the tool-call arguments and the reasoning; the reasoning's share also on its own.

    ``first``: a streamed answer's first output-bearing event's fragments, counted for the Endpoints
    TPOT; ``calls``: the tool calls (name, arguments text). With the model's chat template the answer is
    also counted the MLPerf Endpoints way (``Tokenizer.assistant``; docs/metrics.md, "Conventions")."""
    rec.answer_text, rec.tool_calls_text, rec.reasoning_text = answer, tools, reasoning
    if rec.agentic is not None:
        keep_agentic(rec.agentic, answer, reasoning, calls)
    tok = client.tokenizer
    rec.reasoning_tokens_client = tok.count(reasoning) if reasoning else 0
    rec.completion_tokens_client = tok.count(answer + tools) + rec.reasoning_tokens_client
    if not calls and tools:
        calls = ({"name": "", "arguments": tools},)
    rec.endpoints_output_tokens, rec.endpoints_tpot_tokens = tok.assistant.endpoints_counts(
        answer,
        reasoning,
        calls,
        first,
        rec.completion_tokens_client,  # a text-only answer's plain count
    )


def obj_at(obj: Any, key: str) -> dict[str, Any]:
    """``obj[key]`` when both are JSON objects, else an empty one: a reader never trips on a server's types."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def list_at(obj: Any, key: str) -> list[Any]:
    """``obj[key]`` when it is a JSON array (and ``obj`` an object), else an empty list."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


def text_at(obj: Any, key: str) -> str:
    """``obj[key]`` when it is a string (and ``obj`` an object), else an empty string."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else ""


def count_at(obj: Any, key: str) -> int | None:
    """``obj[key]`` when it is a count (a non-negative integer; a usage field), else None."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def with_model(path: str, model: str | None) -> str:
    """A request path with ``{model}`` (a route that names the model, KServe v2's) as the client's model,
    percent-encoded as one path segment."""
    return path.replace("{model}", quote(model or "", safe="")) if "{model}" in path else path


def not_sse(rec: RequestRecord, resp: Response) -> bool:
    """True, with ``rec`` a ``protocol_error`` naming the content type that came and the body's start, when
    a streamed answer is not an SSE stream (text/event-stream)."""
    if is_media_type(resp.content_type, "text/event-stream"):
        return False
    rec.outcome = "protocol_error"
    ct = resp.content_type or "none"
    rec.error = f"expected an SSE stream (text/event-stream), got content-type {ct}: {snippet(resp.body)}"
    return True


def done_time(resp: Response) -> int:
    """When the answer ended: the last read, else the headers."""
    return resp.times[-1] if resp.times else resp.headers_ns


def classify_http(rec: RequestRecord, resp: Response) -> bool:
    """The checks every answer goes through before its API reads it: a non-2xx status (its class, the
    server's message, context length, Retry-After), a redirect, a content coding that does not decode.
    True when they settled the record's outcome."""
    status = resp.status
    if status >= 400 or status < 200:
        rec.outcome = "http_429" if status == 429 else "http_5xx" if status >= 500 else "http_4xx"
        rec.error = error_message(resp)
        if status in (400, 413, 422) and is_context_length_error(rec.error):
            rec.outcome = "context_length"
        if status in (429, 503):
            rec.retry_after_s = retry_after(resp)
        return True
    if status >= 300:  # redirects are never followed: that would be a hidden second request
        rec.outcome = "protocol_error"
        where = resp.headers.get("location") or "no Location"
        rec.error = f"HTTP {status} redirect to {where}: not followed (point --host at the final URL)"
        return True
    if undecodable := decode_content(resp):
        rec.outcome, rec.error = "protocol_error", undecodable
        rec.done_ns = done_time(resp)
        return True
    return False


# The most a response may take in memory: from the request's own max tokens with a wide margin (a streamed
# token costs a server 150-400 bytes of SSE and JSON), never under 8 MiB; 64 MiB without a token limit.
CAP_BYTES_PER_TOKEN = 4096
CAP_MIN_BYTES = 8 * 2**20
CAP_UNLIMITED_BYTES = 64 * 2**20


def size_cap(output_tokens: int | None, capped_by_tokens: bool = True) -> int:
    """The size cap in bytes of an answer of at most ``output_tokens`` (docs/reliability.md, "Bounded
    resources"); an API whose answers do not grow with tokens (embeddings) gets the unlimited cap."""
    if not output_tokens or not capped_by_tokens:
        return CAP_UNLIMITED_BYTES
    return max(CAP_MIN_BYTES, output_tokens * CAP_BYTES_PER_TOKEN)


# What servers say when a prompt does not fit: vLLM ("This model's maximum context length is N tokens"),
# llama.cpp ("the request exceeds the available context size"), SGLang, TGI, OpenAI ("context_length_exceeded").
_CONTEXT_MARKERS = (
    "maximum context length",
    "context length",
    "context_length",
    "context size",
    "context window",
    "exceeds the available context",
    "too many tokens",
    "prompt is too long",
    "input is too long",
    "max_model_len",
)


def is_context_length_error(message: str) -> bool:
    """Whether a server's error message says the prompt (plus max_tokens) exceeds the model's context."""
    low = message.lower()
    return any(m in low for m in _CONTEXT_MARKERS)


def retry_after(resp: Response) -> float | None:
    """Retry-After in seconds (the delta-seconds form; an HTTP date is ignored)."""
    value = resp.headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_message(resp: Response) -> str:
    """The server's error message: OpenAI ``{"error": {...}}`` if present, else the body's start."""
    body = resp.body
    try:
        obj = json_decoder.decode(body)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return f"HTTP {resp.status}: {err['message']}"
        if isinstance(obj, dict) and obj.get("message"):
            return f"HTTP {resp.status}: {obj['message']}"
    except msgspec.DecodeError:
        pass
    retry = resp.headers.get("retry-after")
    return f"HTTP {resp.status}{f' (Retry-After {retry})' if retry else ''}: {snippet(body)}"


def json_object(rec: RequestRecord, resp: Response) -> dict[str, Any] | None:
    """A whole 2xx answer as a JSON object with no ``error`` in it; None (the outcome set) otherwise."""
    if resp.broken:
        rec.outcome, rec.error = resp.broken_outcome, resp.broken
        return None
    try:
        obj = json_decoder.decode(resp.body)
    except msgspec.DecodeError:
        rec.outcome, rec.error = "protocol_error", f"response is not JSON: {snippet(resp.body)}"
        return None
    if not isinstance(obj, dict):
        rec.outcome, rec.error = "protocol_error", f"response is not a JSON object: {snippet(resp.body)}"
        return None
    if "error" in obj and obj.get("error"):
        rec.outcome, rec.error = "stream_error", f"error in a 200 answer: {snippet(resp.body)}"
        return None
    return obj
