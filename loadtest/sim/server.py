"""The aiohttp app: OpenAI-compatible routes in front of the simulated engine, plus /sim/* truth."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from loadtest.sim.engine import Engine
from loadtest.sim.presets import EngineConfig
from loadtest.sim.protocol import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    DONE_EVENT,
    ChunkWriter,
    GenRequest,
    RequestError,
    full_response,
    parse_request,
)
from loadtest.sim.request import SHUTDOWN, SimRequest
from loadtest.sim.truth import (
    OUTCOME_CLIENT_DISCONNECTED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_SERVER_SHUTDOWN,
    SimStats,
    TruthLog,
    TruthRecord,
)
from loadtest.workload.text import token_piece
from loadtest.workload.tokenizer import get_tokenizer

log = logging.getLogger(__name__)


@dataclass
class SimState:
    """Everything the handlers share."""

    config: EngineConfig
    engine: Engine
    truth: TruthLog
    stats: SimStats


STATE_KEY = web.AppKey("sim_state", SimState)


def _error(err: RequestError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


def _model_ok(config: EngineConfig, requested: str | None) -> bool:
    if requested is None or requested == "":
        return True
    names = {config.model_name.lower(), config.model.name.lower()}
    r = requested.lower()
    return r in names or r.rsplit("/", 1)[-1] in names


class _Disconnected(Exception):
    pass


class _Shutdown(Exception):
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
    if out[-1] == SHUTDOWN:
        raise _Shutdown
    return out


async def _stream(
    request: web.Request,
    st: SimState,
    g: GenRequest,
    req: SimRequest,
    rec: TruthRecord,
    finish_reason: str,
    headers: dict[str, str],
) -> web.StreamResponse:
    created = int(time.time())
    cw = ChunkWriter(g.chat, rec.response_id, created, st.config.model_name)
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await resp.prepare(request)
    if g.chat:
        await resp.write(cw.role())
    target = req.target_tokens
    while rec.completion_tokens < target:
        idx = await _next_tokens(req)
        parts = [cw.token(i) for i in idx]
        last = idx[-1] == target - 1
        if last:
            parts.append(cw.finish(finish_reason))
            if g.include_usage:
                parts.append(cw.usage(rec.prompt_tokens, target))
        data = "".join(parts).encode()
        if last:
            data += DONE_EVENT
        await resp.write(data)
        ns = time.perf_counter_ns()
        if rec.first_token_ns is None:
            rec.first_token_ns = ns
        rec.token_ns.extend([ns] * len(idx))
        rec.completion_tokens += len(idx)
        if last:
            rec.done_ns = ns
    rec.finish_reason = finish_reason
    await resp.write_eof()
    return resp


async def _full(
    request: web.Request,
    st: SimState,
    g: GenRequest,
    req: SimRequest,
    rec: TruthRecord,
    finish_reason: str,
    headers: dict[str, str],
) -> web.Response:
    target = req.target_tokens
    while rec.completion_tokens < target:
        idx = await _next_tokens(req)
        _check_connected(request)
        ns = time.perf_counter_ns()
        if rec.first_token_ns is None:
            rec.first_token_ns = ns
        rec.token_ns.extend([ns] * len(idx))
        rec.completion_tokens += len(idx)
    text = "".join(token_piece(i) for i in range(target))
    body = full_response(
        g.chat,
        rec.response_id,
        int(time.time()),
        st.config.model_name,
        text,
        finish_reason,
        rec.prompt_tokens,
        target,
    )
    resp = web.json_response(body, headers=headers)
    await resp.prepare(request)
    await resp.write_eof()
    rec.done_ns = time.perf_counter_ns()
    rec.finish_reason = finish_reason
    return resp


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    arrival_ns = time.perf_counter_ns()
    st = request.app[STATE_KEY]
    try:
        g = parse_request(await request.read(), chat, get_tokenizer(st.config.model.tokenizer))
        if not _model_ok(st.config, g.model):
            raise RequestError(404, f"The model `{g.model}` does not exist.", "model_not_found", "model")
    except RequestError as err:
        st.stats.rejected(err.status)
        return _error(err)
    path = request.path
    st.stats.received(path)
    engine = st.engine
    target = engine.target_length(g.max_tokens, g.min_tokens, g.ignore_eos)
    limit = g.max_tokens if g.max_tokens is not None else st.config.output_len.cap
    finish_reason = "length" if target >= limit else "stop"
    response_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
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
    req = engine.submit(g.prompt_tokens, target, rec.request_id)
    try:
        if g.stream:
            return await _stream(request, st, g, req, rec, finish_reason, headers)
        return await _full(request, st, g, req, rec, finish_reason, headers)
    except (ConnectionError, _Disconnected, asyncio.CancelledError) as e:
        rec.outcome = OUTCOME_CLIENT_DISCONNECTED
        if isinstance(e, asyncio.CancelledError):
            raise
        return web.Response(status=499)  # never reaches the client
    except _Shutdown:
        rec.outcome = OUTCOME_SERVER_SHUTDOWN
        raise web.HTTPServiceUnavailable() from None  # a started stream just ends, truncated
    except Exception:
        rec.outcome = OUTCOME_ERROR
        log.exception("request %s failed", rec.request_id)
        raise
    finally:
        if not req.done:
            engine.abort(req)
        if rec.outcome == OUTCOME_OK and rec.done_ns is None:
            rec.outcome = OUTCOME_ERROR
        st.truth.add(rec)
        st.stats.finished(rec)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def models(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {"id": st.config.model_name, "object": "model", "created": 0, "owned_by": "loadtest-sim"}
            ],
        }
    )


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def sim_stats(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    c = st.engine.counters
    out = st.stats.as_dict()
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
            },
        }
    )
    return web.json_response(out)


async def sim_truth(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    return web.Response(text=st.truth.jsonl(), content_type="application/x-ndjson")


def create_app(config: EngineConfig | None = None, truth_log: str | Path | None = None) -> web.Application:
    """The simulated OpenAI-compatible server; the engine starts and stops with the app."""
    config = config or EngineConfig()
    app = web.Application()
    state = SimState(config=config, engine=Engine(config), truth=TruthLog(truth_log), stats=SimStats())
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
    app.router.add_post(CHAT_PATH, chat_completions)
    app.router.add_post(COMPLETIONS_PATH, completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/sim/stats", sim_stats)
    app.router.add_get("/sim/truth", sim_truth)
    return app
