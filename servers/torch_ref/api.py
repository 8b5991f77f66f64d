"""The aiohttp app: OpenAI chat and text completions (streamed or not), /v1/models, /health, /metrics."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from loadtest.sim.protocol import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    DONE_EVENT,
    ChunkWriter,
    RequestError,
    _dumps,
    json_body,
    parse_request,
    usage,
)
from loadtest.tokens.tokenizer import Tokenizer
from servers.torch_ref.engine import Engine
from servers.torch_ref.metrics import CONTENT_TYPE, RequestTimes, TorchRefMetrics
from servers.torch_ref.scheduler import Sequence
from servers.torch_ref.text import IncrementalDecoder

Event = tuple[list[int], str | None, str | None]  # new ids, finish reason, error


class Dispatcher:
    """Hands the engine thread's per-step events to each request's queue on the event loop."""

    def __init__(self) -> None:
        self.queues: dict[Sequence, asyncio.Queue[Event]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def _dispatch(self, events: list[tuple[Sequence, list[int], str | None, str | None]]) -> None:
        for seq, ids, reason, err in events:
            q = self.queues.get(seq)
            if q is not None:
                q.put_nowait((ids, reason, err))

    def deliver(self, events: list[tuple[Sequence, list[int], str | None, str | None]]) -> None:
        """Thread-safe: called by the engine thread once per step."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._dispatch, events)


@dataclass
class ServerState:
    engine: Engine
    dispatcher: Dispatcher
    tokenizer: Tokenizer
    model_name: str
    max_model_len: int
    metrics: TorchRefMetrics
    info: dict[str, Any] = field(default_factory=dict)


STATE = web.AppKey("torch_ref_state", ServerState)


def _error(status: int, message: str, code: str, param: str | None = None) -> web.Response:
    return web.json_response(RequestError(status, message, code, param).body(), status=status)


class _Request:
    """One (chat) completion in flight: parsed fields, its engine sequence, its text and times."""

    def __init__(self, st: ServerState, raw: bytes, chat: bool) -> None:
        self.arrival_ns = time.perf_counter_ns()
        self.chat = chat
        body = json_body(raw)
        g = parse_request(body, chat, st.tokenizer)
        if g.model and g.model != st.model_name and g.model.rsplit("/", 1)[-1] != st.model_name:
            raise RequestError(404, f"The model `{g.model}` does not exist.", "model_not_found", "model")
        temp = body.get("temperature", 1.0)
        if temp is None:
            temp = 1.0
        if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp < 0:
            raise RequestError(400, "'temperature' must be a number >= 0", "invalid_value", "temperature")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise RequestError(400, "'seed' must be an integer", "invalid_value", "seed")
        n_prompt = len(g.prompt_ids)
        room = st.max_model_len - n_prompt + 1
        if n_prompt < 1 or room < 1:
            raise RequestError(
                400,
                f"This model's maximum context length is {st.max_model_len} tokens; the prompt has {n_prompt}.",
                "context_length_exceeded",
                "messages" if chat else "prompt",
            )
        max_tokens = g.max_tokens if g.max_tokens is not None else room
        if max_tokens > room:
            raise RequestError(
                400,
                f"This model's maximum context length is {st.max_model_len} tokens; {n_prompt} prompt tokens "
                f"plus max_tokens {max_tokens} do not fit.",
                "context_length_exceeded",
                "max_tokens",
            )
        self.g = g
        self.stream = g.stream
        self.include_usage = g.include_usage
        self.seq = Sequence(
            request_id=uuid.uuid4().hex,
            prompt_ids=list(g.prompt_ids),
            max_tokens=max_tokens,
            min_tokens=min(g.min_tokens, max_tokens),
            ignore_eos=g.ignore_eos,
            temperature=float(temp),
            seed=seed,
            arrival_ns=self.arrival_ns,
        )
        self.times = RequestTimes(arrival_ns=self.arrival_ns, prompt_tokens=n_prompt)
        self.decoder = IncrementalDecoder(st.tokenizer, g.prompt_ids[-4:])
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def head(self, model: str) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return f'data: {{"id":"{self.id}","object":"{obj}","created":{self.created},"model":{_dumps(model)},'

    def event(self, model: str, text: str | None, finish: str | None = None, role: bool = False) -> str:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        return self.head(model) + f'"choices":[{_dumps(choice)}]}}\n\n'

    def usage(self) -> dict[str, Any]:
        return usage(self.times.prompt_tokens, self.times.completion_tokens)


