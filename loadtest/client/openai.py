"""The per-request send/measure/classify cycle; each API's request and answer shapes are its adapter's
(client/adapters)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field, replace
from time import perf_counter_ns
from typing import Any

from loadtest.client.adapters.base import classify_http, done_time, with_model
from loadtest.client.adapters.registry import adapter_for, response_cap, self_sending
from loadtest.client.http import Connection, Endpoint, HttpFailure, Response, build_request
from loadtest.client.network import NetworkPolicy
from loadtest.client.record import RequestRecord, count_merged_gaps
from loadtest.client.secrets import redact_echoes
from loadtest.client.unreadable import mark_unreadable
from loadtest.contracts.record_line import AgenticTurn
from loadtest.tokens.tokenizer import Tokenizer

# Every request carries a fresh UUID here (servers such as llama.cpp's reject any other form); the record
# keeps the readable id and this wire id. A profile may replace or remove the header (request.headers).
REQUEST_ID_HEADER = "X-Request-Id"

_WIRE_FIRST, _WIRE_END = 10**11, 10**12  # the counter's 12-digit numbers


class _WireIds:
    """Version-4 UUIDs in their usual text form: the first 20 hex digits drawn from the OS once per
    process (and again in a forked child), the last 12 a counter from a random start, written in
    decimal (12 digits, each a hex digit: no format to run). Ids are unique within a process and
    unrelated between processes, and a new one costs no random draw."""

    __slots__ = ("prefix", "count")

    def __init__(self) -> None:
        self.prefix = ""
        self.count = 0
        self.draw()

    def draw(self) -> None:
        h = uuid.uuid4().hex  # the version and variant digits are among the first 20
        self.prefix = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-"
        self.count = _WIRE_FIRST + int(h[20:], 16) % (_WIRE_END - _WIRE_FIRST)

    def new(self) -> str:
        n = self.count
        self.count = n + 1 if n + 1 < _WIRE_END else _WIRE_FIRST
        return f"{self.prefix}{n}"


_WIRE_IDS = _WireIds()
os.register_at_fork(after_in_child=_WIRE_IDS.draw)


def new_wire_id() -> str:
    """A new wire id: a version-4 UUID (``_WireIds``)."""
    return _WIRE_IDS.new()


_MARK = "\x00own\x00"  # stands for the per-request header values while encode's cached parts are cut


@dataclass(slots=True, init=False)
class PreparedRequest:
    """A request the workload built: body without model/stream fields, and its client-side token count.

    Its ``__init__`` is written out: compiled, it stores the fields in C, where the dataclass's own
    stores each from Python (0.6 µs a request)."""

    request_id: str
    api: str  # the adapter that sends it (client/adapters, one per api: chat, messages, rerank, raw ...)
    body: dict[str, Any]
    prompt_tokens: int
    requested_output_tokens: int | None = None
    scenario: str = "default"
    stream: bool = True
    extra_headers: dict[str, str] = field(default_factory=dict)
    session: str | None = None  # the multi-turn/agent session it belongs to (sticky balancing)
    session_last: bool = False  # the session's planned last call (its end, for the conversation figures)
    path: str | None = None  # raw mode: the path the recorded body is sent to, unchanged
    reference: str | None = None  # a dataset's reference answer (quality checks)
    poll_s: float | None = None  # a job API's poll interval (video_jobs)
    agentic: AgenticTurn | None = None  # a recorded agent call's expected answer (inline accuracy)

    def __init__(
        self,
        request_id: str,
        api: str,
        body: dict[str, Any],
        prompt_tokens: int,
        requested_output_tokens: int | None = None,
        scenario: str = "default",
        stream: bool = True,
        extra_headers: dict[str, str] | None = None,
        session: str | None = None,
        session_last: bool = False,
        path: str | None = None,
        reference: str | None = None,
        poll_s: float | None = None,
        agentic: AgenticTurn | None = None,
    ) -> None:
        self.request_id, self.api, self.body, self.prompt_tokens = request_id, api, body, prompt_tokens
        self.requested_output_tokens, self.scenario, self.stream = requested_output_tokens, scenario, stream
        self.extra_headers = {} if extra_headers is None else extra_headers
        self.session, self.session_last, self.path = session, session_last, path
        self.reference, self.poll_s, self.agentic = reference, poll_s, agentic


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
        network: NetworkPolicy | None = None,
    ) -> None:
        endpoint = Endpoint.parse(base_url)
        self.model = model
        self.tokenizer = tokenizer
        self.timeouts = timeouts or Timeouts()
        self.worker = worker
        self.conn = Connection(endpoint, self.timeouts.connect, network)
        if self.conn.proxy is not None and endpoint.scheme == "http":  # absolute form through the proxy
            endpoint = replace(endpoint, target_prefix=f"http://{endpoint.host_header}")
        self.endpoint = endpoint
        self._header_map = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream, application/json",
            "Accept-Encoding": "identity",  # a compressed stream would hide when each token arrived
        }
        self._secrets = (api_key,) if api_key else ()
        if api_key:
            self._header_map["Authorization"] = f"Bearer {api_key}"
        # None: the profile removed the header; a fixed value is sent as the profile gives it.
        self.request_id_header: str | None = REQUEST_ID_HEADER
        self.fixed_request_id: str | None = None
        self.extra_body: dict[str, Any] = {}  # the profile's request.extra_body (client/apis.py)
        self.transport: Any = None  # an adapter's own transport, opened at its first request (gRPC's channel)
        self.session_header: str | None = (
            None  # carries PreparedRequest.session (profile request.session_header)
        )
        # encode's request bytes around the per-request headers, by path, api and session; made at the
        # first request after a change of the headers above (``_headers``)
        self._heads: dict[tuple[str, str, bool, str | None], tuple[bytes, bytes]] = {}

    @property
    def _headers(self) -> dict[str, str]:
        """The headers every request carries, to read or change (client/apis.py): ``encode``'s cached
        parts are made anew after any use of it."""
        self._heads.clear()
        return self._header_map

    def request_headers(self, req: PreparedRequest, rec: RequestRecord | None) -> dict[str, str]:
        """This request's headers: the client's and the profile's, its wire id, its session's id, then its
        own extra ones."""
        headers = dict(self._header_map)
        if self.request_id_header:
            headers[self.request_id_header] = self._wire_id(rec)
        if self.session_header and req.session:
            headers[self.session_header] = req.session
        headers.update(req.extra_headers)
        return headers

    def _wire_id(self, rec: RequestRecord | None) -> str:
        """The request-id header's value of one request (the profile's fixed one, else a new id), kept on
        its record."""
        wire_id = self.fixed_request_id or new_wire_id()
        if rec is not None:
            rec.wire_id = wire_id
        return wire_id

    def close(self) -> None:
        self.conn.close()

    def encode(self, req: PreparedRequest, rec: RequestRecord | None = None) -> bytes:
        """The HTTP request for ``req``: its API's path and body (client/adapters), this client's headers.

        The bytes before and after the per-request headers (the wire id, the session) are made once per
        API, path and session header (``_heads``); a request with its own extra headers is built whole
        (``encode_whole``), with the same bytes either way."""
        if req.extra_headers:
            return self.encode_whole(req, rec)
        adapter = adapter_for(req.api)
        body = adapter.body(self, req)
        if rec is not None:
            rec.body_sent = body
        session = req.session if self.session_header and req.session else None
        path = with_model(adapter.path(self.endpoint, req), self.model)
        key = (path, req.api, session is not None, self.request_id_header)
        parts = self._heads.get(key)
        if parts is None:
            parts = self._heads[key] = self._head_parts(req, path)
        head, tail = parts
        own = f"{self.request_id_header}: {self._wire_id(rec)}\r\n" if self.request_id_header else ""
        if session:
            own += f"{self.session_header}: {session}\r\n"
        return b"".join((head, own.encode("latin-1"), tail, b"%d\r\n\r\n" % len(body), body))

    def _head_parts(self, req: PreparedRequest, path: str) -> tuple[bytes, bytes]:
        """What ``encode_whole`` writes before the wire id and after the session header (up to the
        Content-Length value), for requests like ``req`` to ``path``: cut out of one built whole."""
        probe = PreparedRequest(req.request_id, req.api, {}, 0, 0, session=_MARK if req.session else None)
        headers = self._request_headers_of(probe, None)
        if self.request_id_header:
            headers[self.request_id_header] = _MARK  # in place: the header keeps its position
        whole = build_request(self.endpoint, "POST", path, b"", headers).decode("latin-1")
        whole = whole.removesuffix("0\r\n\r\n")
        own = "".join(f"{ln}\r\n" for ln in whole.split("\r\n") if _MARK in ln)  # adjacent lines
        at = whole.index(own) if own else whole.rindex("Content-Length: ")
        return whole[:at].encode("latin-1"), whole[at + len(own) :].encode("latin-1")

    def encode_whole(self, req: PreparedRequest, rec: RequestRecord | None = None) -> bytes:
        """``encode`` without the cached parts: every header gathered for this request."""
        adapter = adapter_for(req.api)
        body = adapter.body(self, req)
        if rec is not None:
            rec.body_sent = body
        path = with_model(adapter.path(self.endpoint, req), self.model)
        return build_request(self.endpoint, "POST", path, body, self._request_headers_of(req, rec))

    def _request_headers_of(self, req: PreparedRequest, rec: RequestRecord | None) -> dict[str, str]:
        """Every header of ``req`` but Content-Length, in the order they are sent."""
        adapter = adapter_for(req.api)
        headers = self.request_headers(req, rec)
        if adapter.accept:
            headers["Accept"] = adapter.accept
        if adapter.default_headers:
            have = {h.lower() for h in headers}
            headers.update((k, v) for k, v in adapter.default_headers if k.lower() not in have)
        return headers

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
        if (sender := self_sending(req.api)) is not None:  # its own transport (gRPC)
            sender.exchange(self, rec, req)
            rec.error = redact_echoes(rec.error, self._secrets) if rec.error else rec.error
            return rec
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
        if resp.opened is not None:
            rec.new_connection = resp.opened.micros()
        rec.http_status = resp.status
        try:
            self._classify(rec, req, resp)
        except Exception as e:  # noqa: BLE001 - whatever a server sent, its request gets an endpoint outcome
            rec.done_ns = rec.done_ns or done_time(resp)
            mark_unreadable(rec, e, resp.body, self._secrets)
        if rec.error:
            rec.error = redact_echoes(rec.error, self._secrets)  # a server that echoes a key back
        return rec

    # ---- outcome classification, once per request ----
    def _classify(self, rec: RequestRecord, req: PreparedRequest, resp: Response) -> None:
        """Status, redirects and content coding for every API, then the answer as its API reads it."""
        if classify_http(rec, resp):
            return
        adapter_for(req.api).classify(self, rec, req, resp)
        rec.merged_gaps = count_merged_gaps(rec.chunk_seq())
