"""One adapter per API on the client (client/adapters) and one route per API in the engine (sim/routes):
the registries cover every ``api`` the profile schema accepts, and each adapter round-trips a request the
workload builds against the embedded engine (docs/api-surface.md, "Adding an API")."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import typing
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import write_profile

from loadtest.client.adapters import ADAPTERS, adapter_for, register, response_cap
from loadtest.client.adapters.base import CAP_UNLIMITED_BYTES, with_model
from loadtest.client.adapters.chat import ChatAdapter
from loadtest.client.http import Endpoint, Response
from loadtest.client.openai import OpenAIClient, PreparedRequest
from loadtest.client.record import RequestRecord
from loadtest.profile.loader import load_profile
from loadtest.profile.request import Api
from loadtest.sim import SimProcess
from loadtest.sim.routes import ROUTES
from loadtest.sim.server import create_app
from loadtest.tokens.tokenizer import get_tokenizer
from loadtest.workload.builder import Workload
from tests.fault_servers import FaultServer

SCHEMA_APIS = set(typing.get_args(Api))


def test_every_api_the_profile_schema_accepts_has_one_adapter() -> None:
    assert set(ADAPTERS) == SCHEMA_APIS
    for api in SCHEMA_APIS:
        assert api in adapter_for(api).names
    with pytest.raises(ValueError, match="'chat' has an adapter already"):
        register(ChatAdapter())
    with pytest.raises(KeyError):
        adapter_for("nope")


def test_the_engine_serves_the_path_of_every_api_but_raw() -> None:
    """raw replays to any path; kserve_v2_grpc calls the engine's gRPC service (tests/test_kserve_v2_grpc.py);
    every other adapter's path is exactly one engine route's."""
    assert set(ROUTES) == SCHEMA_APIS - {"raw", "kserve_v2_grpc"}
    ep = Endpoint.parse("http://127.0.0.1:8000")
    for api, route in ROUTES.items():
        assert route.api == api
        assert adapter_for(api).path(ep, PreparedRequest("x", api, {}, 0)) == route.path

    async def posts() -> set[str]:
        app = create_app()
        return {r.resource.canonical for r in app.router.routes() if r.method == "POST" and r.resource}

    assert asyncio.run(posts()) == {r.path for r in ROUTES.values()}


def test_the_size_cap_follows_max_tokens_except_for_embeddings_and_rerank() -> None:
    for api in SCHEMA_APIS:
        req = PreparedRequest("x", api, {}, 0, requested_output_tokens=10_000)
        want = (
            CAP_UNLIMITED_BYTES
            if api
            in ("embeddings", "rerank", "kserve_v2", "kserve_v2_grpc", "videogen", "video_jobs", "images")
            else 10_000 * 4096
        )
        assert response_cap(req) == want, api


@pytest.fixture(scope="module")
def engine():
    with SimProcess(speedup=20, seed=7) as sim:
        yield sim


def _truth(sim: SimProcess) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(sim.base_url + "/sim/truth", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return {rec["request_id"]: rec for rec in map(json.loads, lines)}


RAW_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 6,
        "min_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 5, "min_tokens": 5},
    "/v1/responses": {"input": "hello", "max_output_tokens": 4, "min_tokens": 4, "stream": True},
    "/v1/embeddings": {"input": ["one input", "and another"]},
    "/v1/messages": {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "min_tokens": 5,
        "stream": True,
    },
}
CASES = [
    ("chat", True, None),
    ("chat", False, None),
    ("completions", True, None),
    ("completions", False, None),
    ("responses", True, None),
    ("responses", False, None),
    ("embeddings", False, None),
    ("messages", True, None),
    ("messages", False, None),
    ("rerank", False, None),
    ("kserve_v2", False, None),
    ("videogen", False, None),
    ("video_jobs", False, None),
    ("images", False, None),
    *[("raw", bool(body.get("stream")), path) for path, body in RAW_BODIES.items()],
]


def _workload(tmp_path: Path, api: str, stream: bool, raw_path: str | None) -> Workload:
    """The workload of a small profile of ``api``, as a run builds it."""
    fields: dict[str, Any] = {"api": api, "stream": stream}
    if api in ("chat", "completions", "responses", "messages"):
        fields["output_tokens"] = {"dist": "fixed", "value": 7}  # ignore_eos: exactly 7
    if api in ("embeddings", "rerank", "kserve_v2"):
        fields["inputs_per_request"] = 3
        fields["input_tokens"] = {"dist": "fixed", "value": 12}
    if api == "raw":
        assert raw_path is not None
        (tmp_path / "bodies.jsonl").write_text(json.dumps(RAW_BODIES[raw_path]) + "\n")
        fields["raw"] = {"file": "bodies.jsonl", "path": raw_path}
        del fields["stream"]
    prof = write_profile(tmp_path / "p.yaml", **fields)
    data = json.loads(prof.read_text())
    if api in ("embeddings", "rerank", "kserve_v2", "videogen", "video_jobs", "images", "raw"):
        del data["output_tokens"]
    if api == "raw":
        del data["input_tokens"]
    prof.write_text(json.dumps(data))
    return Workload(load_profile(str(prof))[0])


@pytest.mark.parametrize(("api", "stream", "raw_path"), CASES, ids=[f"{a}-{p or s}" for a, s, p in CASES])
def test_each_adapter_round_trips_against_the_embedded_engine(
    engine: SimProcess, tmp_path: Path, api: str, stream: bool, raw_path: str | None
) -> None:
    w = _workload(tmp_path, api, stream, raw_path)
    req = w.request(0)
    assert req.api == api and req.stream == stream
    model = "llama-3.1-8b" if api == "kserve_v2" else None  # the v2 path names the model
    client = OpenAIClient(engine.base_url, model, w.tokenizer)
    try:
        rec = client.send(req, 0, 0.0)
    finally:
        client.close()
    assert rec.outcome == "ok", rec.error
    assert rec.api == api and rec.stream == stream and rec.http_status == 200
    truth = _truth(engine)[rec.wire_id or ""]
    path = raw_path or with_model(adapter_for(api).path(Endpoint.parse(engine.base_url), req), model)
    assert truth["path"] == path and truth["stream"] == stream and truth["outcome"] == "ok"
    assert 0 < rec.sent_ns <= rec.headers_ns <= rec.done_ns
    if api in ("kserve_v2", "videogen", "video_jobs", "images"):  # no tokens: scores, a video, an image
        assert rec.inputs == (3 if api == "kserve_v2" else 1) and rec.first_token_ns == 0
        assert rec.finish_reason == "stop"
        return
    assert rec.prompt_tokens_server == truth["prompt_tokens"] > 0
    if path.endswith("/embeddings"):
        n_in = len(req.body["input"]) if api == "embeddings" else len(RAW_BODIES[path]["input"])
        assert rec.inputs == n_in and rec.first_token_ns == 0 and rec.finish_reason == "stop"
        return
    if api == "rerank":
        assert rec.inputs == len(req.body["documents"]) == 3 and rec.first_token_ns == 0
        return
    want = req.requested_output_tokens
    assert want and rec.completion_tokens_server == truth["completion_tokens"] == want
    assert rec.completion_tokens_client == want  # the engine's pieces are one token each
    assert rec.headers_ns <= rec.first_token_ns <= rec.done_ns and rec.answer_text
    assert len(rec.chunk_ns) == (want if stream else 0)


def test_a_new_api_is_one_adapter_and_its_registration(engine: SimProcess, tmp_path: Path) -> None:
    """An adapter registered under a new name is what the client sends and reads that api's requests with."""

    class WholeChat(ChatAdapter):
        names: tuple[str, ...] = ("test-whole-chat",)

        def streams(self, req: PreparedRequest) -> bool:
            return False  # always a whole chat.completion, whatever the request says

        def classify(self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Any) -> None:
            super().classify(client, rec, req, resp)
            rec.finish_reason = f"whole:{rec.finish_reason}"

    register(WholeChat())
    try:
        client = OpenAIClient(engine.base_url, None, _workload(tmp_path, "chat", True, None).tokenizer)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "min_tokens": 3}
        rec = client.send(PreparedRequest("n-0", "test-whole-chat", body, 1, 3, stream=True), 0, 0.0)
        client.close()
    finally:
        for name in WholeChat.names:
            del ADAPTERS[name]
    assert rec.outcome == "ok" and rec.finish_reason == "whole:length" and rec.chunk_ns == []
    assert rec.completion_tokens_server == 3 and _truth(engine)[rec.wire_id or ""]["stream"] is False