async def _events(st: ServerState, r: _Request):  # noqa: ANN202 - async generator of (text, finish)
    """Text deltas and the finish reason from the engine; raises RuntimeError on an engine error."""
    q: asyncio.Queue[Event] = asyncio.Queue()
    st.dispatcher.queues[r.seq] = q
    st.engine.submit(r.seq)
    try:
        while True:
            ids, reason, err = await q.get()
            if err:
                raise RuntimeError(err)
            text = r.decoder.push(ids) if ids else ""
            if ids:
                now = time.perf_counter_ns()
                r.times.completion_tokens += len(ids)
                r.times.token_ns.extend([now] * len(ids))
                if r.times.first_token_ns is None:
                    r.times.first_token_ns = now
            yield text, reason
            if reason is not None:
                r.times.finish_reason = reason
                return
    finally:
        st.dispatcher.queues.pop(r.seq, None)
        if r.times.finish_reason is None:
            st.engine.abort(r.seq)
        r.times.done_ns = time.perf_counter_ns()
        st.metrics.finished(r.times, submitted=True)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    st = request.app[STATE]
    try:
        r = _Request(st, await request.read(), chat)
    except RequestError as e:
        return _error(e.status, e.message, e.code, e.param)
    headers = {}
    if rid := request.headers.get("X-Request-Id"):
        headers["X-Request-Id"] = rid
    if not r.stream:
        parts: list[str] = []
        reason = None
        try:
            async for text, finish in _events(st, r):
                parts.append(text)
                reason = finish
        except RuntimeError as e:
            return _error(500, str(e), "engine_error")
        text = "".join(parts)
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=reason)
        body = {
            "id": r.id,
            "object": "chat.completion" if chat else "text_completion",
            "created": r.created,
            "model": st.model_name,
            "choices": [choice],
            "usage": r.usage(),
        }
        return web.json_response(body, headers=headers)
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await resp.prepare(request)
    name = st.model_name
    try:
        if chat:
            await resp.write(r.event(name, None, role=True).encode())
        async for text, reason in _events(st, r):
            out = r.event(name, text) if text else ""
            if reason is not None:
                out += r.event(name, None if chat else "", finish=reason)
                if r.include_usage:
                    out += r.head(name) + f'"choices":[],"usage":{_dumps(r.usage())}}}\n\n'
                await resp.write(out.encode() + DONE_EVENT)
            elif out:
                await resp.write(out.encode())
    except RuntimeError as e:
        await resp.write(ChunkWriter.error(str(e), 500).encode())
    except (ConnectionError, asyncio.CancelledError):
        raise
    await resp.write_eof()
    return resp


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def models(request: web.Request) -> web.Response:
    st = request.app[STATE]
    entry = {
        "id": st.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "torch-ref",
        "max_model_len": st.max_model_len,
    }
    return web.json_response({"object": "list", "data": [entry]})


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def metrics(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return web.Response(body=st.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def stats(request: web.Request) -> web.Response:
    """The server's configuration and engine counters (JSON)."""
    st = request.app[STATE]
    c = st.engine.counters
    out = dict(st.info)
    out["engine"] = {
        "steps": c.steps,
        "prompt_tokens": c.prompt_tokens,
        "generated_tokens": c.generated_tokens,
        "busy_s": round(c.busy_s, 6),
        "max_running": c.max_running,
        "max_waiting": c.max_waiting,
        "num_requests_running": st.engine.num_running,
        "num_requests_waiting": st.engine.num_waiting,
        "kv_cache_usage_perc": st.engine.kv_usage,
    }
    return web.json_response(out)


def create_app(state: ServerState) -> web.Application:
    """The app; the engine thread starts and stops with it."""
    app = web.Application()
    app[STATE] = state

    async def _start(app: web.Application) -> None:
        state.dispatcher.loop = asyncio.get_running_loop()
        state.engine.start()

    async def _stop(app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, state.engine.stop)

    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    app.router.add_post(CHAT_PATH, chat_completions)
    app.router.add_post(COMPLETIONS_PATH, completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/stats", stats)
    return app
