"""Speculative decoding over the Anthropic Messages and OpenAI Responses APIs: a step's accepted tokens
reach the client as one delta event (a part each: reasoning, answer), the client counts them as the
server's usage does, and ITL stays the gap between token-carrying events (docs/metrics.md)."""

from __future__ import annotations

import itertools
import json
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from loadtest.client.adapters import adapter_for
from loadtest.client.adapters.base import classify_http
from loadtest.client.http import Response
from loadtest.client.openai import OpenAIClient, PreparedRequest
from loadtest.client.record import RequestRecord, merged_gap_mask
from loadtest.sim import SimProcess
from loadtest.sim.protocol import ChunkWriter, OutputPlan
from loadtest.sim.reference import RecordedAnswer
from loadtest.sim.responses import ResponsesWriter
from loadtest.sim.routes.base import StreamWriter
from loadtest.sim.routes.messages import MessagesWriter
from loadtest.sim.spec_decode import SpecDecode
from loadtest.tokens.tokenizer import get_tokenizer
from tests.conftest import read_lines, run_cli, write_profile

K, A = 3, 0.7
OUTPUT = 96
DELTA_EVENTS = {
    "messages": ("content_block_delta",),
    "responses": ("response.output_text.delta", "response.reasoning_text.delta"),
}


def _events(text: str) -> list[dict]:
    """The data of each SSE event in ``text``."""
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_a_step_is_one_event_a_part(api: str) -> None:
    plan = OutputPlan.make(10, 0.5, None, "")  # 5 reasoning tokens, then 5 answer tokens
    if api == "messages":
        w: MessagesWriter | ResponsesWriter = MessagesWriter("msg_1", 0, "m", plan, 8)
    else:
        w = ResponsesWriter("resp_1", 0, "m", plan)
    one_by_one = [_events(w.token(i)) for i in range(10)]
    # Tokens 3..6 in one step: the reasoning part (3, 4) and the answer part (5, 6), one event each.
    run = [e for e in _events(w.tokens(3, 4)) if e["type"] in DELTA_EVENTS[api]]
    texts = [
        e["delta"].get("thinking") or e["delta"].get("text") if api == "messages" else e["delta"] for e in run
    ]
    singles = [
        e["delta"].get("thinking") or e["delta"].get("text") if api == "messages" else e["delta"]
        for i in range(3, 7)
        for e in one_by_one[i]
        if e["type"] in DELTA_EVENTS[api] and (api != "messages" or e["delta"]["type"] != "signature_delta")
    ]
    assert [t for t in texts if t] == [singles[0] + singles[1], singles[2] + singles[3]], (texts, singles)
    if api == "messages":  # the thinking block closes and the text block opens between the two parts
        kinds = [e["type"] for e in _events(w.tokens(3, 4))]
        assert kinds == [
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
        ], kinds
    # Within one part: a single event.
    assert len([e for e in _events(w.tokens(6, 3)) if e["type"] in DELTA_EVENTS[api]]) == 1


def _expected_events(truth: dict) -> int:
    """Token-carrying events of a streamed answer: one a step, two for the step where reasoning ends and
    the answer starts."""
    ns = truth["token_ns"]
    r = truth["reasoning_tokens"] or 0
    split = 0 < r < len(ns) and ns[r - 1] == ns[r]
    return len(set(ns)) + int(split)


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_a_run_sees_several_tokens_a_chunk_counted_as_the_server_does(tmp_path: Path, api: str) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        api=api,
        output_tokens={"dist": "fixed", "value": OUTPUT},
        load={"concurrency": 4},
        duration_s=3,
    )
    extra = ["--spec-decode", f"{K}:{A}", "--reasoning", "on"]
    with SimProcess(speedup=4, extra_args=extra) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / "r")])
        assert res.returncode == 0, res.stderr[-2000:]
        truth = {t["request_id"]: t for t in sim.truth()}
    recs = [r for r in read_lines([tmp_path / "r" / "records.jsonl"]) if r["outcome"] == "ok"]
    assert len(recs) >= 20, len(recs)
    for r in recs:
        t = truth[r["wire_id"]]
        # The client's count of the joined deltas is the server's usage and the engine's truth.
        assert r["api"] == api and r["stream"]
        assert r["output_tokens"] == r["usage_completion_tokens"] == OUTPUT == t["completion_tokens"], r
        assert r["reasoning_tokens"] == t["reasoning_tokens"] > 0, (r, t)
        # One event a step (two where the step crosses from reasoning to answer): the engine's writes.
        assert len(r["chunks_us"]) == _expected_events(t), (r["wire_id"], r["chunks_us"], t["token_ns"])
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    tpc = run["metrics"]["tokens_per_chunk"]
    assert tpc["tokens"] == OUTPUT * len(recs)
    assert tpc["chunks"] == sum(len(r["chunks_us"]) for r in recs)
    expected = SpecDecode(K, A).expected_tokens_per_step()
    assert 1.5 < tpc["mean"] <= expected + 0.1, (tpc, expected)
    # ITL is per event, never divided among the tokens it carries: the gaps between consecutive
    # token-carrying events, those that arrived in one read with another left out.
    gaps: list[np.ndarray] = []
    for r in recs:
        times = np.asarray(r["chunks_us"], dtype=np.int64)
        gaps.append((times[1:] - times[:-1])[~merged_gap_mask(times)])
    every = np.concatenate(gaps)
    lat = run["metrics"]["latency_ms"]
    burst = run["metrics"]["itl_merged"]["burst_gaps"]
    assert lat["itl"]["count"] == every.size - burst, (lat["itl"]["count"], every.size, burst)
    if not burst:
        p50_ms = float(np.percentile(every, 50)) / 1000
        assert abs(lat["itl"]["p50"] - p50_ms) <= 0.05 * p50_ms + 0.01, (lat["itl"], p50_ms)
    # TPOT is per token: about ITL ÷ the tokens a chunk (generous bounds: the machine may be busy).
    tpot = statistics.median(r["tpot_us"] for r in recs)
    itl = float(np.median(every))
    assert 1.3 * tpot < itl < 4 * tpot, (itl, tpot)


