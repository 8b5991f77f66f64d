"""The run salt: prompts are new in every run by default, repeat only when the profile asks, and every
worker of a run mixes in the same nonce; the workload fingerprint does not depend on the nonce."""

from __future__ import annotations

import hashlib
import json
import random
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from loadtest.client.openai import OpenAIClient
from loadtest.client.record import RequestRecord
from loadtest.locust.settings import RunSettings
from loadtest.profile.loader import load_profile
from loadtest.profile.schema import Profile
from loadtest.sim import SimProcess
from loadtest.tokens.tokenizer import get_tokenizer
from loadtest.workload.builder import Workload
from loadtest.workload.salt import (
    SALT_BITS,
    SALT_TOKENS,
    describe_run_salt,
    salt_text,
    salt_value,
    salt_words,
)
from loadtest.workload.sessions import AgentSession
from loadtest.workload.text import TOKEN_PIECES
from tests.conftest import read_lines, run_cli, write_profile

FIXED = {"dist": "fixed", "value": 8}
ZERO = {"dist": "fixed", "value": 0}
MIX: dict[str, Any] = {
    "name": "mix",
    "seed": 3,
    "scenarios": [
        {
            "name": "chat",
            "weight": 2,
            "system_prompt_tokens": 30,
            "prefix": {"groups": 3, "tokens": 40},
            "input_tokens": {"dist": "uniform", "min": 60, "max": 200},
            "output_tokens": FIXED,
        },
        {
            "name": "salted",
            "salt": True,
            "input_tokens": {"dist": "fixed", "value": 80},
            "output_tokens": FIXED,
        },
        {
            "name": "conv",
            "kind": "multi_turn",
            "system_prompt_tokens": 20,
            "input_tokens": {"dist": "fixed", "value": 50},
            "output_tokens": FIXED,
            "session": {"turns": {"dist": "fixed", "value": 3}, "think_time_s": ZERO},
        },
        {
            "name": "agent",
            "kind": "agent",
            "input_tokens": {"dist": "fixed", "value": 40},
            "output_tokens": FIXED,
            "agent": {
                "prefix_tokens": 300,
                "tools": 2,
                "turns": {"dist": "fixed", "value": 2},
                "calls_per_turn": {"dist": "fixed", "value": 2},
                "tool_result_tokens": {"dist": "fixed", "value": 30},
                "think_time_s": ZERO,
            },
        },
    ],
}
# sha256 of the first call of units 0..39 of MIX with `run_salt: off`, as loadtest built them before
# run_salt existed. Regenerate only when the workload's text deliberately changes.
MIX_OFF_BODIES = "e98842021c5f0d2664a9b52a4615165e91412cb5043ada4dfed27c680ef413f7"


def profile(**top: Any) -> Profile:
    return Profile.model_validate({**MIX, **top})


def first_calls(w: Workload, n: int = 40) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        step = w.unit(i).next(None)
        assert step is not None
        out.append(step.request.body)
    return out


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def test_default_is_per_run_and_old_profiles_stay_valid() -> None:
    assert profile().run_salt == "per_run"
    with pytest.raises(ValueError, match="run_salt"):
        profile(run_salt="per_query")
    # YAML reads an unquoted `run_salt: off` as false: it means off.
    assert profile(run_salt=False).run_salt == "off"


def test_per_run_prompts_differ_between_runs_past_the_shared_prefix_only() -> None:
    prof = profile()
    a, b = Workload(prof, run_nonce=1), Workload(prof, run_nonce=2)
    assert a.fingerprint() == b.fingerprint() == Workload(prof).fingerprint()
    tok = a.tokenizer
    for i, (ba, bb) in enumerate(zip(first_calls(a), first_calls(b), strict=True)):
        sc = a.scenario_for(i)
        assert ba != bb, (i, sc.name)
        # What the profile shares on purpose is shared across runs too: the system prompt (agents:
        # system prompt and tool definitions), then a prefix group's text; the salt comes after it.
        ma, mb = ba["messages"], bb["messages"]
        if ma[0]["role"] == "system":
            assert ma[0] == mb[0], (i, sc.name)
        assert ba.get("tools") == bb.get("tools")
        ua, ub = user_texts(ba)[0], user_texts(bb)[0]
        key = f"{i}:0" if sc.kind == "agent" else i
        salt_a, salt_b = salt_text(3, key, 1), salt_text(3, key, 2)
        cut = ua.find(salt_a) if salt_a in ua else ua.find(salt_a.lstrip())
        group = ua[:cut]
        assert cut >= 0 and ub.startswith(group)
        assert ub[len(group) :].startswith((salt_b, salt_b.lstrip()))
        if sc.prefix is not None:
            n = tok.count(group)
            assert n >= 1 and group in {a.prefixes.group_text(g, n) for g in range(3)}, (i, n)
        else:
            assert group == "", (i, sc.name)
        # The salt's tokens are counted in the prompt; the length stays what the profile asked.
        ra, rb = a.request(i), b.request(i)
        assert ra.prompt_tokens == rb.prompt_tokens
        if sc.kind == "chat":
            assert ra.prompt_tokens == tok.count_chat(ma)


