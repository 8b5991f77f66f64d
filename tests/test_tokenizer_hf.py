"""Hugging Face tokenizer.json folders work offline, chat template included."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import models, pre_tokenizers, trainers

from loadtest.workload.text import WORDS, synth_text
from loadtest.workload.tokenizer import Tokenizer

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


def test_bad_tokenizer_paths_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tokenizer"):
        Tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a Hugging Face tokenizer.json"):
        Tokenizer(str(tmp_path / "bad.json"))