def test_an_answer_whose_reading_raises_is_a_protocol_error_with_its_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever a reader trips on, send() gives the endpoint's protocol_error with the answer's start in
    the error (never ``cancelled``), and logs the cause once, not once per request."""

    class Tripping(ChatAdapter):
        names: tuple[str, ...] = ("test-tripping",)

        def classify(self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Any) -> None:
            super().classify(client, rec, req, resp)
            raise KeyError("a field the reader expected")

    register(Tripping())
    try:
        with FaultServer(["ok"]) as srv, caplog.at_level(logging.WARNING):
            client = OpenAIClient(srv.base_url, None, _workload(tmp_path, "chat", True, None).tokenizer)
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            recs = [
                client.send(PreparedRequest(f"t-{i}", "test-tripping", body, 1, 4), 0, 0.0) for i in range(3)
            ]
            client.close()
    finally:
        del ADAPTERS["test-tripping"]
    assert all(r.outcome == "protocol_error" and r.done_ns > 0 for r in recs)
    assert all("KeyError" in r.error and "hello" in r.error for r in recs), recs[0].error
    logged = [m for m in caplog.messages if "could not be read" in m]
    assert len(logged) == 1 and "KeyError" in logged[0]


def _whole(api: str, obj: object) -> RequestRecord:
    req = PreparedRequest("w", api, {"documents": ["a"], "input": ["x"]}, 1, 4, stream=False)
    rec = RequestRecord(request_id="w", api=api, stream=False)
    resp = Response(
        status=200, headers={"content-type": "application/json"}, chunks=[json.dumps(obj).encode()], times=[5]
    )
    adapter_for(api).classify(_CLIENT, rec, req, resp)
    return rec


_CLIENT = OpenAIClient("http://127.0.0.1:9", None, get_tokenizer("llama3"))


def test_whole_answers_off_the_api_shape_are_endpoint_outcomes() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"city": "Paris"}}}
    msg = {"role": "assistant", "content": None, "tool_calls": [call]}
    rec = _whole("chat", {"choices": [{"message": msg, "finish_reason": "tool_calls"}]})
    assert rec.outcome == "protocol_error" and "arguments as a JSON object" in rec.error
    assert rec.tool_calls_text == '{"city":"Paris"}' and rec.error.endswith(': {"city":"Paris"}')
    for garbage in ({"choices": "abc"}, {"choices": [1, None, "x"]}, {"choices": [{"message": "hi"}]}):
        assert _whole("chat", garbage).outcome in ("protocol_error", "empty"), garbage
    ok = _whole(
        "chat",
        {
            "choices": [{"message": {"content": "hi"}}],
            "usage": {"prompt_tokens": "7", "completion_tokens": -1},
        },
    )
    assert ok.outcome == "ok" and ok.prompt_tokens_server is None and ok.completion_tokens_server is None
    call = {"type": "function_call", "name": "f", "arguments": {"city": "Paris"}}
    rec = _whole("responses", {"object": "response", "status": "completed", "output": [call]})
    assert rec.outcome == "protocol_error" and "arguments as a JSON object" in rec.error
    for api, obj in (
        ("responses", {"object": "response", "output": [{"type": "message", "content": "x"}], "usage": "u"}),
        ("embeddings", {"data": [{"embedding": [0.1]}], "usage": [1]}),
    ):
        rec = _whole(api, obj)
        assert (
            rec.outcome in ("ok", "empty", "stream_error", "protocol_error")
            and rec.prompt_tokens_server is None
        )


# Run in its own process: importing Locust monkey-patches the interpreter (gevent), which the servers
# this file starts in threads must not be.
_LAST_GUARD = """
import json, logging, sys
from loadtest.client.adapters import register
from loadtest.client.adapters.chat import ChatAdapter
from loadtest.client.openai import PreparedRequest
from loadtest.locust.context import RunContext
from loadtest.locust.settings import RunSettings
from loadtest.locust.sending import send_and_account