def test_the_salt_follows_the_prefix_group_and_the_system_prompt() -> None:
    prof = Profile.model_validate(
        {
            "name": "px",
            "system_prompt_tokens": 24,
            "prefix": {"groups": 1, "tokens": 50},
            "input_tokens": {"dist": "fixed", "value": 120},
            "output_tokens": FIXED,
        }
    )
    w = Workload(prof, run_nonce=99)
    group = w.prefixes.group_text(0, 50)
    for i in range(20):
        req = w.request(i)
        system, user = req.body["messages"]
        assert system == Workload(prof, run_nonce=5).request(i).body["messages"][0]
        salt = salt_text(w.seed, i, 99)
        assert user["content"].startswith(group + salt)
        assert req.prompt_tokens == 120  # exact: the salt ate into the request's own text
    # Within a run requests still share the group's text (a prefix cache hit), never the salt.
    texts = [w.request(i).body["messages"][1]["content"] for i in range(20)]
    assert len({t[: len(group)] for t in texts}) == 1
    assert len({t[len(group) : len(group) + 40] for t in texts}) == 20


def test_per_seed_replays_the_same_bodies_and_off_sends_the_old_ones() -> None:
    seeded = profile(run_salt="per_seed")
    a, b = Workload(seeded, run_nonce=1), Workload(seeded, run_nonce=2)
    assert first_calls(a) == first_calls(b)
    assert first_calls(Workload(seeded, seed=4)) != first_calls(a)
    assert first_calls(a) != first_calls(Workload(profile(), run_nonce=1))
    # The fingerprint counts the mode, never the nonce.
    assert a.fingerprint() == b.fingerprint() != Workload(profile()).fingerprint()

    off = Workload(profile(run_salt="off"), run_nonce=1)
    assert off.nonce is None
    h = hashlib.sha256()
    for body in first_calls(off):
        h.update(json.dumps(body, sort_keys=True).encode())
    assert h.hexdigest() == MIX_OFF_BODIES
    assert first_calls(off) == first_calls(Workload(profile(run_salt="off"), run_nonce=2))


def test_sessions_share_their_history_within_a_run_not_across_runs() -> None:
    prof = profile()
    conv = next(i for i in range(40) if Workload(prof).scenario_for(i).name == "conv")
    runs = []
    for nonce in (11, 12):
        unit = Workload(prof, run_nonce=nonce).unit(conv)
        calls, last = [], None
        while (step := unit.next(last)) is not None:
            calls.append(step.request.body["messages"])
            last = RequestRecord(request_id="x", outcome="ok", answer_text=" an answer")
        runs.append(calls)
    a, b = runs
    assert len(a) == len(b) == 3
    for prev, nxt in zip(a, a[1:], strict=False):
        assert nxt[: len(prev)] == prev  # each turn extends the last one: the history is a cache hit
    assert a[0][0] == b[0][0]  # the shared system prompt
    assert a[0][1] != b[0][1]  # the first user message starts with this run's salt
    assert a[0][1]["content"].startswith(salt_text(3, conv, 11).lstrip())


def test_agent_turns_each_start_with_the_run_salt_so_trimming_keeps_one() -> None:
    tok = get_tokenizer("llama3")
    s = AgentSession(
        1, 7, tok, prefix_tokens=200, tools=2, turns=3, calls_per_turn=1, input_tokens=60,
        tool_result_tokens=20, output_tokens=8, max_context_tokens=340, overflow="truncate", nonce=42,
    )  # fmt: skip
    trimmed = 0
    while (call := s.next_request()) is not None:
        users = [m["content"] for m in call.messages if m["role"] == "user"]
        first_kept = call.turn - len(users) + 1
        trimmed += first_kept > 0
        for k, text in enumerate(users):
            assert text.startswith(salt_text(1, f"7:{first_kept + k}", 42).lstrip())
            assert len(text.split()) == 60  # the salt's words are part of the turn's length
        s.record_answer(" done")
    assert s.turn == 3 and trimmed  # older turns were dropped, and the kept ones still carry a salt
    assert SALT_TOKENS == 10


