"""Workload synthesis: exact token counts, determinism, profile validation errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from loadtest.profile.loader import ProfileError, load_profile, parse_profile, shipped_profiles
from loadtest.schedule.arrivals import arrival_offsets, worker_share
from loadtest.tokens.tokenizer import get_tokenizer
from loadtest.workload import text as text_module
from loadtest.workload.builder import Workload
from loadtest.workload.text import TOKEN_PIECES, keyed_text, pool_words_are_tokens, synth_text
from tests.conftest import write_profile


@pytest.mark.parametrize("name", ["llama3", "cl100k", "o200k", "qwen3"])
def test_synthetic_text_has_exact_token_count(name: str) -> None:
    tok = get_tokenizer(name)
    rng = random.Random(1)
    for n in (1, 2, 17, 512, 4000):
        assert tok.count(synth_text(n, rng)) == n
        keyed = keyed_text(n, f"1:{n}".encode())
        assert tok.count(keyed) == n
        assert keyed_text(n, f"1:{n}".encode()) == keyed  # the key alone decides the words
        assert keyed_text(n, f"2:{n}".encode()) != keyed


@pytest.mark.parametrize("name", ["llama3", "cl100k", "o200k", "qwen3", "o200k_harmony"])
def test_a_bundled_encoding_builds_exact_prompts_without_counting_its_pool_words(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pool word is one token of a bundled encoding and none spans two, so the build takes the salt
    and the keyed words at their word count: the same prompts as counting them, of exactly their length."""
    tok = get_tokenizer(name)
    assert pool_words_are_tokens(tok)
    assert all(tok.count(w) == 1 for w in TOKEN_PIECES)
    for n_in in (100, 357, 3000):
        data = {
            "name": "p",
            "salt": True,
            "input_tokens": {"dist": "fixed", "value": n_in},
            "output_tokens": {"dist": "fixed", "value": 2},
            "load": {"concurrency": 1},
        }
        fast = Workload(parse_profile(data, Path("p.yaml")), 7, tokenizer=name, run_nonce=5)
        with monkeypatch.context() as m:  # every word counted, as for a tokenizer that is not bundled
            m.setitem(text_module._POOL_TOKENS, tok.name, False)
            counted = Workload(parse_profile(data, Path("p.yaml")), 7, tokenizer=name, run_nonce=5)
            assert not counted._pool_tokens
            slow = [counted.request(i) for i in range(20)]
        for i, req in enumerate(slow):
            assert fast.request(i).body == req.body
            assert req.prompt_tokens == n_in == tok.count_chat(req.body["messages"]), (n_in, i)


@pytest.mark.parametrize("name", ["llama3", "cl100k", "o200k", "qwen3", "o200k_harmony"])
def test_a_prompt_of_pool_words_is_taken_at_its_built_length_and_that_is_its_count(name: str) -> None:
    """A prompt built of pool words alone is given the count it was built to (its template and system
    prompt's plus its words'), not counted again: that figure is the tokenizer's own count of the body,
    for chat and completions, with and without a system prompt, salt and run nonce, however short."""
    tok = get_tokenizer(name)
    for api in ("chat", "completions"):
        for system in (0, 20):
            for salt, run_salt in ((True, "per_seed"), (False, "per_seed"), (True, "off"), (False, "off")):
                data = {
                    "name": "p",
                    "api": api,
                    "salt": salt,
                    "run_salt": run_salt,
                    "system_prompt_tokens": system,
                    "input_tokens": {"dist": "uniform", "min": 1, "max": 60},
                    "output_tokens": {"dist": "fixed", "value": 2},
                    "load": {"concurrency": 1},
                }
                w = Workload(parse_profile(data, Path("p.yaml")), 7, tokenizer=name)
                assert w._chat_adds
                for i in range(30):
                    req = w.request(i)
                    body = req.body
                    real = tok.count_chat(body["messages"]) if api == "chat" else tok.count(body["prompt"])
                    assert req.prompt_tokens == real, (api, system, salt, run_salt, i)


