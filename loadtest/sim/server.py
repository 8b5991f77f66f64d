"""The aiohttp app: OpenAI-compatible routes in front of the simulated engine, plus /sim/* truth.

Each API is a route (sim/routes): its path, its request parsing and its answer's wire shapes. This module
serves every route with the engine through one of three flows: ``_generate`` (tokens, streamed or whole),
``_prefill`` (one prefill-only pass per input, embeddings), ``_compute`` (one timed pass of a non-LLM
model, KServe v2) and ``_job`` (that pass in the background behind a job API: create, poll, download)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns
from typing import Any, cast

from aiohttp import web

from loadtest.profile.request import SESSION_HEADER
from loadtest.sim import faults as F
from loadtest.sim.disagg import DisaggEngine
from loadtest.sim.engine import Engine
from loadtest.sim.faults import FAULT_HEADER, Fault, FaultPlan, FaultSpecError
from loadtest.sim.presets import EngineConfig
from loadtest.sim.prom import CONTENT_TYPE, SimMetrics, engine_value
from loadtest.sim.protocol import (
    CHAT_PATH,
    ChunkWriter,
    GenRequest,
    OutputPlan,
    RequestError,
    _chunk,
    json_body,
)
from loadtest.sim.reference import RecordedAnswer, chat_key, prompt_of
from loadtest.sim.replicas import ReplicaEngine
from loadtest.sim.request import SHUTDOWN, SimRequest
from loadtest.sim.request_log import Incoming, RequestLog
from loadtest.sim.routes import ROUTES, Answer, ApiRoute, PrefillRequest, StreamWriter
from loadtest.sim.routes.base import ComputeRequest, Flow, Job, JobRoute
from loadtest.sim.truth import (
    OUTCOME_CLIENT_DISCONNECTED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_SERVER_SHUTDOWN,
    SimStats,
    TruthLog,
    TruthRecord,
)
from loadtest.tokens.tokenizer import get_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerOptions:
    """Server behaviour beyond the engine: faults and reasoning output."""

    faults: str | None = None  # run-wide fault spec (see loadtest.sim.faults)
    reasoning: bool | None = None  # None: the model preset decides (or the request's reasoning_effort)
    reasoning_fraction: float = 0.6  # share of output tokens streamed as reasoning
    api_key: str | None = None  # like `vllm serve --api-key`: /v1/* answers 401 without it
    api_key_header: str = "Authorization"  # "Authorization" takes "Bearer KEY"; any other name takes KEY
    # reference-answer mode (--reference-answers): prompt -> the answer a whole response carries
    references: dict[str, str] | None = None
    # recorded-answer mode (--recorded-answers): a chat's messages key -> the recorded assistant message
    recorded: dict[str, dict[str, Any]] | None = None


@dataclass
class SimState:
    """Everything the handlers share."""

    config: EngineConfig
    engine: Engine | DisaggEngine | ReplicaEngine
    truth: TruthLog
    stats: SimStats
    options: ServerOptions = field(default_factory=ServerOptions)
    faults: FaultPlan = field(default_factory=FaultPlan)
    metrics: SimMetrics | None = None
    requests: RequestLog = field(default_factory=RequestLog)  # what clients sent (GET /sim/requests)
    device: asyncio.Lock = field(default_factory=asyncio.Lock)  # compute routes' passes, one at a time
    jobs: dict[str, Job] = field(default_factory=dict)  # job routes' jobs, by id (the last MAX_JOBS)
    job_tasks: set[asyncio.Task[None]] = field(default_factory=set)  # their passes, running or waiting
    grpc_port: int | None = None  # where sim/grpc_kserve.py serves KServe v2 over gRPC (--grpc-port)


STATE_KEY = web.AppKey("sim_state", SimState)
MAX_JOBS = 4096


def _error(err: RequestError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


def _model_ok(config: EngineConfig, requested: str | None) -> bool:
    if requested is None or requested == "":
        return True
    names = {config.model_name.lower(), config.model.name.lower()}
    r = requested.lower()
    return r in names or r.rsplit("/", 1)[-1] in names


def _admit(st: SimState, request: Incoming, model: str | None) -> Fault | None:
    """The requested model checked (404) and the request's fault picked (400 on a bad header)."""
    if not _model_ok(st.config, model):
        raise RequestError(404, f"The model `{model}` does not exist.", "model_not_found", "model")
    try:
        return st.faults.pick(request.headers.get(FAULT_HEADER))
    except FaultSpecError as e:
        raise RequestError(400, str(e), "invalid_value", FAULT_HEADER) from None


class _Disconnected(Exception):
    pass


class _Shutdown(Exception):
    pass


class _EngineError(Exception):
    pass


