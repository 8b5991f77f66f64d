"""Speculative decoding over the Anthropic Messages and OpenAI Responses APIs: a step's accepted tokens
reach the client as one delta event (a part each: reasoning, answer), the client counts them as the
server's usage does, and ITL stays the gap between token-carrying events (docs/metrics.md)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from loadtest.client.record import merged_gap_mask
from loadtest.sim import SimProcess
from loadtest.sim.protocol import OutputPlan
from loadtest.sim.responses import ResponsesWriter
from loadtest.sim.routes.messages import MessagesWriter
from loadtest.sim.spec_decode import SpecDecode
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
