"""OpenAI-compatible request building and the per-request send/measure/classify cycle."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

import msgspec

from loadtest.client import apis
from loadtest.client.http import Connection, Endpoint, HttpFailure, Response, build_request, decode_content
from loadtest.client.record import RequestRecord
from loadtest.client.secrets import redact_echoes, snippet
from loadtest.client.sse import parse_stream
from loadtest.tokens.tokenizer import Tokenizer

API_PATHS = {"chat": "/chat/completions", "completions": "/completions"}
# Every request carries a fresh UUID here (servers such as llama.cpp's reject any other form); the record
# keeps the readable id and this wire id. A profile may replace or remove the header (request.headers).
REQUEST_ID_HEADER = "X-Request-Id"
_json = msgspec.json.Encoder()
_any_decoder = msgspec.json.Decoder()


@dataclass(slots=True)
class PreparedRequest:
    """A request the workload built: body without model/stream fields, and its client-side token count."""

    request_id: str
    api: str  # "chat" | "completions"
    body: dict[str, Any]
    prompt_tokens: int
    requested_output_tokens: int | None = None
    scenario: str = "default"
    stream: bool = True
    extra_headers: dict[str, str] = field(default_factory=dict)
    session: str | None = None  # the multi-turn/agent session it belongs to (sticky balancing)
    path: str | None = None  # raw mode: the path the recorded body is sent to, unchanged


@dataclass(slots=True)
class Timeouts:
    connect: float = 10.0
    read: float = 300.0  # longest silence between two reads
    total: float = 0.0  # 0 = none


class OpenAIClient:
    """Sends prepared requests over one keep-alive connection and returns finished records."""

    def __init__(
        self,
        base_url: str,
        model: str | None,
        tokenizer: Tokenizer,
        api_key: str | None = None,
        timeouts: Timeouts | None = None,
        worker: int = 0,
        verify_tls: bool = True,
    ) -> None:
        self.endpoint = Endpoint.parse(base_url)
        self.model = model
        self.tokenizer = tokenizer
        self.timeouts = timeouts or Timeouts()
        self.worker = worker
        self.conn = Connection(self.endpoint, self.timeouts.connect, verify_tls)
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream, application/json",
            "Accept-Encoding": "identity",  # a compressed stream would hide when each token arrived
        }
        self._secrets = (api_key,) if api_key else ()
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        # None: the profile removed the header; a fixed value is sent as the profile gives it.
        self.request_id_header: str | None = REQUEST_ID_HEADER
        self.fixed_request_id: str | None = None

    def request_headers(self, req: PreparedRequest, rec: RequestRecord | None) -> dict[str, str]:
        """This request's headers: the client's and the profile's, its wire id, then its own extra ones."""
        headers = dict(self._headers)
        if self.request_id_header:
            wire_id = self.fixed_request_id or str(uuid.uuid4())
            headers[self.request_id_header] = wire_id
            if rec is not None:
                rec.wire_id = wire_id
        headers.update(req.extra_headers)
        return headers

    def close(self) -> None:
        self.conn.close()

    def encode(self, req: PreparedRequest, rec: RequestRecord | None = None) -> bytes:
        if req.api in apis.OWN_APIS:  # responses, embeddings, raw replay (client/apis.py)
            return apis.encode(self, req, rec)
        body = dict(req.body)
        apis.extra_body(self, body)  # the profile's request.extra_body
        if self.model:
            body["model"] = self.model
        if req.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        headers = self.request_headers(req, rec)
        path = self.endpoint.api_prefix + API_PATHS[req.api]
        return build_request(self.endpoint, "POST", path, _json.encode(body), headers)

    def send(
        self,
        req: PreparedRequest,
        scheduled_ns: int,
        scheduled_epoch: float,
        record: RequestRecord | None = None,
    ) -> RequestRecord:
        """Send ``req`` now and measure it; never raises for anything the server does.

        A caller may pass ``record`` so that an interrupted send can still be accounted (it stays
        ``cancelled`` until this method classifies it).
        """
        rec = record or RequestRecord(request_id=req.request_id)
        rec.scenario = req.scenario
        rec.api = req.api
        rec.stream = req.stream
        rec.worker = self.worker
        rec.scheduled_ns = scheduled_ns
        rec.scheduled_epoch = scheduled_epoch
        rec.requested_output_tokens = req.requested_output_tokens
        rec.prompt_tokens_client = req.prompt_tokens
        raw = self.encode(req, rec)
        sent = [0]
        deadline = perf_counter_ns() + int(self.timeouts.total * 1e9) if self.timeouts.total else 0
        try:
            resp = self.conn.request(raw, self.timeouts.read, deadline, sent, response_cap(req))
        except HttpFailure as f:
            rec.sent_ns = sent[0]
            rec.done_ns = 0
            rec.outcome, rec.error = f.outcome, redact_echoes(f.message, self._secrets)
            return rec
        rec.sent_ns = sent[0]
        rec.headers_ns = resp.headers_ns
        rec.http_status = resp.status
        self._classify(rec, req, resp)
        if rec.error:
            rec.error = redact_echoes(rec.error, self._secrets)  # a server that echoes a key back
        return rec

    # ---- outcome classification, once per request ----
    def _classify(self, rec: RequestRecord, req: PreparedRequest, resp: Response) -> None:
        status = resp.status
        if status >= 400 or status < 200:
            rec.outcome = "http_429" if status == 429 else "http_5xx" if status >= 500 else "http_4xx"
            rec.error = _error_message(resp)
            if status in (400, 413, 422) and is_context_length_error(rec.error):
                rec.outcome = "context_length"
            if status in (429, 503):
                rec.retry_after_s = _retry_after(resp)
            return
        if status >= 300:  # redirects are never followed: that would be a hidden second request
            rec.outcome = "protocol_error"
            where = resp.headers.get("location") or "no Location"
            rec.error = f"HTTP {status} redirect to {where}: not followed (point --host at the final URL)"
            return
        if undecodable := decode_content(resp):
            rec.outcome, rec.error = "protocol_error", undecodable
            rec.done_ns = resp.times[-1] if resp.times else resp.headers_ns
            return
        if req.api in apis.OWN_APIS and apis.classify(self, rec, req, resp):
            return
        if req.stream:
            if "text/event-stream" not in resp.content_type:
                rec.outcome = "protocol_error"
                ct = resp.content_type or "none"
                rec.error = (
                    f"expected an SSE stream (text/event-stream), got content-type {ct}: {snippet(resp.body)}"
                )
                return
            s = parse_stream(resp.chunks, resp.times)
            rec.chunk_ns = s.chunk_ns
            rec.first_token_ns = s.first_token_ns
            rec.first_answer_ns = s.first_answer_ns
            rec.finish_reason = s.finish_reason
            rec.answer_text = s.answer_text
            rec.tool_calls_text = s.tool_text
            rec.done_ns = resp.times[-1] if resp.times else resp.headers_ns
            rec.completion_tokens_client = self.tokenizer.count(s.answer_text + s.tool_text) + (
                rec_reason := self.tokenizer.count(s.reasoning_text)
            )
            rec.reasoning_tokens_client = rec_reason
            if s.usage is not None:
                u = s.usage
                rec.prompt_tokens_server = u.prompt_tokens
                rec.completion_tokens_server = u.completion_tokens
                if u.prompt_tokens_details:
                    rec.cached_tokens_server = u.prompt_tokens_details.get("cached_tokens")
                if u.completion_tokens_details:
                    rec.reasoning_tokens_server = u.completion_tokens_details.get("reasoning_tokens")
            if s.error:
                rec.outcome, rec.error = "stream_error", f"error frame: {s.error}"
            elif s.malformed:
                rec.outcome, rec.error = "stream_error", f"{s.malformed} malformed event(s) in the stream"
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
            return
        # Non-streamed answer: the whole body is the first (and last) token.
        rec.done_ns = resp.times[-1] if resp.times else resp.headers_ns
        if resp.broken:
            rec.outcome, rec.error = resp.broken_outcome, resp.broken
            return
        try:
            obj = _any_decoder.decode(resp.body)
        except msgspec.DecodeError:
            rec.outcome, rec.error = "protocol_error", f"response is not JSON: {snippet(resp.body)}"
            return
        if not isinstance(obj, dict) or "choices" not in obj:
            rec.outcome = (
                "protocol_error" if not (isinstance(obj, dict) and "error" in obj) else "stream_error"
            )
            rec.error = f"not an OpenAI completion object: {snippet(resp.body)}"
            return
        text = ""
        for c in obj.get("choices") or []:
            msg = c.get("message") or {}
            text += (msg.get("content") or "") + (msg.get("reasoning_content") or msg.get("reasoning") or "")
            text += c.get("text") or ""
            rec.finish_reason = c.get("finish_reason") or rec.finish_reason
        rec.first_token_ns = rec.done_ns
        rec.first_answer_ns = rec.done_ns
        rec.answer_text = text
        rec.completion_tokens_client = self.tokenizer.count(text)
        usage = obj.get("usage") or {}
        rec.prompt_tokens_server = usage.get("prompt_tokens")
        rec.completion_tokens_server = usage.get("completion_tokens")
        rec.cached_tokens_server = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if not rec.mark_empty(bool(text) or _has_tool_call(obj), "answer"):
            rec.outcome = "ok"