def test_trace_blocks_are_shared_within_a_run_and_new_in_the_next(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {"timestamp": i * 100, "input_length": 600, "output_length": 4, "hash_ids": [1, 2 + i]}
            )
            + "\n"
            for i in range(6)
        )
    )
    prof = Profile.model_validate(
        {
            "name": "tr",
            "load": {"trace": {"path": str(trace), "format": "mooncake"}},
            "scenarios": [{"name": "t", "kind": "trace"}],
        }
    )
    a, b = Workload(prof, run_nonce=1), Workload(prof, run_nonce=2)
    ta = [a.request(i).body["messages"][0]["content"] for i in range(6)]
    tb = [b.request(i).body["messages"][0]["content"] for i in range(6)]
    block = a.prefixes.block_tokens
    first = [len(t.split()) for t in ta]
    assert min(first) > block
    # Block 1 is every request's first: the same text within a run (the trace's reuse), not across runs.
    heads_a = {" ".join(t.split()[:block]) for t in ta}
    heads_b = {" ".join(t.split()[:block]) for t in tb}
    assert len(heads_a) == len(heads_b) == 1 and heads_a != heads_b
    assert [a.request(i).prompt_tokens for i in range(6)] == [b.request(i).prompt_tokens for i in range(6)]


def test_every_worker_gets_the_run_nonce_with_the_settings(tmp_path: Path) -> None:
    prof_path = write_profile(tmp_path / "p.yaml")
    master = RunSettings(run_id="r", profile_ref=str(prof_path), host="", out_dir="", duration_s=1, seed=1)
    other = RunSettings(run_id="r", profile_ref=str(prof_path), host="", out_dir="", duration_s=1, seed=1)
    assert master.run_nonce != other.run_nonce  # a new run, a new nonce
    worker = RunSettings.from_json(master.to_json())
    assert worker.run_nonce == master.run_nonce
    p, _ = master.profile()
    assert first_calls(Workload(p, 1, run_nonce=worker.run_nonce), 10) == first_calls(
        Workload(p, 1, run_nonce=master.run_nonce), 10
    )
    assert describe_run_salt("per_run", master.run_nonce, 1) == {
        "mode": "per_run",
        "nonce": f"{master.run_nonce:016x}",
    }
    assert describe_run_salt("off", master.run_nonce, 1) == {"mode": "off", "nonce": None}


def _sim_bodies(sim: SimProcess) -> set[str]:
    """sha256 of the chat bodies the engine received lately (its request log)."""
    with urllib.request.urlopen(sim.base_url + "/sim/requests", timeout=10) as r:
        return {item["sha256"] for item in json.load(r) if item["path"].endswith("/chat/completions")}


def _expected_bodies(run_dir: Path, prof_path: Path, host: str) -> set[str]:
    """sha256 of the body the client sends for every request in the run's records, rebuilt from the
    profile, the seed and the nonce run.json recorded."""
    run = json.loads((run_dir / "run.json").read_text())
    nonce = int(run["config"]["run_salt"]["nonce"], 16)
    seed = run["config"]["seed"]
    settings = RunSettings(
        run_id="x", profile_ref=str(prof_path), host=host, out_dir="", duration_s=1, seed=seed
    )
    prof, _ = settings.profile()
    w = Workload(prof, seed, run_nonce=nonce)
    client = OpenAIClient(host, run["config"]["model"], w.tokenizer)
    out = set()
    for rec in read_lines(sorted(run_dir.glob("records*.jsonl"))):
        raw = client.encode(w.request(int(rec["id"].rsplit("-", 1)[1])))
        out.add(hashlib.sha256(raw.split(b"\r\n\r\n", 1)[1]).hexdigest())
    client.close()
    return out