def _client() -> OpenAIClient:
    return OpenAIClient("http://127.0.0.1:9", None, get_tokenizer("llama3"))


def _writer(api: str, plan: OutputPlan) -> StreamWriter:
    if api == "chat":
        return ChunkWriter(True, "chatcmpl-1", 0, "m", plan)
    if api == "messages":
        return MessagesWriter("msg_1", 0, "m", plan, 8)
    return ResponsesWriter("resp_1", 0, "m", plan)


def _read(api: str, plan: OutputPlan, runs: list[int]) -> RequestRecord:
    """A stream written a step at a time (``runs``: the tokens of each step, each step one read), read by
    the client's adapter for ``api``."""
    w = _writer(api, plan)
    reads = [w.opening()]
    first = 0
    for n in runs:
        reads.append(w.tokens(first, n).encode())
        first += n
    reads[-1] += w.tail("stop", 8, plan.target, 0, True).encode()
    resp = Response(
        200, {"content-type": "text/event-stream"}, 1, reads, list(range(10, 10 + len(reads))), True
    )
    rec = RequestRecord("r", requested_output_tokens=plan.target, stream=True)
    assert not classify_http(rec, resp)
    adapter_for(api).classify(
        _client(), rec, PreparedRequest("r", api, {}, 10, plan.target, stream=True), resp
    )
    return rec


PLANS = {
    "text": OutputPlan.make(40, None, None, ""),
    "reasoning": OutputPlan.make(40, 0.6, None, ""),
    "tool": OutputPlan.make(40, None, "get_weather", "call_1"),
    "reasoning+tool": OutputPlan.make(40, 0.6, "get_weather", "call_1"),
}


# The engine's Responses route streams no function calls: text and reasoning only.
CASES = [
    (api, kind)
    for api in ("chat", "messages", "responses")
    for kind in PLANS
    if api != "responses" or "tool" not in kind
]


@pytest.mark.parametrize(("api", "kind"), CASES)
def test_the_client_reads_merged_steps_as_it_reads_single_tokens(api: str, kind: str) -> None:
    plan = PLANS[kind]
    rng = random.Random(7)
    runs: list[int] = []
    while sum(runs) < plan.target:
        runs.append(min(rng.randint(1, K + 1), plan.target - sum(runs)))
    one = _read(api, plan, [1] * plan.target)
    merged = _read(api, plan, runs)
    assert one.outcome == merged.outcome == "ok", (one.error, merged.error)
    # The same answer, reasoning and tool arguments, so the same counts; fewer chunks.
    assert (merged.answer_text, merged.reasoning_text, merged.tool_calls_text) == (
        one.answer_text,
        one.reasoning_text,
        one.tool_calls_text,
    )
    assert merged.completion_tokens_client == one.completion_tokens_client
    assert merged.reasoning_tokens_client == one.reasoning_tokens_client
    assert merged.completion_tokens_server == one.completion_tokens_server == plan.target
    # Chat's tool call opens with an event of its own that carries the name: a token-carrying event.
    opening = int(api == "chat" and plan.tool_name is not None)
    assert len(one.chunk_ns) == plan.target + opening
    # One chunk a step, two for the step that crosses from reasoning to the answer.
    ends = list(itertools.accumulate(runs))
    crossing = int(0 < plan.n_reasoning < plan.target and plan.n_reasoning not in ends)
    assert len(merged.chunk_ns) == len(runs) + crossing + opening, (runs, plan.n_reasoning, merged.chunk_ns)


def test_a_recorded_answer_keeps_its_own_deltas_in_a_merged_step() -> None:
    message = {"role": "assistant", "content": "The answer is forty-two, as recorded.", "tool_calls": []}
    recorded = RecordedAnswer.of(message, piece=4)
    plan = OutputPlan(len(recorded.deltas), recorded=recorded)
    w = ChunkWriter(True, "chatcmpl-1", 0, "m", plan)
    merged = "".join(w.tokens(i, min(3, plan.target - i)) for i in range(0, plan.target, 3))
    texts = [e["choices"][0]["delta"].get("content", "") for e in _events(merged)]
    assert "".join(texts) == message["content"], texts
