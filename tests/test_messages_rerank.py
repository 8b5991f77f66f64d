"""The Anthropic Messages API and rerank through the adapter layer: literal Messages event bytes parsed, runs
of both against the embedded engine counted exactly, the official anthropic SDK reading the engine's stream."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import read_lines, run_cli, write_profile

from loadtest.client.adapters import adapter_for
from loadtest.client.adapters.base import classify_http
from loadtest.client.http import Response
from loadtest.client.messages_sse import parse_messages_stream
from loadtest.client.openai import OpenAIClient, PreparedRequest
from loadtest.client.record import RequestRecord
from loadtest.sim import SimProcess
from loadtest.tokens.tokenizer import get_tokenizer


def ev(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def delta(index: int, **d: Any) -> bytes:
    return ev("content_block_delta", index=index, delta=d)


START = ev(
    "message_start",
    message={
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "stop_reason": None,
        "usage": {"input_tokens": 20, "cache_read_input_tokens": 5, "output_tokens": 1},
    },
)
STREAM = [
    START,
    ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": "", "signature": ""}),
    ev("ping"),
    delta(0, type="thinking_delta", thinking=" Let"),
    delta(0, type="thinking_delta", thinking=" me"),
    delta(0, type="signature_delta", signature="abc"),
    ev("content_block_stop", index=0),
    ev("content_block_start", index=1, content_block={"type": "text", "text": ""}),
    delta(1, type="text_delta", text=""),
    delta(1, type="text_delta", text=" Hi"),
    ev("content_block_stop", index=1),
    ev(
        "content_block_start",
        index=2,
        content_block={"type": "tool_use", "id": "t", "name": "f", "input": {}},
    ),
    delta(2, type="input_json_delta", partial_json='{"a":'),
    delta(2, type="input_json_delta", partial_json=" 1}"),
    ev("content_block_stop", index=2),
    ev("message_delta", delta={"stop_reason": "tool_use", "stop_sequence": None}, usage={"output_tokens": 6}),
    ev("message_stop"),
]
# the events that carry a token: two thinking deltas, one text delta, two input_json deltas
TOKEN_EVENTS = [3, 4, 9, 12, 13]


def _split(events: list[bytes]) -> tuple[list[bytes], list[int], list[int]]:
    """The stream's bytes in reads that cut every event in two (its last byte in the next read), the read
    times, and the time each event completed."""
    reads: list[bytes] = []
    ends: list[int] = []
    carry = b""
    for k, e in enumerate(events):
        cut = len(e) // 2
        reads.append(carry + e[:cut])
        carry = e[cut:]
        ends.append(1000 * (k + 2))  # its second half arrives with read k + 1
    reads.append(carry)
    return reads, [1000 * (k + 1) for k in range(len(reads))], ends


def test_every_event_type_is_read_from_reads_that_split_each_event() -> None:
    reads, times, ends = _split(STREAM)
    s = parse_messages_stream(reads, times)
    assert s.chunk_ns == [ends[k] for k in TOKEN_EVENTS]
    assert s.first_token_ns == ends[3] and s.first_answer_ns == ends[9]  # thinking first, then text
    assert s.reasoning_text == " Let me" and s.answer_text == " Hi" and s.tool_text == '{"a": 1}'
    assert s.stop_reason == "tool_use" and s.saw_stop and s.complete and not s.error and not s.malformed
    assert (s.usage.input_tokens, s.usage.cache_read_input_tokens, s.usage.output_tokens) == (20, 5, 6)
    # CRLF line endings and one read: the same events, every one at that read's time
    crlf = parse_messages_stream([b"".join(STREAM).replace(b"\n", b"\r\n")], [7])
    assert crlf.chunk_ns == [7] * len(TOKEN_EVENTS) and crlf.tool_text == '{"a": 1}'


def _client() -> OpenAIClient:
    return OpenAIClient("http://127.0.0.1:9", None, get_tokenizer("llama3"))


def _classify(api: str, body: bytes, status: int = 200, stream: bool = True, **req: Any) -> RequestRecord:
    """An answer of ``body`` read as ``api`` reads it, from one read at time 5."""
    ct = "text/event-stream" if stream else "application/json"
    resp = Response(status, {"content-type": ct}, 1, [body], [5], complete=True)
    prepared = PreparedRequest("r", api, dict(req), 10, 8, stream=stream)
    rec = RequestRecord("r", requested_output_tokens=8, stream=stream)
    if not classify_http(rec, resp):
        adapter_for(api).classify(_client(), rec, prepared, resp)
    return rec


def test_a_messages_record_maps_stop_reason_usage_and_errors() -> None:
    rec = _classify("messages", b"".join(STREAM))
    assert rec.outcome == "ok" and rec.finish_reason == "tool_calls" and len(rec.chunk_ns) == 5
    assert rec.prompt_tokens_server == 25 and rec.cached_tokens_server == 5  # input + cache reads
    assert rec.completion_tokens_server == 6 and rec.reasoning_tokens_client > 0
    err = ev("error", error={"type": "overloaded_error", "message": "Overloaded"})
    rec = _classify("messages", b"".join(STREAM[:10]) + err)
    assert rec.outcome == "stream_error" and "overloaded_error: Overloaded" in rec.error
    rec = _classify("messages", b"".join(STREAM[:10]))  # no message_delta, no message_stop
    assert rec.outcome == "truncated"
    overloaded = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    rec = _classify("messages", overloaded, status=529)
    assert rec.outcome == "http_5xx" and rec.error == "HTTP 529: Overloaded"
    too_long = b'{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long"}}'
    assert _classify("messages", too_long, status=400).outcome == "context_length"
    whole = {
        "type": "message",
        "content": [{"type": "thinking", "thinking": " hm"}, {"type": "text", "text": " yes"}],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 9, "output_tokens": 2},
    }
    rec = _classify("messages", json.dumps(whole).encode(), stream=False)
    assert rec.outcome == "ok" and rec.finish_reason == "length" and rec.first_token_ns == 5
    assert rec.answer_text == " yes" and rec.reasoning_tokens_client == 1 and rec.prompt_tokens_server == 9


def test_a_rerank_answer_must_score_the_documents_it_was_asked_for() -> None:
    docs = {"query": "q", "documents": ["a", "b", "c"], "top_n": 2}
    good = {"results": [{"index": 2, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}]}
    rec = _classify(
        "rerank", json.dumps({**good, "usage": {"total_tokens": 12}}).encode(), stream=False, **docs
    )
    assert rec.outcome == "ok" and rec.inputs == 3 and rec.prompt_tokens_server == 12
    bad = {"results": [{"index": 5, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}]}
    assert _classify("rerank", json.dumps(bad).encode(), stream=False, **docs).outcome == "protocol_error"
    one = {"results": good["results"][:1]}
    assert _classify("rerank", json.dumps(one).encode(), stream=False, **docs).outcome == "protocol_error"


def test_messages_requests_carry_the_version_header_and_the_profiles_auth() -> None:
    client = _client()
    req = PreparedRequest("r", "messages", {"messages": [], "max_tokens": 3}, 1, 3)
    raw = client.encode(req).decode()
    assert raw.startswith("POST /v1/messages ") and "anthropic-version: 2023-06-01\r\n" in raw
    assert json.loads(raw.split("\r\n\r\n", 1)[1])["stream"] is True
    client._headers["Anthropic-Version"] = "2099-01-01"  # a profile header of that name wins
    raw = client.encode(req).decode()
    assert "Anthropic-Version: 2099-01-01" in raw and "anthropic-version: 2023" not in raw


# ---- against the embedded engine ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine():
    with SimProcess(speedup=5, seed=11) as sim:
        yield sim


def _get(sim: SimProcess, path: str) -> Any:
    with urllib.request.urlopen(sim.base_url + path, timeout=10) as r:
        return r.read()


def _run(prof: Path, out: Path, host: str) -> dict[str, Any]:
    args = ["run", "--profile", str(prof), "--out", str(out), "--no-telemetry", "--duration", "3"]
    res = run_cli([*args, "--host", host], timeout=120)
    run = json.loads((out / "run.json").read_text())
    assert res.returncode == run["verdict"]["exit_code"] == 0, res.stderr
    return run


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_messages_run_counts_what_the_engine_generated(
    engine: SimProcess, tmp_path: Path, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ant-0123456789")
    prof = write_profile(
        tmp_path / "m.yaml",
        api="messages",
        stream=stream,
        reasoning=True,
        system_prompt_tokens=24,
        output_tokens={"dist": "fixed", "value": 10},
        request={"auth": "api-key-header", "auth_header": "x-api-key"},
    )
    run = _run(prof, tmp_path / "run", engine.base_url)
    lines = read_lines(sorted((tmp_path / "run").glob("records*.jsonl")))
    truth = {t["request_id"]: t for t in map(json.loads, _get(engine, "/sim/truth").decode().splitlines())}
    m = run["metrics"]
    assert m["requests"]["ok"] == m["requests"]["completed"] == len(lines) > 3
    for ln in lines:
        t = truth[ln["wire_id"]]
        assert t["path"] == "/v1/messages" and t["stream"] is stream and t["outcome"] == "ok"
        assert ln["usage_completion_tokens"] == ln["output_tokens"] == t["completion_tokens"] == 10
        assert ln["usage_prompt_tokens"] == t["prompt_tokens"] and ln["finish_reason"] == "length"
        assert ln["prompt_tokens"] == t["prompt_tokens"]  # the system prompt went as ``system``, counted
        assert ln["reasoning_tokens"] == t["reasoning_tokens"] == 6  # thinking: 60 % of the output
        assert len(ln["chunks_us"]) == (10 if stream else 0)
        if stream:  # the first token is the first thinking delta; the answer comes after it
            assert ln["ttft_us"] == ln["chunks_us"][0] <= ln["first_answer_us"] == ln["chunks_us"][6]
    assert m["tokens"]["counted_output_total"] == 10 * len(lines) and m["tokens"]["mismatched_requests"] == 0
    sent = [r for r in json.loads(_get(engine, "/sim/requests")) if r["path"] == "/v1/messages"]
    assert sent and all(r["headers"]["anthropic-version"] == "2023-06-01" for r in sent)
    assert all(
        r["headers"]["x-api-key"] == "<17 chars>" and "authorization" not in r["headers"] for r in sent
    )
    body = sent[-1]["body"]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024} and body["max_tokens"] == 10
    assert body["stream"] is stream


def test_a_rerank_run_reports_documents_per_second(engine: SimProcess, tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "r.yaml", api="rerank", inputs_per_request=6, input_tokens={"dist": "fixed", "value": 20}
    )
    data = json.loads(prof.read_text())
    del data["output_tokens"]
    prof.write_text(json.dumps(data))
    run = _run(prof, tmp_path / "run", engine.base_url)
    m = run["metrics"]
    rr = m["rerank"]
    assert "embeddings" not in m or m["embeddings"] is None
    assert rr["requests"] == rr["requests_ok"] == m["requests"]["ok"] > 5
    assert rr["documents_total"] == 6 * rr["requests_ok"] and rr["documents_per_s"] > 0
    assert 0 < rr["latency_ms"]["p50"] <= rr["latency_ms"]["p99"]
    assert m["latency_ms"]["ttft"]["count"] == 0 and m["tokens"]["counted_output_total"] == 0
    lines = read_lines(sorted((tmp_path / "run").glob("records*.jsonl")))
    truth = {t["request_id"]: t for t in map(json.loads, _get(engine, "/sim/truth").decode().splitlines())}
    for ln in lines:
        assert ln["inputs"] == 6 and ln["usage_prompt_tokens"] == truth[ln["wire_id"]]["prompt_tokens"]
    assert rr["input_tokens_total"] == sum(ln["prompt_tokens"] for ln in lines)


def test_the_official_anthropic_sdk_reads_the_engines_messages(engine: SimProcess) -> None:
    anthropic = pytest.importorskip("anthropic")
    model = json.loads(_get(engine, "/v1/models"))["data"][0]["id"]
    client = anthropic.Anthropic(base_url=engine.base_url, api_key="k", max_retries=0)
    kw: dict[str, Any] = {
        "model": model,
        "max_tokens": 9,
        "system": "be brief",
        "messages": [{"role": "user", "content": "hello there"}],
        "extra_body": {"min_tokens": 9, "ignore_eos": True},
    }
    with client.messages.stream(thinking={"type": "enabled", "budget_tokens": 1024}, **kw) as s:
        kinds = [e.type for e in s]
        msg = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_stop" in kinds
    assert [b.type for b in msg.content] == ["thinking", "text"] and msg.stop_reason == "max_tokens"
    assert msg.usage.output_tokens == 9 and msg.content[1].text
    whole = client.messages.create(**kw)
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 9
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    with client.messages.stream(tools=tools, **kw) as s:
        call = s.get_final_message()
    assert call.stop_reason == "tool_use" and call.content[0].type == "tool_use"
    assert call.content[0].name == "get_weather" and isinstance(call.content[0].input, dict)


def test_messages_stream_faults_are_classified_like_chat(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "m.yaml",
        api="messages",
        output_tokens={"dist": "fixed", "value": 12},
        load={"concurrency": 4},
    )
    out = tmp_path / "run"
    faults = "error_frame=20%,no_done=20%,malformed_chunk=20%,no_usage=20%"
    args = ["run", "--profile", str(prof), "--out", str(out), "--no-telemetry", "--duration", "3"]
    res = run_cli([*args, "--engine-speedup", "5", "--engine-faults", faults], timeout=120)
    assert res.returncode == 12, res.stderr  # the error rate over the default limit
    lines = read_lines(sorted(out.glob("records*.jsonl")))
    seen = {(ln["outcome"], (ln["error"] or "").split(":")[0]) for ln in lines}
    assert seen == {
        ("ok", ""),
        ("stream_error", "error event"),  # the engine's error event mid-stream
        ("stream_error", "1 malformed event(s) in the stream"),
        ("truncated", "stream ended without message_stop or a stop_reason"),
    }
    ok = [ln for ln in lines if ln["outcome"] == "ok"]
    assert all(ln["output_tokens"] == 12 for ln in ok)
    no_usage = [
        ln for ln in ok if ln["usage_completion_tokens"] is None
    ]  # message_start's count is no answer's
    assert no_usage and all(ln["usage_prompt_tokens"] for ln in no_usage)
    assert all(ln["usage_completion_tokens"] == 12 for ln in ok if ln not in no_usage)


def _post(sim: SimProcess, path: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(
        sim.base_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def test_the_engines_messages_stream_has_the_documented_event_order(engine: SimProcess) -> None:
    body = {
        "max_tokens": 5,
        "min_tokens": 5,
        "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    events = [
        json.loads(e.split("\ndata: ", 1)[1])
        for e in _post(engine, "/v1/messages", body).decode().split("\n\n")
        if e
    ]
    kinds = [
        (e["type"], (e.get("delta") or {}).get("type") or (e.get("content_block") or {}).get("type"))
        for e in events
    ]
    assert kinds == [
        ("message_start", None),
        ("content_block_start", "thinking"),
        ("ping", None),
        *[("content_block_delta", "thinking_delta")] * 3,  # 60 % of 5 tokens
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", "text"),
        *[("content_block_delta", "text_delta")] * 2,
        ("content_block_stop", None),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens" and events[-2]["usage"]["output_tokens"] == 5
    assert events[0]["message"]["usage"]["input_tokens"] > 0


def test_the_engines_rerank_sorts_the_scores_and_keeps_top_n(engine: SimProcess) -> None:
    docs = ["alpha beta", "gamma", {"text": "delta epsilon zeta"}, "eta"]
    ans = json.loads(_post(engine, "/v1/rerank", {"query": "which one", "documents": docs, "top_n": 3}))
    scores = [r["relevance_score"] for r in ans["results"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True) and ans["usage"]["total_tokens"] > 0
    texts = [d if isinstance(d, str) else d["text"] for d in docs]
    assert all(r["document"]["text"] == texts[r["index"]] for r in ans["results"])
    again = json.loads(_post(engine, "/v1/rerank", {"query": "which one", "documents": docs}))
    assert [r["index"] for r in again["results"][:3]] == [r["index"] for r in ans["results"]]  # deterministic
    assert sorted(r["index"] for r in again["results"]) == [0, 1, 2, 3]