def _check_connected(request: web.Request) -> None:
    tr = request.transport
    if tr is None or tr.is_closing():
        raise _Disconnected


async def _next_tokens(req: SimRequest) -> list[int]:
    """Wait for at least one token index; return every index already delivered."""
    out = [await req.queue.get()]
    while not req.queue.empty():
        out.append(req.queue.get_nowait())
    if out[-1] < 0:
        err = getattr(req, "error", None)
        if err:
            raise _EngineError(str(err))
        if out[-1] == SHUTDOWN:
            raise _Shutdown
        raise _EngineError("the engine could not serve this request")
    return out


def _session_key(request: web.Request, body: dict[str, Any] | None) -> str | None:
    """The conversation a request belongs to, for session affinity: the session header loadtest sends
    (profile request.session_header), else the body's OpenAI ``user`` field."""
    key = request.headers.get(SESSION_HEADER)
    if key:
        return key
    user = body.get("user") if body is not None else None
    return user if isinstance(user, str) and user else None


def _submit(
    st: SimState, g: GenRequest, target: int, request_id: str, session: str | None = None
) -> SimRequest:
    """Submit the prompt's token ids (they key the prefix cache); replicas route by them and ``session``."""
    return st.engine.submit(g.prompt_ids or [0], target, request_id, session)


def _reasoning(st: SimState, g: GenRequest) -> bool:
    if not g.chat:
        return False
    forced = st.options.reasoning
    if forced is not None:
        return forced
    return bool(getattr(st.config.model, "reasoning", False)) or g.reasoning_effort is not None


def _abort_connection(request: web.Request, rst: bool) -> None:
    """Close the client connection now: RST (SO_LINGER 0) or a plain close after flushing."""
    tr = request.transport
    if tr is None:
        return
    if rst:
        sock = tr.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        tr.abort()
    else:
        tr.close()


def _error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _pre_engine_fault(request: web.Request, fault: Fault) -> web.Response:
    """The response (or the reset) for a fault answered without the engine."""
    if fault.kind == F.RESET_BEFORE_HEADERS:
        _abort_connection(request, rst=True)
        return web.Response(status=500)  # never reaches the client
    if fault.kind == F.HTTP_429:
        body = _error_body("Too many requests (injected fault)", "rate_limit_exceeded", 429)
        retry = fault.value() or 1.0
        value = str(int(retry)) if float(retry).is_integer() else str(retry)
        return web.json_response(body, status=429, headers={"Retry-After": value})
    status = 503 if fault.kind == F.HTTP_503 else 500
    kind = "service_unavailable" if status == 503 else "server_error"
    return web.json_response(_error_body(f"Injected fault {fault.kind}", kind, status), status=status)


def _record(rec: TruthRecord, n: int) -> None:
    ns = time.perf_counter_ns()
    if rec.first_token_ns is None:
        rec.first_token_ns = ns
    rec.token_ns.extend([ns] * n)
    rec.completion_tokens += n


def _tokens_text(cw: StreamWriter, first: int, n: int) -> str:
    """The events of ``n`` consecutive tokens written together: one event where the writer merges
    tokens (``tokens``: chat and text completions), else one event per token."""
    merged = getattr(cw, "tokens", None)
    if merged is not None:
        return str(merged(first, n))
    return "".join([cw.token(i) for i in range(first, first + n)])


# Faults that only change how a stream ends: the fast path serves them.
_TAIL_ONLY = frozenset({None, F.NO_USAGE, F.NO_DONE})
_DISCONNECTED = -100  # sink result: the client went away


