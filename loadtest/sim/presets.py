"""Hardware and model presets for the simulated engine, plus the engine configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: dense peak compute (TFLOP/s), HBM bandwidth (TB/s) and capacity (GB)."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    hbm_bw_tbs: float
    hbm_gb: float


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only transformer's shape; params in billions (active = per-token for MoE)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    params_b: float
    active_params_b: float
    bytes_per_param: int = 2
    tokenizer: str = "llama3"

    @property
    def d_attn(self) -> int:
        return self.n_heads * self.head_dim

    def kv_bytes_per_token(self, bytes_per_elem: int = 2) -> int:
        """KV-cache bytes one token occupies across all layers: 2·L·n_kv_heads·head_dim·bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_elem

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param


# Source: NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989 TFLOP/s dense BF16, 1979 dense FP8,
# 3.35 TB/s HBM3, 80 GB), as tabulated in REFERENCE.md §3.
H100_SXM = GpuSpec("H100-SXM", bf16_tflops=989.0, fp8_tflops=1979.0, hbm_bw_tbs=3.35, hbm_gb=80.0)
# Source: NVIDIA H200 Tensor Core GPU datasheet (SXM: same compute as H100, 4.8 TB/s HBM3e,
# 141 GB), as tabulated in REFERENCE.md §3.
H200_SXM = GpuSpec("H200-SXM", bf16_tflops=989.0, fp8_tflops=1979.0, hbm_bw_tbs=4.8, hbm_gb=141.0)

# Source: meta-llama/Llama-3.1-8B config.json (32 layers, hidden 4096, 32 heads, 8 KV heads,
# head_dim 128, intermediate 14336; 8.03 B params), as tabulated in REFERENCE.md §3.
LLAMA_3_1_8B = ModelSpec(
    "Llama-3.1-8B",
    n_layers=32,
    d_model=4096,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    ffn=14336,
    params_b=8.03,
    active_params_b=8.03,
)
# Source: meta-llama/Llama-3.1-70B config.json (80 layers, hidden 8192, 64 heads, 8 KV heads,
# head_dim 128, intermediate 28672; 70.6 B params), as tabulated in REFERENCE.md §3.
LLAMA_3_1_70B = ModelSpec(
    "Llama-3.1-70B",
    n_layers=80,
    d_model=8192,
    n_heads=64,
    n_kv_heads=8,
    head_dim=128,
    ffn=28672,
    params_b=70.6,
    active_params_b=70.6,
)

GPUS: dict[str, GpuSpec] = {g.name: g for g in (H100_SXM, H200_SXM)}
MODELS: dict[str, ModelSpec] = {m.name: m for m in (LLAMA_3_1_8B, LLAMA_3_1_70B)}


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch == ".")


def _lookup(kind: str, name: str, table: dict[str, T], aliases: dict[str, str]) -> T:
    key = _norm(name)
    for canonical, spec in table.items():
        if _norm(canonical) == key or aliases.get(key) == canonical:
            return spec
    valid = sorted(table) + sorted(aliases)
    raise ValueError(f"unknown {kind} {name!r}; valid names (case-insensitive): {', '.join(valid)}")


_GPU_ALIASES = {"h100": "H100-SXM", "h200": "H200-SXM"}
_MODEL_ALIASES: dict[str, str] = {}


def get_gpu(name: str) -> GpuSpec:
    """A GPU preset by case-insensitive name ("H100", "h200-sxm", ...)."""
    return _lookup("GPU", name, GPUS, _GPU_ALIASES)


def get_model(name: str) -> ModelSpec:
    """A model preset by case-insensitive name ("llama-3.1-8b", ...); an "org/" prefix is ignored."""
    return _lookup("model", name.rsplit("/", 1)[-1], MODELS, _MODEL_ALIASES)


@dataclass(frozen=True)
class OutputLengthDist:
    """Target output length when the request does not force it: lognormal, clipped."""

    median: float = 200.0
    sigma: float = 0.8
    cap: int = 4096  # used when the request has no max_tokens


@dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes the simulated engine's behaviour and timing."""

    gpu: GpuSpec = H100_SXM
    model: ModelSpec = LLAMA_3_1_8B
    tp: int = 1
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    speedup: float = 1.0
    eta_c: float = 0.55
    eta_bw: float = 0.8
    t_req_us: float = 4.0
    kv_bytes_per_elem: int = 2
    seed: int = 0
    output_len: OutputLengthDist = field(default_factory=OutputLengthDist)
    served_model_name: str | None = None
    # The event loop's timers round up to whole milliseconds; when True the last few ms before a
    # step deadline are slept in a helper thread (nanosleep, ~0.1 ms precise) instead.
    precise_timer: bool = True

    def __post_init__(self) -> None:
        if self.tp < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("tp, max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.speedup <= 0:
            raise ValueError("speedup must be > 0")

    @property
    def model_name(self) -> str:
        """The model id the server advertises and accepts."""
        return self.served_model_name or self.model.name

    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s across the TP group, at the weights' precision."""
        tflops = self.gpu.fp8_tflops if self.model.bytes_per_param == 1 else self.gpu.bf16_tflops
        return tflops * 1e12 * self.tp

    @property
    def peak_bw(self) -> float:
        """HBM bytes/s across the TP group."""
        return self.gpu.hbm_bw_tbs * 1e12 * self.tp

    def describe(self) -> dict[str, object]:
        return {
            "gpu": self.gpu.name,
            "model": self.model.name,
            "served_model_name": self.model_name,
            "tp": self.tp,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "speedup": self.speedup,
            "seed": self.seed,
        }