def test_runs_against_one_server_never_repeat_a_prompt_unless_asked(tmp_path: Path) -> None:
    """Runs of one profile and seed against one engine: per_run sends new prompts (no cached tokens),
    and both workers of a --processes 2 run used the master's nonce; per_seed replays the same
    bodies, and the engine's prefix cache serves the second run."""
    lengths = {
        "input_tokens": {"dist": "fixed", "value": 256},
        "output_tokens": {"dist": "fixed", "value": 2},
    }
    cold = write_profile(tmp_path / "cold.yaml", duration_s=1.5, **lengths)
    warm = write_profile(tmp_path / "warm.yaml", duration_s=1.5, run_salt="per_seed", **lengths)
    runs: dict[str, dict[str, Any]] = {}
    with SimProcess(speedup=8) as sim:
        for name, prof, extra in (
            ("cold1", cold, ["--processes", "2"]),
            ("cold2", cold, []),
            ("warm1", warm, []),
            ("warm2", warm, []),
        ):
            before = _sim_bodies(sim)
            res = run_cli(
                ["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / name), *extra]
            )
            assert res.returncode == 0, res.stderr
            runs[name] = {
                "sent": _sim_bodies(sim) - before,
                "run": json.loads((tmp_path / name / "run.json").read_text()),
            }
        cold1_expected = _expected_bodies(tmp_path / "cold1", cold, sim.base_url)
        warm_expected = [_expected_bodies(tmp_path / n, warm, sim.base_url) for n in ("warm1", "warm2")]
    # Both workers of the 2-process run sent exactly the bodies the master's nonce gives.
    assert runs["cold1"]["sent"] and runs["cold1"]["sent"] <= cold1_expected
    r1, r2 = runs["cold1"]["run"], runs["cold2"]["run"]
    assert r1["config"]["run_salt"]["mode"] == "per_run"
    assert r1["config"]["run_salt"]["nonce"] != r2["config"]["run_salt"]["nonce"]
    assert r1["workload"]["fingerprint"] == r2["workload"]["fingerprint"]
    assert not runs["cold2"]["sent"] & cold1_expected
    assert r2["metrics"]["tokens"]["usage_cached_total"] == 0  # nothing of run 1 (or of run 2) reused
    w1, w2 = runs["warm1"]["run"], runs["warm2"]["run"]
    assert w1["config"]["run_salt"] == w2["config"]["run_salt"] and w1["config"]["run_salt"]["nonce"]
    assert len(warm_expected[0] & warm_expected[1]) >= min(map(len, warm_expected)) > 0
    tok = w2["metrics"]["tokens"]
    assert tok["usage_cached_total"] > 0.5 * tok["counted_input_total"]  # the replay hit the cache


def test_salt_values_do_not_collide_across_runs() -> None:
    rng = random.Random(0)
    nonces = [rng.getrandbits(64) for _ in range(50)]
    salts = {salt_text(0, i, n) for n in nonces for i in range(20)}
    assert len(salts) == 1000
    assert salt_text(5, 3) == salt_text(5, 3, None)  # no nonce: MLPerf's per-query salt as before


def test_a_salt_s_words_are_its_value_s_digits_low_first() -> None:
    """salt_text writes salt_value's base-len(TOKEN_PIECES) digits, lowest first, one word each: over
    random values of both kinds (with and without a nonce) and the values at the ends of the range."""
    for i in range(300):
        for nonce in (None, 7, 2**64 - 1):
            assert decode_salt(salt_text(9, i, nonce)) == salt_value(9, i, nonce)
    for value in (0, 1, len(TOKEN_PIECES) - 1, len(TOKEN_PIECES) ** 2, 2**64 - 1):
        assert decode_salt(salt_words(value)) == value


def _text_llm(name: str) -> bool:
    """An MLPerf LLM profile of text prompts (the per-query salt rule's scope): not a recommender, video or
    vision-language one (KServe v2, videogen, image parts), whose requests carry no text prompt to salt."""
    profile, _ = load_profile(name)
    return all(
        (sc.api or profile.api) in ("chat", "completions") and sc.images is None for sc in profile.scenarios
    )


MLPERF_PROFILES = sorted(
    p.stem
    for p in (Path(__file__).parents[1] / "traffic_profiles").glob("mlperf-*.yaml")
    if _text_llm(p.stem)
)


def decode_salt(text: str) -> int:
    """The salt's value read back from its words (salt_text writes base-len(TOKEN_PIECES) digits, low first)."""
    words = [" " + w for w in text.split(" ")[1:]]
    assert len(words) == SALT_TOKENS and all(w in TOKEN_PIECES for w in words), text
    base = len(TOKEN_PIECES)
    return sum(TOKEN_PIECES.index(w) * base**k for k, w in enumerate(words))


@pytest.mark.parametrize("name", MLPERF_PROFILES)
def test_mlperf_profiles_salt_each_query_between_system_prompt_and_user_context(name: str) -> None:
    """MLPerf Endpoints (docs/sources.md §2): a per-query salt of ≥ 64 bits after the system prompt, before
    the user context: the prompt's first user words decode to the query's own 64-bit salt."""
    assert len(MLPERF_PROFILES) >= 8
    profile, _ = load_profile(name)
    assert all(sc.salt for sc in profile.scenarios) and profile.run_salt == "per_run"
    assert len(TOKEN_PIECES) ** SALT_TOKENS >= 2**SALT_BITS >= 2**64
    w = Workload(profile, profile.seed, run_nonce=0xC0FFEE)
    values = set()
    for i in range(40):
        messages = w.request(i).body["messages"]
        users = [k for k, m in enumerate(messages) if m["role"] == "user"]
        system = [k for k, m in enumerate(messages) if m["role"] == "system"]
        assert users and all(k < users[0] for k in system)  # any system prompt comes first
        salt = salt_text(profile.seed, i, 0xC0FFEE)
        content = messages[users[0]]["content"]
        assert content.startswith(salt) and all(salt not in m["content"] for m in messages[: users[0]])
        values.add(decode_salt(content[: len(salt)]))
        assert w.tokenizer.count(salt) == SALT_TOKENS  # one token a word: the salt is in the prompt's tokens
    assert len(values) == 40  # distinct per query
    assert max(values).bit_length() > 56  # drawn from the full 64-bit range, not a counter
