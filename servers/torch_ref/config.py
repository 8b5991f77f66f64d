"""Model shapes: built-in presets and Hugging Face ``config.json`` files (Llama-style decoders)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A model config that cannot be used; the message names the file or field and the fix."""


@dataclass(frozen=True)
class ModelConfig:
    """The fields of a Llama-style ``config.json`` this server uses."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    rope_theta: float = 500000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    tokenizer: str = "llama3"  # loadtest tokenizer name or path (see loadtest.tokens.tokenizer)
    eos_token_ids: tuple[int, ...] = ()  # empty: the tokenizer's end tokens

    def __post_init__(self) -> None:
        for f in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "intermediate_size", "vocab_size"):  # fmt: skip
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"model config {self.name!r}: {f} must be a positive integer (got {v!r})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"model config {self.name!r}: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads})"
            )
        if not self.head_dim:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(
                    f"model config {self.name!r}: hidden_size must be a multiple of num_attention_heads "
                    "(or give head_dim)"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.head_dim % 2:
            raise ConfigError(f"model config {self.name!r}: head_dim must be even for RoPE")

    @property
    def group_size(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def param_count(self) -> int:
        """Parameters implied by the shapes (embeddings and head counted once when tied)."""
        d, hd, ff = self.hidden_size, self.head_dim, self.intermediate_size
        attn = d * hd * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        layer = attn + 3 * d * ff + 2 * d
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + emb + d

    def kv_bytes_per_token(self, bytes_per_elem: int) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * bytes_per_elem

    def describe(self) -> dict[str, Any]:
        out = asdict(self)
        out["params"] = self.param_count()
        return out


# A model small enough for CI on CPU, with the llama3 tokenizer's full vocabulary (real token ids).
TINY = ModelConfig(
    name="torch-ref-tiny",
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=128256,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)

# meta-llama/Llama-3.1-8B config.json (the shapes of loadtest's Llama-3.1-8B engine preset).
LLAMA_3_1_8B = ModelConfig(
    name="Llama-3.1-8B",
    hidden_size=4096,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=14336,
    vocab_size=128256,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    max_position_embeddings=131072,
)

PRESETS: dict[str, ModelConfig] = {
    "tiny": TINY,
    "llama-3.1-8b": LLAMA_3_1_8B,
    "llama3.1-8b": LLAMA_3_1_8B,
}

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def from_hf_dict(cfg: dict[str, Any], name: str, source: str, tokenizer: str | None = None) -> ModelConfig:
    """A ModelConfig from the fields of a Hugging Face ``config.json`` (``source`` names it in errors)."""
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ConfigError(f"{source}: missing {', '.join(missing)} (a Llama-style config.json has them)")
    arch = cfg.get("architectures") or []
    known = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
    if arch and not any(a in known for a in arch):
        raise ConfigError(f"{source}: architectures {arch} is not a Llama-style decoder ({', '.join(known)})")
    if cfg.get("attention_bias") or arch == ["Qwen2ForCausalLM"]:
        raise ConfigError(f"{source}: attention biases are not supported (Llama-style decoders only)")
    eos = cfg.get("eos_token_id")
    try:
        return ModelConfig(
            name=name,
            hidden_size=int(cfg["hidden_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=int(cfg["num_attention_heads"]),
            num_key_value_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            head_dim=int(cfg.get("head_dim") or 0),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rope_scaling=cfg.get("rope_scaling"),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            tokenizer=tokenizer or "llama3",
            eos_token_ids=tuple(i for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)),
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{source}: {e}") from None


def load_config(spec: str, tokenizer: str | None = None) -> ModelConfig:
    """A preset name (``tiny``, ``llama-3.1-8b``), a ``config.json`` path or a checkpoint folder holding one."""
    preset = PRESETS.get(spec.lower())
    if preset is not None:
        if tokenizer:
            return replace(preset, tokenizer=tokenizer)
        return preset
    path = Path(spec).expanduser()
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(
            f"--config {spec}: not a preset ({', '.join(sorted(PRESETS))}) and no config.json at {file}"
        )
    try:
        cfg = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{file}: not readable JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{file}: must hold a JSON object")
    folder = file.parent
    if tokenizer is None and (folder / "tokenizer.json").is_file():
        tokenizer = str(folder)
    return from_hf_dict(cfg, folder.name or "model", str(file), tokenizer)