async def _stream_in_step(
    request: web.Request,
    resp: web.StreamResponse,
    req: SimRequest,
    rec: TruthRecord,
    cw: StreamWriter,
    tail: Callable[[], str],
) -> None:
    """Serve a stream from inside the engine's step: the engine calls a sink that writes the token's
    chunk to the socket at once, so one step writes every stream's token without waking a task each."""
    transport = request.transport
    target = req.target_tokens
    token_ns = rec.token_ns
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_token(index: int) -> None:
        if done.done():
            return
        if index < 0:
            done.set_result(index)
            return
        if transport is None or transport.is_closing():
            done.set_result(_DISCONNECTED)
            return
        try:
            if rec.completion_tokens + 1 < target:
                transport.write(cw.framed_token(index))  # one HTTP/1.1 chunk, pre-rendered
            else:  # the last token carries the stream's tail
                transport.write(_chunk((cw.token(index) + tail()).encode()))
            ns = perf_counter_ns()  # ground truth: when this token was handed to the socket
            if rec.first_token_ns is None:
                rec.first_token_ns = ns
            token_ns.append(ns)
            rec.completion_tokens += 1
            if rec.completion_tokens >= target:
                done.set_result(0)
        except Exception as e:  # never let a stream's failure break the engine's step
            done.set_exception(e)

    def on_run(first: int, n: int) -> None:  # several tokens of one step: one chunk
        if done.done():
            return
        if transport is None or transport.is_closing():
            done.set_result(_DISCONNECTED)
            return
        try:
            data = _tokens_text(cw, first, n)
            if rec.completion_tokens + n >= target:
                data += tail()
            transport.write(_chunk(data.encode()))
            ns = perf_counter_ns()
            if rec.first_token_ns is None:
                rec.first_token_ns = ns
            token_ns.extend([ns] * n)
            rec.completion_tokens += n
            if rec.completion_tokens >= target:
                done.set_result(0)
        except Exception as e:  # never let a stream's failure break the engine's step
            done.set_exception(e)

    # Tokens that arrived before the sink existed go first, in order; no step can run in between.
    while not req.queue.empty():
        on_token(req.queue.get_nowait())
    req.sink = on_token
    req.sink_run = on_run
    if rec.completion_tokens >= target and not done.done():
        done.set_result(0)
    result = await done
    if result == _DISCONNECTED:
        raise _Disconnected
    if result < 0:
        err = getattr(req, "error", None)
        if err:
            raise _EngineError(str(err))
        if result == SHUTDOWN:
            raise _Shutdown
        raise _EngineError("the engine could not serve this request")


async def _stream(
    request: web.Request,
    st: SimState,
    route: ApiRoute,
    g: GenRequest,
    req: SimRequest,
    rec: TruthRecord,
    plan: OutputPlan,
    finish_reason: str,
    headers: dict[str, str],
    fault: Fault | None,
) -> web.StreamResponse:
    kind = fault.kind if fault is not None else None
    cw = route.writer(rec.response_id, int(time.time()), st.config.model_name, plan, rec.prompt_tokens)
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    if request.version >= (1, 1):
        resp.enable_chunked_encoding()
    if kind == F.SLOW_HEADERS:
        assert fault is not None  # kind is fault's
        await asyncio.sleep(fault.value() or 0.0)
    await resp.prepare(request)
    request["sim_response"] = resp
    opening = cw.opening()
    if opening:
        await resp.write(opening)
    target = req.target_tokens
    fire_at = fault.at_token(target) if fault is not None and kind in F.MID_STREAM else None
    backlog: list[int] = []
    tail_sent = False
    merge_steps = bool(getattr(getattr(st.config, "spec", None), "enabled", False))

    def tail() -> str:
        if kind == F.NO_DONE:  # neither finish_reason nor [DONE]: a truncated stream
            return ""
        rec.finish_reason = finish_reason
        cached = getattr(req, "num_cached_tokens", 0)
        usage = g.include_usage and kind != F.NO_USAGE
        return cw.tail(finish_reason, rec.prompt_tokens, target, cached, usage)

    if kind in _TAIL_ONLY and resp.chunked:
        await _stream_in_step(request, resp, req, rec, cw, tail)
        rec.done_ns = time.perf_counter_ns()
        await resp.write_eof()
        return resp

    while True:
        if fire_at is not None and rec.completion_tokens >= fire_at:
            fire_at = None
            if kind == F.DISCONNECT_MID_STREAM:
                rec.done_ns = time.perf_counter_ns()
                _abort_connection(request, rst=False)  # no terminating chunk of the chunked body
                return resp
            if kind == F.ERROR_FRAME:
                await resp.write(cw.error("Injected fault error_frame").encode())
                await resp.write_eof()
                rec.done_ns = time.perf_counter_ns()
                return resp
            if kind == F.STALL_MID_STREAM:
                assert fault is not None  # kind is fault's
                await asyncio.sleep(fault.value() or 0.0)
            elif kind == F.MALFORMED_CHUNK:
                await resp.write(cw.malformed().encode())
        if rec.completion_tokens >= target:
            break
        if not backlog:
            backlog = await _next_tokens(req)
        n = len(backlog) if fire_at is None else min(len(backlog), fire_at - rec.completion_tokens)
        idx, backlog = backlog[:n], backlog[n:]
        data = _tokens_text(cw, idx[0], n) if merge_steps and n > 1 else "".join([cw.token(i) for i in idx])
        if rec.completion_tokens + n >= target and fire_at is None:
            data += tail()
            tail_sent = True
        await resp.write(data.encode())
        _record(rec, n)
    if not tail_sent:
        await resp.write(tail().encode())
    rec.done_ns = time.perf_counter_ns()
    await resp.write_eof()
    return resp


