"""The simulated engine's API surface: /metrics, usage details, reasoning, tool calls, the openai client."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.sim import SimProcess
from loadtest.tokens.tokenizer import get_tokenizer
from loadtest.workload.text import synth_text
from tests.test_sim import CHAT, COMPLETIONS, chat_body, request, sse_events

MODEL = "Llama-3.1-8B"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(speedup=20.0, seed=3) as s:
        yield s


@pytest.fixture(scope="module")
def reasoning_sim() -> Iterator[SimProcess]:
    with SimProcess(speedup=20.0, seed=3, reasoning=True) as s:
        yield s


@pytest.fixture(scope="module")
def client(sim: SimProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url + "/v1", api_key="x", max_retries=0, timeout=30)


def _chunks(payload: bytes) -> list[dict[str, Any]]:
    events = sse_events(payload)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _samples(text: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _value(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    return sum(s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items()))


# ---- /metrics --------------------------------------------------------------------------------
def test_metrics_names_and_values() -> None:
    with SimProcess(speedup=20.0, seed=1) as s:
        served = 0
        for i in range(4):
            body = chat_body(20 + i, max_tokens=5 + i, ignore_eos=True, stream=bool(i % 2))
            status, _, payload = request(s.base_url, "POST", CHAT, body)
            assert status == 200
            if i % 2 == 0:
                served += json.loads(payload)["usage"]["completion_tokens"]
            else:
                served += 5 + i
        status, headers, payload = request(s.base_url, "GET", "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        samples = _samples(payload.decode())
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:request_success_total",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_count",
            "vllm:e2e_request_latency_seconds_sum",
        ):
            assert name in samples, name
            assert all(x.labels["model_name"] == MODEL for x in samples[name])
        assert _value(samples, "vllm:num_requests_running") == 0
        assert 0.0 <= _value(samples, "vllm:kv_cache_usage_perc") <= 1.0
        assert _value(samples, "vllm:generation_tokens_total") == served
        truth = s.truth()
        assert _value(samples, "vllm:prompt_tokens_total") == sum(t["prompt_tokens"] for t in truth)
        assert _value(samples, "vllm:request_success_total", finished_reason="length") == 4
        assert _value(samples, "vllm:time_to_first_token_seconds_count") == 4
        assert _value(samples, "vllm:e2e_request_latency_seconds_count") == 4
        assert _value(samples, "vllm:inter_token_latency_seconds_count") == served - 4
        assert _value(samples, "vllm:time_to_first_token_seconds_bucket", le="+Inf") == 4
        assert _value(samples, "vllm:e2e_request_latency_seconds_sum") > 0
        assert _value(samples, "vllm:prefix_cache_hits_total") <= _value(
            samples, "vllm:prefix_cache_queries_total"
        )


def test_cached_tokens_on_repeated_prompt(sim: SimProcess) -> None:
    content = synth_text(600, random.Random(42))
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    first = json.loads(request(sim.base_url, "POST", CHAT, body)[2])["usage"]
    second = json.loads(request(sim.base_url, "POST", CHAT, body)[2])["usage"]
    assert first["prompt_tokens"] == second["prompt_tokens"] == get_tokenizer().count_chat(body["messages"])
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["prompt_tokens"]
    assert cached % 16 == 0  # whole blocks
    samples = _samples(sim.metrics())
    assert _value(samples, "vllm:prefix_cache_hits_total") >= cached


def test_output_length_controls(sim: SimProcess) -> None:
    body = chat_body(max_completion_tokens=9, min_tokens=9)
    resp = json.loads(request(sim.base_url, "POST", CHAT, body)[2])
    assert resp["usage"]["completion_tokens"] == 9 and resp["choices"][0]["finish_reason"] == "length"
    resp = json.loads(
        request(sim.base_url, "POST", COMPLETIONS, {"prompt": "x", "max_tokens": 3, "ignore_eos": True})[2]
    )
    assert resp["usage"]["completion_tokens"] == 3


# ---- reasoning and tool calls over raw HTTP --------------------------------------------------
def test_reasoning_stream_order(sim: SimProcess) -> None:
    n = 10
    body = chat_body(
        max_tokens=n,
        ignore_eos=True,
        stream=True,
        reasoning_effort="low",
        stream_options={"include_usage": True},
    )
    status, _, payload = request(sim.base_url, "POST", CHAT, body)
    assert status == 200
    chunks = _chunks(payload)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    kinds = ["r" if d.get("reasoning_content") else "c" if d.get("content") else "-" for d in deltas]
    seq = "".join(k for k in kinds if k != "-")
    assert seq == "r" * 6 + "c" * 4
    reasoning = [d for d in deltas if d.get("reasoning_content")]
    assert all(d["reasoning"] == d["reasoning_content"] for d in reasoning)
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == n
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 6}
    # Not a reasoning request: no completion_tokens_details.
    plain = _chunks(request(sim.base_url, "POST", CHAT, {**body, "reasoning_effort": None})[2])
    assert "completion_tokens_details" not in plain[-1]["usage"]


def test_reasoning_model_non_streaming(reasoning_sim: SimProcess) -> None:
    body = chat_body(max_tokens=5, ignore_eos=True)
    resp = json.loads(request(reasoning_sim.base_url, "POST", CHAT, body)[2])
    msg = resp["choices"][0]["message"]
    tok = get_tokenizer()
    assert tok.count(msg["reasoning_content"]) == 3 and msg["reasoning"] == msg["reasoning_content"]
    assert tok.count(msg["content"]) == 2
    assert resp["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}


TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    },
    {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 12])
def test_tool_call_stream_shape(sim: SimProcess, n: int) -> None:
    body = chat_body(
        max_tokens=n, ignore_eos=True, stream=True, tools=TOOLS, stream_options={"include_usage": True}
    )
    chunks = _chunks(request(sim.base_url, "POST", CHAT, body)[2])
    calls = [
        c["choices"][0]["delta"]["tool_calls"]
        for c in chunks
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert all(len(tc) == 1 and tc[0]["index"] == 0 for tc in calls)
    head = calls[0][0]
    assert head["id"] and head["type"] == "function"
    assert head["function"] == {"name": "get_weather", "arguments": ""}
    fragments = [tc[0]["function"]["arguments"] for tc in calls[1:]]
    assert len(fragments) == n and all(set(tc[0]) == {"index", "function"} for tc in calls[1:])
    args = json.loads("".join(fragments))
    assert isinstance(args, dict)
    if n != 3:
        assert get_tokenizer().count("".join(fragments)) == n
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == n
    # tool_choice "none": a plain answer.
    plain = _chunks(request(sim.base_url, "POST", CHAT, {**body, "tool_choice": "none"})[2])
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in plain if c["choices"])


# ---- the official openai client --------------------------------------------------------------
def test_openai_chat_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    content, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "length" and get_tokenizer().count(content) == 8
    assert usage is not None and usage.completion_tokens == 8
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens is not None


def test_openai_chat_and_completions(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_completion_tokens=4,
        extra_body={"min_tokens": 4},
    )
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].message.content
    assert resp.usage is not None and resp.usage.completion_tokens == 4
    comp = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert comp.choices[0].text and comp.choices[0].finish_reason == "length"
    assert comp.usage is not None and comp.usage.completion_tokens == 3
    text = ""
    for chunk in client.completions.create(model=MODEL, prompt="Once upon", max_tokens=5, stream=True):
        text += chunk.choices[0].text if chunk.choices else ""
    assert 1 <= get_tokenizer().count(text) <= 5
    assert [m.id for m in client.models.list()] == [MODEL]


def test_openai_tool_call(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=TOOLS,
        max_tokens=6,  # type: ignore[arg-type]
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)
    name, args = None, ""
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "other"}},
        max_tokens=6,
        stream=True,
    ):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name = tc.function.name or name if tc.function else name
            args += (tc.function.arguments or "") if tc.function else ""
    assert name == "other" and isinstance(json.loads(args), dict)


def test_openai_reasoning_model(reasoning_sim: SimProcess) -> None:
    c = openai.OpenAI(base_url=reasoning_sim.base_url + "/v1", api_key="x", max_retries=0, timeout=30)
    reasoning, content = "", ""
    for chunk in c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Think."}], max_tokens=10, stream=True,
        extra_body={"ignore_eos": True},
    ):  # fmt: skip
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            r = extra.get("reasoning_content") or getattr(choice.delta, "reasoning_content", None) or ""
            assert not (r and content), "reasoning after content"
            reasoning += r
            content += choice.delta.content or ""
    tok = get_tokenizer()
    assert tok.count(reasoning) == 6 and tok.count(content) == 4
    resp = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Think."}], max_tokens=10
    )
    msg = resp.choices[0].message
    assert (msg.model_extra or {}).get("reasoning_content")
    assert resp.usage is not None and resp.usage.completion_tokens_details is not None
    assert resp.usage.completion_tokens_details.reasoning_tokens == max(
        1, round(0.6 * resp.usage.completion_tokens)
    ) or (resp.usage.completion_tokens == 1)


def test_prompt_larger_than_kv_cache_is_a_400() -> None:
    with SimProcess(speedup=20.0, extra_args=["--kv-blocks", "4", "--block-size", "16"]) as s:
        for stream in (False, True):
            body = chat_body(200, max_tokens=2, stream=stream)
            status, _, payload = request(
                s.base_url, "POST", CHAT, body, headers={"X-Request-Id": f"big-{stream}"}
            )
            assert status == 400
            assert json.loads(payload)["error"]["message"]
        assert request(s.base_url, "POST", CHAT, chat_body(5, max_tokens=2))[0] == 200
        truth = {t["request_id"]: t for t in s.truth()}
        assert truth["big-False"]["outcome"] == truth["big-True"]["outcome"] == "error"
        assert s.stats()["requests_by_outcome"] == {"error": 2, "ok": 1}


def test_long_reasoning_stream_switches_to_answer_once(reasoning_sim: SimProcess) -> None:
    """Every token after the reasoning part is an answer token, however long the output."""
    body = {
        "messages": [{"role": "user", "content": "think"}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, _, payload = request(reasoning_sim.base_url, "POST", "/v1/chat/completions", body)
    assert status == 200
    kinds = []
    for ev in payload.decode().split("\n\n"):
        if ev.startswith("data: {") and '"choices":[{' in ev:
            delta = json.loads(ev[6:])["choices"][0].get("delta") or {}
            if delta.get("reasoning_content"):
                kinds.append("r")
            elif delta.get("content"):
                kinds.append("a")
    n_reasoning = kinds.count("r")
    assert kinds == ["r"] * n_reasoning + ["a"] * (400 - n_reasoning)
    assert 0 < n_reasoning < 400
