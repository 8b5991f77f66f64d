#!/usr/bin/env python3
"""Make a tiny Llama model folder (random weights, a BPE tokenizer trained here) that vLLM and loadtest load offline.

`python servers/tiny_llama.py OUT_DIR [--seed N]` writes a Hugging Face model folder: `config.json`
(LlamaForCausalLM, 4 layers, hidden 256, 4 heads / 2 KV heads, context 8192), `model.safetensors`
(seeded random float32 weights), `tokenizer.json` (byte-level BPE trained with the `tokenizers` library
on the project's own docs and the workload's word list), `tokenizer_config.json`, a Llama-3-style
`chat_template.jinja` (where current transformers writes it), `generation_config.json` and
`special_tokens_map.json`. Nothing is downloaded.

The output head is shaped so the model only ever samples whole-word tokens (" word": a leading space and
letters, which the tokenizer encodes back to that one token). A random model's text then re-tokenizes
to the tokens it was generated from, so the client's own count of a streamed answer can be checked
against the server's usage exactly; any other token is a counting bug, not a tokenizer ambiguity.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 4, 256, 4, 2, 512
CONTEXT = 8192
VOCAB = 4096
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
_WORD_TOKEN = re.compile(r"^Ġ[A-Za-z]+$")


def corpus() -> list[str]:
    """Local text to train on: the project's docs and README, and the workload's words many times."""
    from loadtest.workload.text import WORDS

    texts = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))]
    texts.append((ROOT / "README.md").read_text(encoding="utf-8"))
    texts += [" ".join(WORDS)] * 200
    return texts


def train_tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def word_tokens(tok: object) -> list[int]:
    """Ids of the tokens that are a whole word with its leading space and encode back to themselves."""
    out = []
    for piece, i in tok.get_vocab().items():  # type: ignore[attr-defined]
        if _WORD_TOKEN.match(piece) and tok.encode(tok.decode([i])).ids == [i]:  # type: ignore[attr-defined]
            out.append(i)
    return sorted(out)


def weights(vocab: int, allowed: list[int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    kv = HIDDEN // HEADS * KV_HEADS
    out = {"model.embed_tokens.weight": w(vocab, HIDDEN), "model.norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "post_attention_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "self_attn.q_proj.weight": w(HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": w(kv, HIDDEN),
            p + "self_attn.v_proj.weight": w(kv, HIDDEN),
            p + "self_attn.o_proj.weight": w(HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": w(FFN, HIDDEN),
            p + "mlp.up_proj.weight": w(FFN, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, FFN),
        }
    # The head scores only whole-word tokens: other rows are zero (logit 0), word rows are large and
    # random (logits of tens), so sampling at temperature 1 picks a word token all but always.
    head = np.zeros((vocab, HIDDEN), np.float32)
    head[allowed] = w(len(allowed), HIDDEN, scale=2.0)
    out["lm_head.weight"] = head
    return out


def make(out_dir: Path, seed: int = 0) -> Path:
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    vocab = tok.get_vocab_size()  # type: ignore[attr-defined]
    ids = {s: tok.token_to_id(s) for s in SPECIAL}  # type: ignore[attr-defined]
    allowed = word_tokens(tok)
    if len(allowed) < 200:
        sys.exit(f"only {len(allowed)} whole-word tokens in the trained vocabulary: too few")
    tok.save(str(out_dir / "tokenizer.json"))  # type: ignore[attr-defined]
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    bos, eos = "<|begin_of_text|>", "<|eot_id|>"
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": bos,
                "eos_token": eos,
                "pad_token": "<|end_of_text|>",
                "model_max_length": CONTEXT,
                "clean_up_tokenization_spaces": False,
                "add_bos_token": False,
            },
            indent=1,
        )
    )
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": bos, "eos_token": eos, "pad_token": "<|end_of_text|>"}, indent=1)
    )
    eos_ids = [ids["<|eot_id|>"], ids["<|end_of_text|>"]]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "vocab_size": vocab,
        "bos_token_id": ids[bos],
        "eos_token_id": eos_ids,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "attention_bias": False,
        "mlp_bias": False,
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": ids[bos], "eos_token_id": eos_ids}, indent=1)
    )
    save_file(weights(vocab, allowed, seed), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(make(args.out_dir, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
