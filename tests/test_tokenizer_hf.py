"""Hugging Face tokenizer.json folders work offline, chat template included, and a served model's own
tokenizer is found in local files (its folder, the Hugging Face cache), never downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import models, pre_tokenizers, trainers

from loadtest.tokens.tokenizer import (
    Tokenizer,
    TokenizerChoice,
    bundled_family,
    choose_tokenizer,
    find_model_tokenizer,
    hf_hub_cache,
)
from loadtest.workload.text import WORDS, keyed_text, pool_words_are_tokens, synth_text

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf-tokenizer")
    tok = HfTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<unk>", "<s>", "<|end|>", "<|user|>", "<|system|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials)
    rng = random.Random(0)
    corpus = [" ".join(rng.choices(WORDS, k=50)) for _ in range(300)]
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "bos_token": "<s>"}))
    return folder


def test_hf_folder_counts_and_renders_its_chat_template(hf_folder: Path) -> None:
    tok = Tokenizer(str(hf_folder))
    assert tok.count(" the of and") == len(tok.encode(" the of and")) > 0
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the water is long"}]
    rendered = "<s><|system|>\nbe brief<|end|>\n<|user|>\nthe water is long<|end|>\n<|assistant|>\n"
    assert tok._render_hf(msgs) == rendered
    ids = tok.encode_chat(msgs)
    assert len(ids) == tok.count_chat(msgs)
    # Special tokens of the template are single tokens, not spelled out.
    assert ids.count(tok._hf.token_to_id("<|end|>")) == 2


def test_synthetic_prompts_hit_their_length_with_an_hf_tokenizer(hf_folder: Path) -> None:
    tok = Tokenizer(str(hf_folder / "tokenizer.json"))
    rng = random.Random(1)
    for n in (50, 500, 3000):
        got = tok.count(synth_text(n, rng, tok))
        assert abs(got - n) <= max(1, 0.01 * n), (n, got)
    # an HF tokenizer's words are always counted: nothing says its tokens never span two words
    assert not pool_words_are_tokens(tok)
    for n in (50, 500):
        got = tok.count(keyed_text(n, f"k:{n}".encode(), tok))
        assert abs(got - n) <= max(1, 0.01 * n), (n, got)


def test_bad_tokenizer_paths_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tokenizer"):
        Tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a Hugging Face tokenizer.json"):
        Tokenizer(str(tmp_path / "bad.json"))


JINJA = (
    "{% for m in messages %}{% if loop.index > 9 %}{% break %}{% endif %}[{{ m['role'] }}] {{ m['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _copy_tokenizer(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    return dst


def test_chat_template_jinja_is_the_template_current_transformers_writes(
    hf_folder: Path, tmp_path: Path
) -> None:
    """save_pretrained writes chat_template.jinja (and no chat_template in tokenizer_config.json);
    where both exist the .jinja file wins, as in transformers."""
    only_jinja = _copy_tokenizer(hf_folder, tmp_path / "new")
    (only_jinja / "chat_template.jinja").write_text(JINJA)
    (only_jinja / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<s>"}}))
    tok = Tokenizer(str(only_jinja))
    msgs = [{"role": "user", "content": "the water"}]
    assert tok.template_file == "chat_template.jinja"
    assert tok._render_hf(msgs) == "[user] the water<|end|><|assistant|>"
    assert tok.count_chat(msgs) == len(tok._hf.encode("[user] the water<|end|><|assistant|>").ids)
    assert tok.count_chat(msgs) != Tokenizer(str(hf_folder)).count_chat(msgs)  # not the config's template
    both = _copy_tokenizer(hf_folder, tmp_path / "both")
    (both / "tokenizer_config.json").write_text((hf_folder / "tokenizer_config.json").read_text())
    (both / "chat_template.jinja").write_text(JINJA)
    assert Tokenizer(str(both)).template_file == "chat_template.jinja"
    assert Tokenizer(str(hf_folder)).template_file == "tokenizer_config.json"
    none = _copy_tokenizer(hf_folder, tmp_path / "none")
    assert Tokenizer(str(none)).template_file is None
    (none / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="chat template does not parse"):
        Tokenizer(str(none))


def _cache_repo(hub: Path, repo: str, src: Path, snapshot: str = "abc123") -> Path:
    folder = hub / ("models--" + repo.replace("/", "--"))
    snap = _copy_tokenizer(src, folder / "snapshots" / snapshot)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(snapshot)
    return snap


def test_the_models_own_tokenizer_is_found_in_local_files_only(hf_folder: Path, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    snap = _cache_repo(hub, "acme/Tiny-Chat-1B", hf_folder)
    _cache_repo(hub, "acme/dup", hf_folder)
    _cache_repo(hub, "other/dup", hf_folder)
    old = _copy_tokenizer(hf_folder, hub / "models--acme--Tiny-Chat-1B" / "snapshots" / "old")
    assert old != snap
    # The repository id, any case; a path holding the cache layout; a unique bare name.
    for served in (
        "acme/Tiny-Chat-1B",
        "ACME/tiny-chat-1b",
        "/srv/hub/models--acme--Tiny-Chat-1B/snapshots/x",
        "tiny-chat-1b",
    ):
        found = find_model_tokenizer(served, hub)
        assert found is not None and Path(found.path) == snap and found.how == "hf_cache", served
        assert found.repo == "acme/Tiny-Chat-1B"
    assert find_model_tokenizer("dup", hub) is None  # two repositories of that name: no guessing
    assert find_model_tokenizer("acme/unknown", hub) is None
    assert find_model_tokenizer("llama-3.1-8b", tmp_path / "no-such-hub") is None
    # A served id that is a folder (vLLM --model /path), or a file in one (llama.cpp's .gguf).
    local = _copy_tokenizer(hf_folder, tmp_path / "models" / "tiny")
    (local / "tiny.gguf").write_bytes(b"GGUF")
    for served in (str(local), str(local / "tiny.gguf")):
        found = find_model_tokenizer(served, hub)
        assert found is not None and found.how == "model_folder" and Path(found.path) == local.resolve()


def test_hf_cache_location_follows_the_hugging_face_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hf_hub_cache() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hf_hub_cache() == tmp_path / "hub"


def test_the_tokenizer_choice_prefers_the_best_evidence(hf_folder: Path, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    snap = _cache_repo(hub, "acme/tiny", hf_folder)

    def choose(**kw: object) -> TokenizerChoice:
        args: dict = {"option": None, "profile_tokenizer": "llama3", "model": "acme/tiny", "hub": hub, **kw}
        return choose_tokenizer(**args)

    assert choose(option="qwen3").source == "option"
    assert choose(profile_tokenizer=str(hf_folder)).source == "profile"
    assert (choose(engine_tokenizer="llama3").source, choose(engine_tokenizer="llama3").guessed) == (
        "engine",
        False,
    )
    assert choose(engine_tokenizer="qwen3").name == "llama3"  # the profile named its own
    assert choose(engine_tokenizer="qwen3", profile_sets_it=False).name == "qwen3"
    found = choose()
    assert (found.name, found.source, found.guessed) == (
        str(snap),
        "hf_cache",
        False,
    ) and "acme/tiny" in found.detail
    family = choose(model="meta-llama/Llama-3.1-8B-Instruct")
    assert (family.source, family.name, family.guessed) == ("family", "llama3", False)
    guess = choose(model="mistralai/Mistral-7B-Instruct-v0.3")
    assert (guess.source, guess.name, guess.guessed) == ("guess", "llama3", True)
    assert "Mistral-7B-Instruct-v0.3" in guess.detail and str(hub) in guess.detail
    assert choose(model=None).guessed
    assert choose(profile_tokenizer="o200k_harmony", model="openai/gpt-oss-20b").source == "family"
    assert bundled_family("Qwen/Qwen3-0.6B") == "qwen3" and bundled_family("gpt-4o-mini") == "o200k_base"
    assert bundled_family("gpt-4-turbo") == "cl100k_base" and bundled_family("mistral-7b") is None