def test_keyed_prompts_depend_on_seed_and_index_and_off_keeps_the_seeded_words() -> None:
    """With a run nonce a request's own words come from its key, without one from the seeded generator
    as before; both reproducible, and requests of one run differ."""
    data = {
        "name": "p",
        "input_tokens": {"dist": "fixed", "value": 40},
        "output_tokens": {"dist": "fixed", "value": 2},
        "load": {"concurrency": 1},
    }
    for mode in ("per_seed", "off"):
        profile = parse_profile({**data, "run_salt": mode}, Path("p.yaml"))
        a, b = Workload(profile, 7), Workload(profile, 7)
        first = [a.request(i).body["messages"][-1]["content"] for i in range(20)]
        assert first == [b.request(i).body["messages"][-1]["content"] for i in range(20)]
        assert len(set(first)) == 20
        assert all(a.tokenizer.count_chat(a.request(i).body["messages"]) == 40 for i in range(20))
    # off: the words are the generator's seeded by "seed:index", the first draws whatever their count
    off = parse_profile({**data, "run_salt": "off"}, Path("p.yaml"))
    words = "".join(random.Random("7:3").choices(TOKEN_PIECES, k=5))
    assert Workload(off, 7).request(3).body["messages"][-1]["content"].startswith(words)


def test_fast_chat_count_equals_encoding_the_rendered_template() -> None:
    tok = get_tokenizer("llama3")
    rng = random.Random(0)
    for i in range(200):
        msgs = [
            {"role": "system", "content": synth_text(rng.randint(0, 40), rng)},
            {
                "role": "user",
                "content": synth_text(rng.randint(0, 600), rng) + rng.choice(["", "\n", " ok!\n\n", "  x"]),
            },
        ][i % 2 :]
        rendered = tok.render_chat(msgs)
        assert tok.count_chat(msgs) == len(tok._enc.encode(rendered, allowed_special="all"))


def test_requests_are_deterministic_and_hit_their_prompt_length(tmp_path: Path) -> None:
    prof, _ = load_profile(
        str(
            write_profile(
                tmp_path / "p.yaml",
                system_prompt_tokens=40,
                input_tokens={"dist": "uniform", "min": 100, "max": 3000},
            )
        )
    )
    # Request i follows from the profile, the seed and the run nonce (a new one per run by default).
    a, b = Workload(prof, run_nonce=7), Workload(prof, run_nonce=7)
    for i in range(50):
        ra, rb = a.request(i), b.request(i)
        assert ra.body == rb.body and ra.prompt_tokens == rb.prompt_tokens
    w = Workload(prof)
    from loadtest.workload.lengths import sample_length

    for i in range(50):
        target = sample_length(prof.scenarios[0].input_tokens, random.Random(f"{prof.seed}:{i}"))
        assert abs(w.request(i).prompt_tokens - target) <= max(1, 0.01 * target)
    assert a.fingerprint() == b.fingerprint()
    assert Workload(prof, seed=99).fingerprint() != a.fingerprint()


def test_open_loop_split_is_a_partition_of_one_schedule() -> None:
    full = [t for _, t in zip(range(300), arrival_offsets(5.0, 3), strict=False)]
    parts = [list(zip(range(100), worker_share(5.0, 3, w, 3), strict=False)) for w in range(3)]
    merged = sorted((i, t) for p in parts for _, (i, t) in p)
    assert [t for _, t in merged] == full[: len(merged)]
    gaps = [b - a for a, b in zip(full, full[1:], strict=False)]
    assert abs(sum(gaps) / len(gaps) - 0.2) < 0.04  # Poisson at 5/s: mean gap 0.2 s


def test_shipped_profiles_validate() -> None:
    assert "interactive-chat" in shipped_profiles()
    for name in shipped_profiles():
        load_profile(name)


