"""Workload content blocks: empirical lengths, think times, salt, shared prefixes, sessions, images."""

from __future__ import annotations

import base64
import bisect
import json
import os
import random
import statistics
import struct
import zlib
from dataclasses import dataclass, field

import pytest

from loadtest.profile.schema import Fixed, LogNormal, Normal, Uniform
from loadtest.tokens.tokenizer import get_tokenizer
from loadtest.workload.images import PNG_SIGNATURE, image_part, user_content
from loadtest.workload.lengths import sample_empirical, sample_length, sample_seconds
from loadtest.workload.prefix import PrefixBank
from loadtest.workload.salt import SALT_TOKENS, salt_text
from loadtest.workload.sessions import AgentSession, ChatSession
from loadtest.workload.tools import tools_json

POINTS = [(0.0, 10.0), (0.25, 200.0), (0.5, 1020.0), (0.9, 2735.0), (0.99, 9000.0), (1.0, 20000.0)]


@dataclass
class Empirical:
    points: list[tuple[float, float]]
    dist: str = "empirical"
    min: int | None = None
    max: int | None = None


@dataclass
class Exponential:
    mean: float
    dist: str = "exponential"
    min: float | None = field(default=None)
    max: float | None = field(default=None)


def _quantile(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


def test_empirical_sampling_reproduces_its_quantiles() -> None:
    rng = random.Random(1)
    xs = sorted(sample_empirical(POINTS, rng) for _ in range(50_000))
    assert xs[0] >= 10 and xs[-1] <= 20000
    # Compared in the quantile domain: a value's share of samples below it is its quantile ± 2 %
    # (values at steep parts of a table move a lot for a small quantile error).
    for q, v in POINTS[1:-1]:
        assert abs(bisect.bisect_right(xs, v) / len(xs) - q) / q < 0.02
    assert abs(_quantile(xs, 0.5) - 1020) / 1020 < 0.02


def test_sample_length_dispatches_on_dist() -> None:
    rng = random.Random(2)
    ns = [sample_length(Empirical(POINTS, min=50, max=5000), rng) for _ in range(20_000)]
    assert all(isinstance(n, int) and 50 <= n <= 5000 for n in ns)
    assert abs(statistics.median(ns) - 1020) / 1020 < 0.03
    assert sample_length(Fixed(dist="fixed", value=7), rng) == 7
    assert 3 <= sample_length(Uniform(dist="uniform", min=3, max=9), rng) <= 9
    assert sample_length(Normal(dist="normal", mean=100, std=10, min=95, max=96), rng) in (95, 96)
    assert sample_length(LogNormal(dist="lognormal", median=50, sigma=0), rng) == 50


def test_sample_seconds_shapes() -> None:
    rng = random.Random(3)
    assert sample_seconds(2.5, rng) == 2.5 and sample_seconds(-1, rng) == 0.0
    assert sample_seconds(Fixed(dist="fixed", value=3), rng) == 3.0
    xs = [sample_seconds(Uniform(dist="uniform", min=1, max=2), rng) for _ in range(1000)]
    assert all(1 <= x <= 2 for x in xs) and any(x != int(x) for x in xs)
    xs = [sample_seconds(Normal(dist="normal", mean=1, std=5, min=0), rng) for _ in range(1000)]
    assert min(xs) == 0.0 and max(xs) > 1
    xs = [sample_seconds(Exponential(mean=120.0), rng) for _ in range(20_000)]
    assert min(xs) >= 0 and abs(statistics.fmean(xs) - 120) / 120 < 0.03
    xs = [sample_seconds(LogNormal(dist="lognormal", median=2.0, sigma=1.0), rng) for _ in range(20_000)]
    assert abs(statistics.median(xs) - 2.0) < 0.1
    xs = [sample_seconds(Empirical([(0, 0.5), (1, 1.5)]), rng) for _ in range(10_000)]
    assert abs(statistics.fmean(xs) - 1.0) < 0.02


@pytest.mark.parametrize("name", ["llama3", "o200k"])
def test_salt_is_per_index_reproducible_and_fixed_length(name: str) -> None:
    tok = get_tokenizer(name)
    salts = [salt_text(5, i) for i in range(2000)]
    assert len(set(salts)) == len(salts)
    assert salts[3] == salt_text(5, 3) != salt_text(6, 3)
    assert {tok.count(s) for s in salts} == {SALT_TOKENS}
    assert tok.count("You are helpful." + salts[0]) == tok.count("You are helpful.") + SALT_TOKENS


@pytest.mark.parametrize("name", ["llama3", "o200k"])
def test_prefix_blocks_share_text_for_shared_hash_ids(name: str) -> None:
    tok = get_tokenizer(name)
    bank = PrefixBank(9, tok, block_tokens=64, max_cached=8)
    a = bank.blocks_text([1, 2, 3, 4], 230)
    b = bank.blocks_text([1, 2, 7], 150)
    shared = bank.blocks_text([1, 2], 128)
    assert a.startswith(shared) and b.startswith(shared)
    assert len(os.path.commonprefix([a, b])) < len(shared) + 8  # block 3 ≠ block 7
    for ids, n in [
        ([1, 2, 3, 4], 230),
        ([5], 1),
        ([5], 64),
        ([5, 6], 65),
        ([1, 2], 128),
        ([8], 300),
        ([], 20),
    ]:
        assert tok.count(bank.blocks_text(ids, n)) == n
    assert PrefixBank(9, tok, block_tokens=64).blocks_text([1, 2, 3, 4], 230) == a  # cache-independent
    assert PrefixBank(10, tok, block_tokens=64).blocks_text([1], 64) != bank.blocks_text([1], 64)


@pytest.mark.parametrize("name", ["llama3", "o200k"])
def test_group_texts_are_stable_within_and_distinct_across_groups(name: str) -> None:
    tok = get_tokenizer(name)
    bank = PrefixBank(1, tok)
    g = bank.group_text(3, 700)
    assert g == PrefixBank(1, tok).group_text(3, 700) and tok.count(g) == 700
    assert g != bank.group_text(4, 700)
    assert g.startswith(bank.group_text(3, 200))


def _chat(index: int = 0, **kw: object) -> ChatSession:
    args: dict = dict(
        turns=3,
        input_tokens=lambda r: r.randint(20, 60),
        output_tokens=50,
        think_time_s=lambda r: r.uniform(1, 2),
        system_prompt="You are terse.",
        salt=True,
    )
    args.update(kw)
    return ChatSession(4, index, get_tokenizer("llama3"), **args)


def test_chat_session_carries_actual_answers_and_grows() -> None:
    s = _chat()
    c1 = s.next_request()
    assert c1 is not None and c1.think_before_s == 0 and c1.tools is None
    assert (
        c1.messages[0]["content"].startswith("You are terse.")
        and salt_text(4, 0) in c1.messages[0]["content"]
    )
    s.record_answer("Answer one: forty-two, streamed verbatim!")
    c2 = s.next_request()
    assert c2 is not None and 1 <= c2.think_before_s <= 2
    assert {"role": "assistant", "content": "Answer one: forty-two, streamed verbatim!"} in c2.messages
    assert c2.messages[: len(c1.messages)] == c1.messages and c2.prompt_tokens > c1.prompt_tokens
    assert c2.prompt_tokens == s.prompt_tokens(c2.messages)
    s.record_answer("two")
    assert s.next_request() is not None
    s.record_answer("three")
    assert s.done and s.next_request() is None


def test_chat_session_ends_on_failure_and_is_deterministic() -> None:
    s = _chat()
    s.next_request()
    s.record_answer(None)
    assert s.done and s.next_request() is None
    a, b, other = _chat(1), _chat(1), _chat(2)
    ca, cb, co = a.next_request(), b.next_request(), other.next_request()
    assert ca == cb and ca is not None and co is not None and ca.messages != co.messages
    a.record_answer("x")
    b.record_answer("y")
    ma, mb = a.next_request(), b.next_request()
    assert ma is not None and mb is not None and ma.messages[-1] == mb.messages[-1]
    assert a.think_times == b.think_times
    with pytest.raises(RuntimeError):
        a.next_request()


def test_chat_session_stops_at_the_context_limit() -> None:
    s = _chat(turns=50, input_tokens=100, max_context_tokens=600)
    n = 0
    while (c := s.next_request()) is not None:
        assert c.prompt_tokens + c.max_tokens <= 600
        s.record_answer(" word" * 100)
        n += 1
    assert 1 < n < 50


def _agent(index: int, **kw: object) -> AgentSession:
    args: dict = dict(
        prefix_tokens=3000,
        tools=6,
        turns=4,
        input_tokens=lambda r: r.randint(50, 150),
        calls_per_turn=3,
        output_tokens=30,
        tool_result_tokens=lambda r: r.randint(200, 400),
        max_context_tokens=8000,
    )
    args.update(kw)
    return AgentSession(11, index, get_tokenizer("llama3"), **args)


def _run(s: AgentSession, answers: int = 10_000) -> list:
    calls = []
    while (c := s.next_request()) is not None and len(calls) < answers:
        calls.append(c)
        s.record_answer('{"input": "look up the water"}' if c.call % 2 else "plain words here")
    return calls


def test_agent_prefix_is_shared_and_about_prefix_tokens() -> None:
    tok = get_tokenizer("llama3")
    a, b = _agent(0), _agent(1)
    ca, cb = a.next_request(), b.next_request()
    assert ca is not None and cb is not None
    assert tools_json(ca.tools or []) == tools_json(cb.tools or []) and ca.messages[0] == cb.messages[0]
    assert ca.messages[1] != cb.messages[1]
    prefix = tok.count_chat(ca.messages[:1]) + tok.count(tools_json(ca.tools or []))
    assert abs(prefix - 3000) <= 30
    assert _agent(0, prefix_tokens=3000).tools != AgentSession(12, 0, tok, prefix_tokens=3000).tools


def test_agent_appends_tool_calls_and_results() -> None:
    s = _agent(0, max_context_tokens=10**6)
    calls = _run(s)
    assert len(calls) == 4 * 3 and s.done
    last = calls[-1].messages
    roles = [m["role"] for m in last]
    assert roles[:5] == ["system", "user", "assistant", "tool", "assistant"]
    tc = last[2]
    assert tc["content"] is None and tc["tool_calls"][0]["type"] == "function"
    assert json.loads(tc["tool_calls"][0]["function"]["arguments"]) == {"input": "plain words here"}
    assert last[3]["tool_call_id"] == tc["tool_calls"][0]["id"]
    assert last[4]["tool_calls"][0]["function"]["arguments"] == '{"input": "look up the water"}'
    names = {t["function"]["name"] for t in calls[0].tools or []}
    assert tc["tool_calls"][0]["function"]["name"] in names
    # The third call ends the turn: its plain answer is kept as text; then the next user message.
    assert calls[3].messages[-2] == {"role": "assistant", "content": "plain words here"}
    assert calls[3].messages[-1]["role"] == "user" and calls[3].think_before_s == 0
    for c in calls:
        assert c.prompt_tokens == s.prompt_tokens(c.messages)
    # Server-made tool calls are kept as returned.
    t = _agent(5)
    t.next_request()
    t.record_answer("", [{"id": "srv_1", "function": {"name": "x_y", "arguments": "{}"}}])
    c = t.next_request()
    assert c is not None and c.messages[-2]["tool_calls"][0]["id"] == "srv_1"
    assert c.messages[-1]["tool_call_id"] == "srv_1"
    t.record_answer(None)
    assert t.done and t.next_request() is None


@pytest.mark.parametrize("overflow", ["stop", "truncate"])
def test_agent_context_stays_within_the_limit(overflow: str) -> None:
    s = _agent(2, turns=30, max_context_tokens=6000, overflow=overflow)
    calls = _run(s)
    assert calls and all(c.prompt_tokens + c.max_tokens <= 6000 for c in calls)
    if overflow == "stop":
        assert len(calls) < 30 * 3
    else:
        assert len(calls) == 30 * 3
        assert all(c.messages[0] == calls[0].messages[0] for c in calls)


def test_image_parts_are_valid_deterministic_pngs() -> None:
    part = image_part(1, 2, 300, 200, "low")
    assert part["type"] == "image_url" and part["image_url"]["detail"] == "low"
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    png = base64.b64decode(url.split(",", 1)[1])
    assert png[:8] == PNG_SIGNATURE and png[12:16] == b"IHDR"
    width, height, depth, color = struct.unpack(">IIBB", png[16:26])
    assert (width, height, depth, color) == (300, 200, 8, 2)
    assert zlib.crc32(png[12:29]) == struct.unpack(">I", png[29:33])[0]
    idat_len = struct.unpack(">I", png[33:37])[0]
    assert png[37:41] == b"IDAT" and len(zlib.decompress(png[41 : 41 + idat_len])) == 200 * (1 + 3 * 300)
    assert png.endswith(b"IEND\xaeB`\x82")
    assert image_part(1, 2, 300, 200, "low") == part and image_part(1, 3, 300, 200, "low") != part
    content = user_content("describe", [part])
    assert content[0] == {"type": "text", "text": "describe"} and content[1] is part
