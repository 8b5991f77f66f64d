"""The Responses and embeddings APIs and raw replay: request encoding, response parsing, profile auth and headers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from loadtest.client.http import Response, build_request
from loadtest.client.secrets import snippet

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord
    from loadtest.profile.schema import Profile

OWN_APIS = frozenset({"responses", "embeddings", "raw"})
_json = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def configure_client(client: OpenAIClient, profile: Profile) -> None:
    """Apply the profile's ``request`` section: auth scheme for the key, extra headers, extra body fields.

    A profile header replaces the client's header of the same name (names compare case-insensitively);
    a null value removes it, the request-id header included."""
    spec = profile.request
    headers = client._headers
    key_header = headers.pop("Authorization", None)
    if key_header is not None and spec.auth == "bearer":
        headers["Authorization"] = key_header
    elif key_header is not None and spec.auth == "api-key-header":
        headers[spec.auth_header] = key_header.removeprefix("Bearer ")
    rid = (client.request_id_header or "").lower()
    for name, value in spec.headers.items():
        for have in [h for h in headers if h.lower() == name.lower()]:
            del headers[have]
        if name.lower() == rid:
            client.request_id_header = None if value is None else name
            client.fixed_request_id = value
        elif value is not None:
            headers[name] = value
    client.extra_body = dict(spec.extra_body)  # type: ignore[attr-defined]


def auth_headers(api_key: str | None, profile: Profile) -> dict[str, str]:
    """The headers every request of ``profile`` carries: the key by its auth scheme, then its extra headers
    (what the preflight sends too, so an endpoint that wants an ``api-key`` header accepts it)."""
    spec = profile.request
    out: dict[str, str] = {}
    if api_key and spec.auth == "bearer":
        out["Authorization"] = f"Bearer {api_key}"
    elif api_key and spec.auth == "api-key-header":
        out[spec.auth_header] = api_key
    for name, value in spec.headers.items():
        for have in [h for h in out if h.lower() == name.lower()]:
            del out[have]
        if value is not None:
            out[name] = value
    return out


def extra_body(client: OpenAIClient, body: dict[str, Any]) -> None:
    """Add the profile's extra body fields (chat_template_kwargs, priority ...) to a request body."""
    extra = getattr(client, "extra_body", None)
    if extra:
        body.update(extra)


def api_kind(req: PreparedRequest) -> str | None:
    """Which response shape to expect: responses, embeddings, or None (chat/completions shapes)."""
    if req.api in ("responses", "embeddings"):
        return req.api
    path = (req.path or "").rstrip("/")
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/embeddings"):
        return "embeddings"
    return None


def encode(client: OpenAIClient, req: PreparedRequest, rec: RequestRecord | None = None) -> bytes:
    """The HTTP request for a responses, embeddings or raw request (raw: the recorded body, unchanged)."""
    headers = client.request_headers(req, rec)
    ep = client.endpoint
    if req.api == "raw":
        return build_request(
            ep, "POST", req.path or "/v1/chat/completions", req.body["raw"].encode(), headers
        )
    body = dict(req.body)
    extra_body(client, body)
    if client.model:
        body["model"] = client.model
    if req.api == "responses":
        body["stream"] = bool(req.stream)
        path = "/responses"
    else:
        path = "/embeddings"
        headers["Accept"] = "application/json"
    return build_request(ep, "POST", ep.api_prefix + path, _json.encode(body), headers)


def classify(client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response) -> bool:
    """Classify a 2xx answer of the Responses or embeddings API; False when it is another API's shape."""
    kind = api_kind(req)
    if kind is None:
        return False
    rec.done_ns = resp.times[-1] if resp.times else resp.headers_ns
    if kind == "embeddings":
        _embeddings(rec, req, resp)
    elif req.stream:
        _responses_stream(client, rec, resp)
    else:
        _responses_full(client, rec, resp)
    return True


def _json_body(rec: RequestRecord, resp: Response) -> dict[str, Any] | None:
    if resp.broken:
        rec.outcome, rec.error = resp.broken_outcome, resp.broken
        return None
    try:
        obj = _decoder.decode(resp.body)
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


def _embeddings(rec: RequestRecord, req: PreparedRequest, resp: Response) -> None:
    inputs = req.body.get("input") if req.api != "raw" else _decoder.decode(req.body["raw"]).get("input")
    n_in = len(inputs) if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else 1
    rec.inputs = n_in
    obj = _json_body(rec, resp)
    if obj is None:
        return
    data = obj.get("data")
    if not isinstance(data, list) or not all(isinstance(d, dict) and "embedding" in d for d in data):
        rec.outcome, rec.error = "protocol_error", f"not an OpenAI embeddings list: {snippet(resp.body)}"
        return
    if len(data) != n_in:
        rec.outcome, rec.error = "protocol_error", f"{len(data)} embedding(s) returned for {n_in} input(s)"
        return
    usage = obj.get("usage") or {}
    rec.prompt_tokens_server = usage.get("prompt_tokens")
    rec.finish_reason = "stop"
    rec.outcome = "ok"


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


def _count(client: OpenAIClient, rec: RequestRecord, answer: str, reasoning: str) -> None:
    rec.answer_text = answer
    rec.reasoning_tokens_client = client.tokenizer.count(reasoning) if reasoning else 0
    rec.completion_tokens_client = client.tokenizer.count(answer) + rec.reasoning_tokens_client


def _responses_full(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
    obj = _json_body(rec, resp)
    if obj is None:
        return
    if obj.get("object") != "response" or not isinstance(obj.get("output"), list):
        rec.outcome, rec.error = "protocol_error", f"not a Responses API object: {snippet(resp.body)}"
        return
    answer, reasoning = _output_texts(obj["output"])
    _count(client, rec, answer, reasoning)
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
class _Events:
    """A Responses API stream: each event's decoded data and the time of the read that completed it."""

    items: list[tuple[dict[str, Any] | None, int]] = field(default_factory=list)
    tail: bool = False  # bytes after the last blank line: an event that never ended


def split_events(chunks: list[bytes], times: list[int]) -> _Events:
    out = _Events()
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
            obj = _decoder.decode(b"\n".join(data))
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


def _responses_stream(client: OpenAIClient, rec: RequestRecord, resp: Response) -> None:
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
    _count(client, rec, "".join(answer), "".join(reasoning))
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