class Unencodable(ChatAdapter):
    names = ("test-unencodable",)

    def body(self, client, req):
        raise TypeError("a body that cannot be encoded")

register(Unencodable())
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
ctx = RunContext(RunSettings("r", sys.argv[1], sys.argv[2], sys.argv[3], 1.0, 1), 0, 1, "records.jsonl")
client = ctx.new_client()
now_ns, now_epoch = RunContext.now()
req = PreparedRequest("u", "test-unencodable", {}, 1, 4)
recs = [send_and_account(ctx, client, req, now_ns, now_epoch) for _ in range(2)]
client.close()
ctx.log.close()
print(json.dumps({"outcomes": [r.outcome for r in recs], "error": recs[0].error, "in_flight": ctx.in_flight}))
"""


def test_an_exception_outside_the_reader_is_still_an_endpoint_outcome_not_cancelled(tmp_path: Path) -> None:
    """The last guard (locust/users.send_and_account): whatever escapes send() is accounted once as a
    protocol_error, never ``cancelled`` and never a traceback; only the generator's stop is ``cancelled``."""
    prof = write_profile(tmp_path / "p.yaml")
    with FaultServer(["ok"]) as srv:
        res = subprocess.run(
            [sys.executable, "-c", _LAST_GUARD, str(prof), srv.base_url, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["outcomes"] == ["protocol_error"] * 2 and "TypeError" in got["error"] and got["in_flight"] == 0
    logged = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in logged] == ["protocol_error"] * 2
    assert res.stderr.count("could not be read") == 1  # one line per cause, not per request