def test_profile_errors_name_file_key_and_fix(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(
        "name: x\ninput_tokens: {dist: fixed, value: 10}\noutput_tokens: {dist: gamma, k: 2}\nload: {concurrency: 2, rate: 3}\nbogus: 1\n"
    )
    with pytest.raises(ProfileError) as e:
        load_profile(str(p))
    msg = str(e.value)
    assert str(p) in msg and "output_tokens" in msg and "bogus" in msg and "load" in msg
    assert "docs/profiles.md" in msg


def test_chat_token_ids_equal_encoding_the_rendered_template() -> None:
    tok = get_tokenizer("llama3")
    rng = random.Random(4)
    for _ in range(50):
        msgs = [
            {"role": "system", "content": synth_text(rng.randint(0, 30), rng)},
            {"role": "user", "content": synth_text(rng.randint(1, 300), rng) + " end\n"},
        ]
        ids = tok.encode_chat(msgs)
        assert ids == list(tok._enc.encode(tok.render_chat(msgs), allowed_special="all"))
        assert len(ids) == tok.count_chat(msgs)


@pytest.mark.parametrize("name", ["llama3", "qwen3", "o200k_harmony", "cl100k"])
def test_client_and_engine_count_a_chat_prompt_the_same_way(name: str) -> None:
    tok = get_tokenizer(name)
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": synth_text(50, random.Random(1))},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert tok.count_chat(msgs) == len(tok.encode_chat(msgs))
    assert tok.count_request(msgs, tools) == len(tok.encode_request(msgs, tools)) > tok.count_chat(msgs)


def test_fingerprint_does_not_depend_on_where_the_profile_lies(tmp_path: Path) -> None:
    """Two checkouts of one trace profile (trace and tokenizer beside it) send the same traffic."""
    trace_lines = "".join(
        f'{{"timestamp": {i * 250}, "input_length": {100 + i}, "output_length": {10 + i}, "hash_ids": [{i}]}}\n'
        for i in range(20)
    )
    fingerprints = []
    for where in ("checkout-a", "deeper/checkout-b"):
        folder = tmp_path / where
        folder.mkdir(parents=True)
        (folder / "trace.jsonl").write_text(trace_lines)
        prof = folder / "replay.yaml"
        prof.write_text(
            json.dumps(
                {
                    "name": "replay",
                    "load": {"trace": {"path": "trace.jsonl", "format": "mooncake"}},
                    "scenarios": [{"name": "replay", "kind": "trace"}],
                    "seed": 1,
                }
            )
        )
        profile, _ = load_profile(str(prof))
        assert profile.load.trace is not None and Path(profile.load.trace.path) == folder / "trace.jsonl"
        fingerprints.append(Workload(profile, seed=3).fingerprint())
    assert fingerprints[0] == fingerprints[1]


def test_tokenizer_file_is_found_beside_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models, pre_tokenizers

    folder = tmp_path / "profiles"
    folder.mkdir()
    tok = HfTokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    prof = write_profile(folder / "p.yaml", tokenizer="./tokenizer.json")
    monkeypatch.chdir(tmp_path)  # the current folder is not the profile's
    profile, _ = load_profile(str(prof))
    assert Path(profile.tokenizer) == folder / "tokenizer.json"
    assert get_tokenizer(profile.tokenizer).name == str(folder / "tokenizer.json")


def test_scenario_mix_follows_the_seed_and_the_weights_and_off_keeps_the_seeded_draw() -> None:
    data = {
        "name": "mix",
        "scenarios": [
            {
                "name": "a",
                "weight": 3,
                "input_tokens": {"dist": "fixed", "value": 8},
                "output_tokens": {"dist": "fixed", "value": 2},
            },
            {
                "name": "b",
                "weight": 1,
                "input_tokens": {"dist": "fixed", "value": 8},
                "output_tokens": {"dist": "fixed", "value": 2},
            },
        ],
        "load": {"concurrency": 1},
    }
    per_run = parse_profile(data, Path("p.yaml"))
    seq = [Workload(per_run, 5, run_nonce=1).scenario_for(i).name for i in range(4000)]
    # the mix follows the seed, not the run nonce: every run of a seed sends the same scenario sequence
    assert seq == [Workload(per_run, 5, run_nonce=2).scenario_for(i).name for i in range(4000)]
    assert seq != [Workload(per_run, 6, run_nonce=1).scenario_for(i).name for i in range(4000)]
    assert 0.72 < seq.count("a") / len(seq) < 0.78  # weights 3:1
    off = parse_profile({**data, "run_salt": "off"}, Path("p.yaml"))
    w = Workload(off, 5)
    for i in range(50):
        expected = "a" if random.Random(f"5:mix:{i}").random() < 0.75 else "b"
        assert w.scenario_for(i).name == expected
