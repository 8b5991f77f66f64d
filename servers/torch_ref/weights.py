"""Model weights: seeded random initialization, or a local Hugging Face checkpoint (safetensors)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from servers.torch_ref.config import ConfigError, ModelConfig
from servers.torch_ref.model import Layer, Weights


def random_weights(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Weights:
    """Seeded normal(0, 0.02) weights (output projections scaled down by depth), unit norms.

    Like vLLM's ``--load-format dummy``: the text means nothing, the shapes and so the timing are real.
    Values are drawn on the target device, so an 8B model initializes in about a second on a GPU.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    std = 0.02
    out_std = std / math.sqrt(2 * cfg.num_hidden_layers)

    def normal(rows: int, cols: int, s: float = std) -> torch.Tensor:
        t = torch.empty(rows, cols, device=device, dtype=dtype)
        return t.normal_(0.0, s, generator=gen)

    def ones() -> torch.Tensor:
        return torch.ones(cfg.hidden_size, device=device, dtype=dtype)

    d, hd = cfg.hidden_size, cfg.head_dim
    qkv_rows = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
    layers = [
        Layer(
            input_norm=ones(),
            qkv=normal(qkv_rows, d),
            o=normal(d, cfg.num_attention_heads * hd, out_std),
            post_norm=ones(),
            gate_up=normal(2 * cfg.intermediate_size, d),
            down=normal(d, cfg.intermediate_size, out_std),
        )
        for _ in range(cfg.num_hidden_layers)
    ]
    embed = normal(cfg.vocab_size, d)
    head = embed if cfg.tie_word_embeddings else normal(cfg.vocab_size, d)
    return Weights(embed=embed, layers=layers, norm=ones(), lm_head=head)


def _safetensor_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def load_hf_checkpoint(cfg: ModelConfig, folder: Path, device: torch.device, dtype: torch.dtype) -> Weights:
    """Weights from a Hugging Face Llama-layout checkpoint folder (``*.safetensors``)."""
    from safetensors import safe_open

    files = _safetensor_files(folder)
    if not files:
        raise ConfigError(f"--checkpoint {folder}: no *.safetensors files there (HF layout expected)")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[key] = sf.get_tensor(key)
    return weights_from_hf_tensors(cfg, tensors.__getitem__, set(tensors), str(folder), device, dtype)


def weights_from_hf_tensors(
    cfg: ModelConfig,
    get: Callable[[str], torch.Tensor],
    names: set[str],
    source: str,
    device: torch.device,
    dtype: torch.dtype,
) -> Weights:
    """Assemble Weights from HF tensor names (``model.layers.{i}.self_attn.q_proj.weight``...)."""

    def t(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in names:
            raise ConfigError(f"{source}: tensor {name} is missing (does the config match the checkpoint?)")
        x = get(name)
        if tuple(x.shape) != shape:
            raise ConfigError(
                f"{source}: tensor {name} has shape {tuple(x.shape)}, the config implies {shape}"
            )
        return x.to(device=device, dtype=dtype)

    d, hd, ff = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    qd, kvd = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat(
            [
                t(p + "self_attn.q_proj.weight", (qd, d)),
                t(p + "self_attn.k_proj.weight", (kvd, d)),
                t(p + "self_attn.v_proj.weight", (kvd, d)),
            ]
        )
        gate_up = torch.cat([t(p + "mlp.gate_proj.weight", (ff, d)), t(p + "mlp.up_proj.weight", (ff, d))])
        layers.append(
            Layer(
                input_norm=t(p + "input_layernorm.weight", (d,)),
                qkv=qkv,
                o=t(p + "self_attn.o_proj.weight", (d, qd)),
                post_norm=t(p + "post_attention_layernorm.weight", (d,)),
                gate_up=gate_up,
                down=t(p + "mlp.down_proj.weight", (d, ff)),
            )
        )
    embed = t("model.embed_tokens.weight", (cfg.vocab_size, d))
    if "lm_head.weight" in names and not cfg.tie_word_embeddings:
        head = t("lm_head.weight", (cfg.vocab_size, d))
    else:
        head = embed
    return Weights(embed=embed, layers=layers, norm=t("model.norm.weight", (d,)), lm_head=head)