async def _full(
    request: web.Request,
    st: SimState,
    route: ApiRoute,
    g: GenRequest,
    req: SimRequest,
    rec: TruthRecord,
    plan: OutputPlan,
    finish_reason: str,
    headers: dict[str, str],
    fault: Fault | None,
) -> web.StreamResponse:
    kind = fault.kind if fault is not None else None
    target = req.target_tokens
    fire_at = (
        fault.at_token(target)
        if fault is not None and kind in (F.DISCONNECT_MID_STREAM, F.ERROR_FRAME)
        else None
    )
    while True:
        if fire_at is not None and rec.completion_tokens >= fire_at:
            rec.done_ns = time.perf_counter_ns()
            if kind == F.DISCONNECT_MID_STREAM:
                _abort_connection(request, rst=False)
                return web.Response(status=500)  # never reaches the client
            body = _error_body("Injected fault error_frame", "server_error", 500)
            return web.json_response(body, status=500, headers=headers)
        if rec.completion_tokens >= target:
            break
        idx = await _next_tokens(req)
        _check_connected(request)
        _record(rec, len(idx))
    if kind in (F.STALL_MID_STREAM, F.SLOW_HEADERS):
        assert fault is not None  # kind is fault's
        await asyncio.sleep(fault.value() or 0.0)
    reason = None if kind == F.NO_DONE else finish_reason
    answer = Answer(
        rec.response_id,
        int(time.time()),
        st.config.model_name,
        reason,
        rec.prompt_tokens,
        getattr(req, "num_cached_tokens", 0),
        with_usage=kind != F.NO_USAGE,
        plan=plan,
    )
    body = route.whole(g, answer)
    if kind == F.MALFORMED_CHUNK:
        text = web.json_response(body).text or ""
        resp: web.StreamResponse = web.Response(
            text=text[: len(text) // 2], content_type="application/json", headers=headers
        )
    else:
        resp = web.json_response(body, headers=headers)
    await resp.prepare(request)
    await resp.write_eof()
    rec.done_ns = time.perf_counter_ns()
    rec.finish_reason = reason
    return resp


def _finish(st: SimState, rec: TruthRecord, submitted: bool) -> None:
    st.truth.add(rec)
    st.stats.finished(rec)
    if st.metrics is not None:
        st.metrics.finished(rec, submitted)


def _reference(st: SimState, body: dict[str, Any] | None, g: GenRequest) -> str | None:
    """The reference answer for a whole, tool-free answer whose prompt the reference file holds."""
    refs = st.options.references
    if refs is None or body is None or g.stream or g.tool_name is not None:
        return None
    prompt = prompt_of(body)
    return refs.get(prompt) if prompt is not None else None


def _recorded(st: SimState, body: dict[str, Any] | None, path: str, g: GenRequest) -> RecordedAnswer | None:
    """The recorded answer of a chat whose messages match a recorded call, streamed within its
    max_tokens where it can be (sim/reference.py)."""
    recorded = st.options.recorded
    if recorded is None or body is None or path != CHAT_PATH:
        return None
    key = chat_key(body.get("messages"))
    message = recorded.get(key) if key is not None else None
    return RecordedAnswer.fitting(message, g.max_tokens) if message is not None else None


async def _generate(request: web.Request, route: ApiRoute) -> web.StreamResponse:
    """A route whose answer the engine generates: streamed or whole, with every fault."""
    arrival_ns = time.perf_counter_ns()
    st = request.app[STATE_KEY]
    raw = await request.read()
    body: dict[str, Any] | None = None
    try:
        body = json_body(raw)  # decoded once: the parser and the request log share it
        tok = get_tokenizer(st.config.model.tokenizer)
        g = route.parse(body, tok)
        assert isinstance(g, GenRequest), f"a {route.flow} route parses into a GenRequest"
        _fits_context(st, g.prompt_tokens, g.max_tokens)
        fault = _admit(st, request, g.model)
    except RequestError as err:
        st.requests.add(request, raw, body)
        st.stats.rejected(err.status)
        return _error(err)
    st.requests.add(request, raw, body)
    path = request.path
    st.stats.received(path)
    engine = st.engine
    response_id = route.id_prefix + uuid.uuid4().hex
    client_id = request.headers.get("X-Request-Id")
    headers = {"X-Request-Id": client_id} if client_id else {}
    rec = TruthRecord(
        request_id=client_id or response_id,
        response_id=response_id,
        path=path,
        stream=g.stream,
        arrival_ns=arrival_ns,
        prompt_tokens=g.prompt_tokens,
    )
    if fault is not None:
        rec.fault = rec.outcome = fault.kind
        if fault.kind in F.PRE_ENGINE:
            try:
                return _pre_engine_fault(request, fault)
            finally:
                rec.done_ns = time.perf_counter_ns()
                _finish(st, rec, submitted=False)
    target = engine.target_length(g.max_tokens, g.min_tokens, g.ignore_eos)
    reasoning = _reasoning(st, g)
    reference = _reference(st, body, g)
    if reference is not None:  # the reference's own length, reasoning off (sim/reference.py)
        target = max(1, get_tokenizer(st.config.model.tokenizer).count(reference))
        target = min(target, g.max_tokens) if g.max_tokens is not None else target
        reasoning = False
    recorded = _recorded(st, body, request.path, g)
    if recorded is not None:  # the recorded message, one delta a token, cut at max_tokens
        target, reasoning = len(recorded.deltas), False
        target = min(target, g.max_tokens) if g.max_tokens is not None else target
    plan = OutputPlan.make(
        target,
        st.options.reasoning_fraction if reasoning else None,
        g.tool_name,
        "chatcmpl-tool-" + uuid.uuid4().hex[:24] if g.tool_name else "",
    )
    if reference is not None:
        plan = dataclasses.replace(plan, reference=reference)
    if recorded is not None:
        plan = dataclasses.replace(plan, tool_name=None, recorded=recorded)
    rec.reasoning_tokens = plan.n_reasoning
    if recorded is not None:
        finish_reason = recorded.finish_reason if target == len(recorded.deltas) else "length"
    elif g.tool_name is not None:
        finish_reason = "tool_calls"
    else:
        limit = g.max_tokens if g.max_tokens is not None else st.config.output_len.cap
        finish_reason = "length" if target >= limit else "stop"
    req = _submit(st, g, target, rec.request_id, _session_key(request, body))
    try:
        engine_err = getattr(req, "error", None)
        if engine_err:
            raise _EngineError(str(engine_err))
        if g.stream:
            return await _stream(request, st, route, g, req, rec, plan, finish_reason, headers, fault)
        return await _full(request, st, route, g, req, rec, plan, finish_reason, headers, fault)
    except (ConnectionError, _Disconnected, asyncio.CancelledError) as e:
        rec.outcome = OUTCOME_CLIENT_DISCONNECTED
        if isinstance(e, asyncio.CancelledError):
            raise
        return web.Response(status=499)  # never reaches the client
    except _Shutdown:
        rec.outcome = OUTCOME_SERVER_SHUTDOWN
        raise web.HTTPServiceUnavailable() from None  # a started stream just ends, truncated
    except _EngineError as e:
        rec.outcome = OUTCOME_ERROR
        return await _engine_error(request, str(e), rec)
    except Exception:
        rec.outcome = OUTCOME_ERROR
        log.exception("request %s failed", rec.request_id)
        raise
    finally:
        if not req.done:
            engine.abort(req)
        if rec.outcome == OUTCOME_OK and rec.done_ns is None:
            rec.outcome = OUTCOME_ERROR
        rec.cached_tokens = int(getattr(req, "num_cached_tokens", 0) or 0)
        rec.num_preemptions = int(getattr(req, "num_preemptions", 0) or 0)
        rec.draft_tokens = int(getattr(req, "num_draft_tokens", 0) or 0)
        rec.accepted_tokens = int(getattr(req, "num_accepted_tokens", 0) or 0)
        rec.prefill_done_ns = getattr(req, "prefill_done_ns", None)
        rec.kv_arrived_ns = getattr(req, "kv_arrived_ns", None)
        rec.replica = getattr(req, "replica", None)
        _finish(st, rec, submitted=not getattr(req, "error", None))  # refused: never prefilled


async def _engine_error(request: web.Request, message: str, rec: TruthRecord) -> web.StreamResponse:
    """HTTP 400 before the response started, else an error frame that ends the stream."""
    rec.done_ns = time.perf_counter_ns()
    resp = request.get("sim_response")
    if resp is None or not resp.prepared:
        return _error(RequestError(400, message, "engine_error"))
    await resp.write(ChunkWriter.error(message, 400).encode())
    await resp.write_eof()
    return resp


async def _prefill(request: web.Request, route: ApiRoute) -> web.StreamResponse:
    """A route whose inputs the engine only prefills (one output step each, as a pooling model's forward
    pass): a whole answer; pre-engine faults only."""
    arrival_ns = time.perf_counter_ns()
    st = request.app[STATE_KEY]
    raw = await request.read()
    body: dict[str, Any] | None = None
    try:
        body = json_body(raw)
        p = route.parse(body, get_tokenizer(st.config.model.tokenizer))
        assert isinstance(p, PrefillRequest), f"a {route.flow} route parses into a PrefillRequest"
        inputs, model = p.inputs, p.model
        fault = _admit(st, request, model)
    except RequestError as err:
        st.requests.add(request, raw, body)
        st.stats.rejected(err.status)
        return _error(err)
    st.requests.add(request, raw, body)
    st.stats.received(request.path)
    client_id = request.headers.get("X-Request-Id")
    response_id = route.id_prefix + uuid.uuid4().hex
    rec = TruthRecord(
        request_id=client_id or response_id,
        response_id=response_id,
        path=request.path,
        stream=False,
        arrival_ns=arrival_ns,
        prompt_tokens=sum(len(i) for i in inputs),
    )
    if fault is not None and fault.kind in F.PRE_ENGINE:
        rec.fault = rec.outcome = fault.kind
        try:
            return _pre_engine_fault(request, fault)
        finally:
            rec.done_ns = time.perf_counter_ns()
            _finish(st, rec, submitted=False)
    engine = st.engine
    reqs = [
        _submit(
            st, GenRequest(True, len(ids), False, False, 1, 0, True, model, ids), 1, f"{rec.request_id}.{k}"
        )
        for k, ids in enumerate(inputs)
    ]
    try:
        for r in reqs:
            engine_err = getattr(r, "error", None)
            if engine_err:
                raise _EngineError(str(engine_err))
        await asyncio.gather(*(_next_tokens(r) for r in reqs))
        _check_connected(request)
        headers = {"X-Request-Id": client_id} if client_id else {}
        answer = Answer(response_id, int(time.time()), st.config.model_name, "stop", rec.prompt_tokens)
        resp = web.json_response(route.whole(p, answer), headers=headers)
        await resp.prepare(request)
        await resp.write_eof()
        rec.done_ns = time.perf_counter_ns()
        rec.finish_reason = "stop"
        return resp
    except (ConnectionError, _Disconnected, asyncio.CancelledError) as e:
        rec.outcome = OUTCOME_CLIENT_DISCONNECTED
        if isinstance(e, asyncio.CancelledError):
            raise
        return web.Response(status=499)
    except (_EngineError, _Shutdown) as e:
        rec.outcome = OUTCOME_ERROR
        return await _engine_error(request, str(e) or "server shutting down", rec)
    finally:
        for r in reqs:
            if not r.done:
                engine.abort(r)
        _finish(st, rec, submitted=True)


Admitted = tuple[ComputeRequest, F.Fault | None, TruthRecord, str | None]


async def _admit_compute(request: web.Request, route: ApiRoute) -> Admitted | web.StreamResponse:
    """A compute or job route's HTTP request read and ``admit_compute``-ed; or the error answer."""
    arrival_ns = time.perf_counter_ns()
    raw = await request.read()
    try:
        body = json_body(raw)
    except RequestError as err:
        st = request.app[STATE_KEY]
        st.requests.add(request, raw, None)
        st.stats.rejected(err.status)
        return _error(err)
    fields = {**body, **request.match_info}
    admitted = admit_compute(request.app[STATE_KEY], route, request, raw, fields, arrival_ns)
    return _error(admitted) if isinstance(admitted, RequestError) else admitted


def admit_compute(
    st: SimState, route: ApiRoute, request: Incoming, raw: bytes, body: dict[str, Any], arrival_ns: int = 0
) -> Admitted | RequestError:
    """A compute route's request (``body``: its fields, the path's too) parsed and admitted, the request
    log and the counters updated: the parsed request, its fault, its truth record and the client's id
    (X-Request-Id); or the error. The HTTP routes and the gRPC service (sim/grpc_kserve.py) share it."""
    arrival_ns = arrival_ns or time.perf_counter_ns()
    try:
        c = route.parse(body, get_tokenizer(st.config.model.tokenizer))
        assert isinstance(c, ComputeRequest), f"a {route.flow} route parses into a ComputeRequest"
        fault = _admit(st, request, c.model)
    except RequestError as err:
        st.requests.add(request, raw, body)
        st.stats.rejected(err.status)
        return err
    st.requests.add(request, raw, body)
    st.stats.received(request.path)
    client_id = request.headers.get("X-Request-Id")
    response_id = route.id_prefix + uuid.uuid4().hex
    return (
        c,
        fault,
        TruthRecord(client_id or response_id, response_id, request.path, False, arrival_ns),
        client_id,
    )


async def compute_pass(st: SimState, c: ComputeRequest, rec: TruthRecord) -> None:
    """A compute request's pass on the device, one at a time: its cost model's time over the speedup."""
    async with st.device:
        rec.first_token_ns = time.perf_counter_ns()  # the pass starts: the queue wait ends
        await asyncio.sleep(c.seconds / st.config.speedup)


async def _compute(request: web.Request, route: ApiRoute) -> web.StreamResponse:
    """A route served as one timed pass of a non-LLM model (its cost model's time over the speedup), one
    request at a time on the device: a whole answer; pre-engine faults only."""
    admitted = await _admit_compute(request, route)
    if isinstance(admitted, web.StreamResponse):
        return admitted
    c, fault, rec, client_id = admitted
    st = request.app[STATE_KEY]
    response_id = rec.response_id
    try:
        if fault is not None and fault.kind in F.PRE_ENGINE:
            rec.fault = rec.outcome = fault.kind
            return _pre_engine_fault(request, fault)
        await compute_pass(st, c, rec)
        _check_connected(request)
        headers = {"X-Request-Id": client_id} if client_id else {}
        answer = Answer(response_id, int(time.time()), st.config.model_name, "stop", 0)
        resp = web.json_response(route.whole(c, answer), headers=headers)
        await resp.prepare(request)
        await resp.write_eof()
        rec.done_ns = time.perf_counter_ns()
        rec.finish_reason = "stop"
        return resp
    except (ConnectionError, _Disconnected) as e:
        rec.outcome = OUTCOME_CLIENT_DISCONNECTED
        return web.Response(status=499, text=str(e))
    except asyncio.CancelledError:
        rec.outcome = OUTCOME_CLIENT_DISCONNECTED
        raise
    finally:
        rec.done_ns = rec.done_ns or time.perf_counter_ns()
        _finish(st, rec, submitted=rec.outcome == OUTCOME_OK)


async def _run_job(st: SimState, job: Job, rec: TruthRecord) -> None:
    """A job's pass on the device, in the background; its truth when it ends."""
    try:
        async with st.device:
            job.status, job.started_at = "in_progress", int(time.time())
            rec.first_token_ns = time.perf_counter_ns()
            await asyncio.sleep(job.request.seconds / st.config.speedup)
        job.status, job.completed_at = "completed", int(time.time())
        rec.finish_reason = "stop"
    except asyncio.CancelledError:
        job.status, rec.outcome = "failed", OUTCOME_SERVER_SHUTDOWN
        raise
    finally:
        rec.done_ns = time.perf_counter_ns()
        _finish(st, rec, submitted=True)


async def _job(request: web.Request, route: ApiRoute) -> web.StreamResponse:
    """A route whose pass runs in the background: the POST answers with the created job at once."""
    admitted = await _admit_compute(request, route)
    if isinstance(admitted, web.StreamResponse):
        return admitted
    c, fault, rec, client_id = admitted
    st = request.app[STATE_KEY]
    job_id = rec.response_id
    if fault is not None and fault.kind in F.PRE_ENGINE:
        rec.fault = rec.outcome = fault.kind
        try:
            return _pre_engine_fault(request, fault)
        finally:
            rec.done_ns = time.perf_counter_ns()
            _finish(st, rec, submitted=False)
    job = Job(job_id, c, int(time.time()), st.config.model_name)
    st.jobs[job_id] = job
    while len(st.jobs) > MAX_JOBS:  # the oldest are forgotten
        st.jobs.pop(next(iter(st.jobs)))
    task = asyncio.get_running_loop().create_task(_run_job(st, job, rec))
    st.job_tasks.add(task)
    task.add_done_callback(st.job_tasks.discard)
    headers = {"X-Request-Id": client_id} if client_id else {}
    return web.json_response(cast(JobRoute, route).job_body(job), headers=headers)


def _job_of(request: web.Request) -> Job:
    job = request.app[STATE_KEY].jobs.get(request.match_info["job_id"])
    if job is None:
        raise web.HTTPNotFound(
            text=json.dumps(_error_body("no such job", "not_found", 404)), content_type="application/json"
        )
    return job


def _job_handlers(route: JobRoute) -> tuple[Any, Any]:
    """GET {path}/{job_id} (the job) and GET {path}/{job_id}/content (its result once completed)."""

    async def status(request: web.Request) -> web.StreamResponse:
        return web.json_response(route.job_body(_job_of(request)))

    async def content(request: web.Request) -> web.StreamResponse:
        job = _job_of(request)
        if job.status != "completed":
            body = _error_body(f"job {job.id} is {job.status}, not completed", "invalid_request_error", 409)
            return web.json_response(body, status=409)
        data, ctype = route.job_content(job)
        return web.Response(body=data, content_type=ctype)

    return status, content


_FLOWS: dict[Flow, Callable[[web.Request, ApiRoute], Awaitable[web.StreamResponse]]] = {
    "generate": _generate,
    "prefill": _prefill,
    "compute": _compute,
    "job": _job,
}


def _handler(route: ApiRoute) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of ``route``: its flow, with the route."""
    serve = _FLOWS[route.flow]

    async def handle(request: web.Request) -> web.StreamResponse:
        return await serve(request, route)

    handle.__name__ = f"{route.api}_handler"
    return handle


async def sim_requests(request: web.Request) -> web.Response:
    """The last requests' non-standard headers and body fields (auth values redacted): what clients sent."""
    return web.json_response(request.app[STATE_KEY].requests.items())


def _fits_context(st: SimState, prompt_tokens: int, max_tokens: int | None) -> None:
    """vLLM's refusal of a request longer than the context window (HTTP 400, its message)."""
    limit = st.config.max_model_len
    if limit is None or prompt_tokens + (max_tokens or 0) <= limit:
        return
    raise RequestError(
        400,
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt_tokens + (max_tokens or 0)} tokens ({prompt_tokens} in the messages, "
        f"{max_tokens or 0} in the completion). Please reduce the length of the messages or completion.",
        "BadRequestError",
        "messages",
    )


async def models(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": st.config.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "loadtest-sim",
                    **({"max_model_len": st.config.max_model_len} if st.config.max_model_len else {}),
                }
            ],
        }
    )


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def sim_stats(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    c = st.engine.counters
    out = st.stats.as_dict()
    if st.grpc_port is not None:
        out["grpc_port"] = st.grpc_port
    out.update(
        {
            "config": st.config.describe(),
            "gpu": st.config.gpu.name,
            "model": st.config.model.name,
            "speedup": st.config.speedup,
            "engine": {
                "num_requests_running": st.engine.num_running,
                "num_requests_waiting": st.engine.num_waiting,
                "steps": c.steps,
                "scheduled_tokens": c.scheduled_tokens,
                "generated_tokens": c.generated_tokens,
                "busy_engine_s": c.busy_engine_s,
                "late_steps": c.late_steps,
                "kv_cache_usage_perc": engine_value(st.engine, "kv_usage"),
                "preemptions": engine_value(st.engine, "preemptions"),
                "prefix_cache_queries": engine_value(st.engine, "prefix_queries"),
                "prefix_cache_hits": engine_value(st.engine, "prefix_hits"),
                # Steps since the previous /sim/stats read and how late they ended against schedule.
                "step_lateness": st.engine.take_step_lateness(),
            },
            "faults": st.options.faults,
        }
    )
    if isinstance(st.engine, ReplicaEngine):
        out["router"] = st.engine.policy.name
        out["replicas"] = st.engine.describe()
    return web.json_response(out)


async def metrics(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    assert st.metrics is not None
    return web.Response(body=st.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def sim_truth(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    return web.Response(text=st.truth.jsonl(), content_type="application/x-ndjson")


def _require_key(options: ServerOptions) -> Any:
    """A middleware that refuses /v1/* requests without the key, as OpenAI-compatible servers do."""
    want = (
        f"Bearer {options.api_key}" if options.api_key_header.lower() == "authorization" else options.api_key
    )

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1/") and request.headers.get(options.api_key_header) != want:
            body = {"error": {"message": "invalid or missing API key", "type": "invalid_request_error"}}
            return web.json_response(body, status=401)
        return await handler(request)

    return check


def create_app(
    config: EngineConfig | None = None,
    truth_log: str | Path | None = None,
    options: ServerOptions | None = None,
) -> web.Application:
    """The simulated OpenAI-compatible server; the engine starts and stops with the app."""
    config = config or EngineConfig()
    options = options or ServerOptions()
    app = web.Application(middlewares=[_require_key(options)] if options.api_key else [])
    engine: Engine | DisaggEngine | ReplicaEngine = (
        DisaggEngine(config)
        if config.disagg.enabled
        else ReplicaEngine(config)
        if config.replicas > 1
        else Engine(config)
    )
    state = SimState(
        config=config,
        engine=engine,
        truth=TruthLog(truth_log),
        stats=SimStats(),
        options=options,
        faults=FaultPlan(options.faults, config.seed),
        metrics=SimMetrics(engine, config.model_name),
    )
    app[STATE_KEY] = state

    async def _start(app: web.Application) -> None:
        get_tokenizer(config.model.tokenizer).count_chat([{"role": "user", "content": "warm up"}])
        await state.engine.start()

    async def _stop(app: web.Application) -> None:
        await state.engine.stop()
        state.truth.close()

    app.on_startup.append(_start)
    app.on_shutdown.append(lambda app: state.engine.stop())
    app.on_cleanup.append(_stop)
    for route in ROUTES.values():
        app.router.add_post(route.path, _handler(route))
        if route.flow == "job":
            status, content = _job_handlers(cast(JobRoute, route))
            app.router.add_get(route.path + "/{job_id}", status)
            app.router.add_get(route.path + "/{job_id}/content", content)
    app.router.add_get("/sim/requests", sim_requests)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/sim/stats", sim_stats)
    app.router.add_get("/sim/truth", sim_truth)
    return app