# The most a response may take in memory: from the request's own max tokens with a wide margin (a streamed
# token costs a server 150-400 bytes of SSE and JSON), never under 8 MiB; 64 MiB without a token limit.
CAP_BYTES_PER_TOKEN = 4096
CAP_MIN_BYTES = 8 * 2**20
CAP_UNLIMITED_BYTES = 64 * 2**20


def response_cap(req: PreparedRequest) -> int:
    """The size cap of ``req``'s response in bytes (docs/reliability.md, "Bounded resources")."""
    n = req.requested_output_tokens
    if not n or req.api == "embeddings":
        return CAP_UNLIMITED_BYTES
    return max(CAP_MIN_BYTES, n * CAP_BYTES_PER_TOKEN)


def _has_tool_call(obj: dict[str, Any]) -> bool:
    return any((c.get("message") or {}).get("tool_calls") for c in obj.get("choices") or [])


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


def _retry_after(resp: Response) -> float | None:
    """Retry-After in seconds (the delta-seconds form; an HTTP date is ignored)."""
    value = resp.headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _error_message(resp: Response) -> str:
    """The server's error message: OpenAI ``{"error": {...}}`` if present, else the body's start."""
    body = resp.body
    try:
        obj = _any_decoder.decode(body)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return f"HTTP {resp.status}: {err['message']}"
        if isinstance(obj, dict) and obj.get("message"):
            return f"HTTP {resp.status}: {obj['message']}"
    except msgspec.DecodeError:
        pass
    retry = resp.headers.get("retry-after")
    return f"HTTP {resp.status}{f' (Retry-After {retry})' if retry else ''}: {snippet(body)}"
