"""Hardware and model presets (loaded from ``presets_data/*.yaml``) and the engine configuration."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from loadtest.sim.disagg_spec import Disagg
from loadtest.sim.router import ROUTERS
from loadtest.sim.spec_decode import SpecDecode

T = TypeVar("T")

DATA_DIR = Path(__file__).with_name("presets_data")
GB = 1e9
# Memory a serving engine keeps outside weights and KV (activations, CUDA graphs, NCCL buffers):
# "~4 GB" per GPU (docs/sources.md §3).
ENGINE_OVERHEAD_GB = 4.0


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: dense peak compute (TFLOP/s), HBM bandwidth (TB/s) and capacity (GB), NVLink."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    hbm_bw_tbs: float
    hbm_gb: float
    fp4_tflops: float | None = None
    nvlink_gbs: float = 0.0  # per GPU, bidirectional aggregate as datasheets print it
    source: str = ""
    aliases: tuple[str, ...] = ()

    def tflops(self, dtype: str) -> float:
        """Dense peak TFLOP/s for weights of ``dtype``: FP4 formats fall back to FP8 without FP4 cores."""
        if dtype in ("fp4", "mxfp4", "nvfp4"):
            return self.fp4_tflops if self.fp4_tflops else self.fp8_tflops
        if dtype in ("fp8", "int8"):
            return self.fp8_tflops
        return self.bf16_tflops

    def summary(self) -> str:
        fp4 = f"/{self.fp4_tflops:g}" if self.fp4_tflops else ""
        return (
            f"{self.name}: {self.bf16_tflops:g}/{self.fp8_tflops:g}{fp4} dense TFLOP/s (bf16/fp8"
            f"{'/fp4' if fp4 else ''}), {self.hbm_bw_tbs:g} TB/s, {self.hbm_gb:g} GB, NVLink {self.nvlink_gbs:g} GB/s"
        )


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
    bytes_per_param: float = 2
    tokenizer: str = "llama3"
    reasoning: bool = False
    # Weight precision for the FLOP rate ("bf16", "fp8", "mxfp4"); None: fp8 if 1 byte/param else bf16.
    weight_dtype: str | None = None
    # Mixture of experts: E routed experts, k per token, all routed-expert params (billions).
    n_experts: int = 0
    experts_per_token: int = 0
    n_shared_experts: int = 0
    expert_ffn: int = 0
    expert_params_b: float = 0.0
    expert_bytes_per_param: float | None = None  # None: bytes_per_param
    # Multi-head latent attention (DeepSeek): the KV cache is one latent of kv_lora_rank + rope dims.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    # Attention FLOPs width (4·L·attn_dim per query×context pair); 0: n_heads·head_dim.
    attn_dim: int = 0
    attn_dim_decode: int = 0  # the same for single-token (decode) items; 0: attn_dim
    native_tokenizer: str = ""  # the model's own tokenizer when ``tokenizer`` is a stand-in
    source: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def d_attn(self) -> int:
        return self.attn_dim or self.n_heads * self.head_dim

    @property
    def d_attn_decode(self) -> int:
        return self.attn_dim_decode or self.d_attn

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0 and self.experts_per_token > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def precision(self) -> str:
        """The weight precision that sets the FLOP rate."""
        return self.weight_dtype or ("fp8" if self.bytes_per_param <= 1 else "bf16")

    @property
    def dense_params_b(self) -> float:
        """Params outside the routed experts (attention, embeddings, shared experts, dense MLPs)."""
        return self.params_b - self.expert_params_b

    def kv_elems_per_token_layer(self) -> int:
        """KV-cache elements per token and layer: 2·n_kv_heads·head_dim, or the MLA latent."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    def kv_bytes_per_token(self, bytes_per_elem: int = 2) -> int:
        """KV-cache bytes one token occupies across all layers: 2·L·n_kv_heads·head_dim·bytes (MLA: latent)."""
        return self.n_layers * self.kv_elems_per_token_layer() * bytes_per_elem

    @property
    def dense_weight_bytes(self) -> float:
        return self.dense_params_b * GB * self.bytes_per_param

    @property
    def expert_weight_bytes(self) -> float:
        """All routed experts' weight bytes."""
        per = self.bytes_per_param if self.expert_bytes_per_param is None else self.expert_bytes_per_param
        return self.expert_params_b * GB * per

    @property
    def weight_bytes(self) -> float:
        """All weights: params × bytes_per_param, with the experts at their own precision if given."""
        if self.expert_params_b == 0:
            return self.params_b * GB * self.bytes_per_param
        return self.dense_weight_bytes + self.expert_weight_bytes

    def summary(self) -> str:
        moe = f", MoE {self.experts_per_token}/{self.n_experts}" if self.is_moe else ""
        return (
            f"{self.name}: {self.params_b:g}B ({self.active_params_b:g}B active{moe}), {self.n_layers} layers, "
            f"{self.precision}, {self.weight_bytes / GB:.1f} GB weights, "
            f"KV {self.kv_bytes_per_token(2) / 1024:.0f} KiB/token (bf16){', reasoning' if self.reasoning else ''}"
        )


@dataclass(frozen=True)
class SystemSpec:
    """A rack-scale system: ``gpus`` of one GPU preset, ``nvlink_domain_gpus`` of them per NVLink
    domain, ``scale_out_gbs`` GB/s per GPU between domains (InfiniBand)."""

    name: str
    gpu: str
    gpus: int
    nvlink_domain_gpus: int
    scale_out_gbs: float
    source: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def domains(self) -> int:
        return -(-self.gpus // self.nvlink_domain_gpus)

    def summary(self) -> str:
        return (
            f"{self.name}: {self.gpus} × {self.gpu}, NVLink domains of {self.nvlink_domain_gpus}, "
            f"{self.scale_out_gbs:g} GB/s per GPU between them"
        )


# ---- loading the YAML presets -----------------------------------------------------------------
def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch == ".")


# the preset dataclasses a YAML file holds (all take ``name`` and ``aliases``)
_PresetT = TypeVar("_PresetT", GpuSpec, ModelSpec, SystemSpec)


def _make(cls: type[_PresetT], name: str, entry: dict[str, Any]) -> _PresetT:
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(entry) - fields
    if unknown:
        raise ValueError(f"preset {name!r}: unknown fields {sorted(unknown)}")
    if not str(entry.get("source") or "").strip():
        raise ValueError(f"preset {name!r} has no source")
    return cls(name=name, **{**entry, "aliases": tuple(str(a) for a in entry.get("aliases") or ())})


def _load(filename: str, cls: type[_PresetT]) -> dict[str, _PresetT]:
    """The presets of one YAML file; ``extends: <earlier preset>`` copies it (aliases apart) first."""
    with (DATA_DIR / filename).open(encoding="utf-8") as fh:
        raw: dict[str, dict[str, Any]] = yaml.safe_load(fh)
    merged: dict[str, dict[str, Any]] = {}
    out: dict[str, _PresetT] = {}
    for key, value in raw.items():
        name, entry = str(key), dict(value)
        base = entry.pop("extends", None)
        if base is not None:
            if base not in merged:
                raise ValueError(f"preset {name!r} extends unknown or later preset {base!r}")
            entry = {**{k: v for k, v in merged[base].items() if k != "aliases"}, **entry}
        merged[name] = entry
        out[name] = _make(cls, name, entry)
    return out


def _index(kind: str, table: dict[str, Any]) -> dict[str, str]:
    """Normalized name or alias (with and without an "org/" prefix) → canonical name."""
    index: dict[str, str] = {}
    for canonical, spec in table.items():
        for n in (canonical, *spec.aliases):
            for key in {_norm(n), _norm(n.rsplit("/", 1)[-1])}:
                if index.setdefault(key, canonical) != canonical:
                    raise ValueError(f"{kind} alias {n!r} is ambiguous: {index[key]} and {canonical}")
    return index


GPUS: dict[str, GpuSpec] = _load("gpus.yaml", GpuSpec)
MODELS: dict[str, ModelSpec] = _load("models.yaml", ModelSpec)
SYSTEMS: dict[str, SystemSpec] = _load("systems.yaml", SystemSpec)
_GPU_INDEX = _index("GPU", GPUS)
_MODEL_INDEX = _index("model", MODELS)
_SYSTEM_INDEX = _index("system", SYSTEMS)

H100_SXM = GPUS["H100-SXM"]
H200_SXM = GPUS["H200-SXM"]
B200 = GPUS["B200"]
GB300 = GPUS["GB300"]
LLAMA_3_1_8B = MODELS["Llama-3.1-8B"]
LLAMA_2_70B = MODELS["Llama-2-70B"]
LLAMA_3_1_70B = MODELS["Llama-3.1-70B"]
LLAMA_3_1_405B = MODELS["Llama-3.1-405B"]
DEEPSEEK_R1 = MODELS["DeepSeek-R1"]
GPT_OSS_120B = MODELS["GPT-OSS-120B"]
QWEN3_VL_235B_A22B = MODELS["Qwen3-VL-235B-A22B"]


def _lookup(kind: str, name: str, table: dict[str, T], index: dict[str, str]) -> T:
    for key in (_norm(name), _norm(name.rsplit("/", 1)[-1])):
        if key in index:
            return table[index[key]]
    lines = [f"{c} (aliases: {', '.join(getattr(s, 'aliases', ())) or '-'})" for c, s in table.items()]
    raise ValueError(f"unknown {kind} {name!r}; valid names (case-insensitive): " + "; ".join(lines))


def get_gpu(name: str) -> GpuSpec:
    """A GPU preset by case-insensitive name or alias ("H100", "h200-sxm", "b200", ...)."""
    return _lookup("GPU", name, GPUS, _GPU_INDEX)


def get_model(name: str) -> ModelSpec:
    """A model preset by case-insensitive name or alias ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct")."""
    return _lookup("model", name, MODELS, _MODEL_INDEX)


def get_system(name: str) -> SystemSpec:
    """A rack-scale system preset by case-insensitive name or alias ("gb300-nvl72", "4xnvl72")."""
    return _lookup("system", name, SYSTEMS, _SYSTEM_INDEX)


def list_systems() -> list[SystemSpec]:
    """All system presets in file order."""
    return list(SYSTEMS.values())


def list_gpus() -> list[GpuSpec]:
    """All GPU presets in file order (``spec.summary()`` is a one-line description)."""
    return list(GPUS.values())


def list_models() -> list[ModelSpec]:
    """All model presets in file order (``spec.summary()`` is a one-line description)."""
    return list(MODELS.values())


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
    max_model_len: int | None = None  # context window (vLLM's --max-model-len); None: no limit
    # The event loop's timers round up to whole milliseconds; when True the last few ms before a
    # step deadline are slept in a helper thread (nanosleep, ~0.1 ms precise) instead.
    precise_timer: bool = True
    # KV cache (vLLM names): fraction of each GPU's HBM the engine may use, an override of the
    # computed block count, tokens per block, and automatic prefix caching.
    gpu_memory_utilization: float = 0.9
    kv_blocks: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    # Tensor-parallel all-reduce (clock.py): achieved fraction of per-direction NVLink bandwidth and
    # the fixed cost of one all-reduce.
    eta_link: float = 0.7
    allreduce_latency_us: float = 5.0
    # Wide expert parallelism (MoE): the instance spans ``ep`` groups of ``tp`` GPUs; attention runs
    # data-parallel (each group its own requests), routed experts are spread over all tp·ep GPUs and
    # tokens reach them by an all-to-all each MoE layer (clock.alltoall_time_s).
    ep: int = 1
    # The rack-scale system the instances run on (None: a GPU preset alone); sets the links.
    system: SystemSpec | None = None
    a2a_latency_us: float = 10.0
    # Speculative decoding / multi-token prediction (sim/spec_decode.py); k = 0: off.
    spec: SpecDecode = field(default_factory=SpecDecode)
    # Disaggregated prefill/decode pools (sim/disagg.py); off by default: one aggregated instance.
    disagg: Disagg = field(default_factory=Disagg)
    # Replicas behind the one endpoint (sim/replicas.py): independent instances of this preset and the
    # router's policy over them (sim/router.py), with its KV overlap weight (docs/sources.md §28).
    replicas: int = 1
    router: str = "round-robin"
    router_overlap_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.tp < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("tp, max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.speedup <= 0:
            raise ValueError("speedup must be > 0")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.block_size < 1 or (self.kv_blocks is not None and self.kv_blocks < 1):
            raise ValueError("block_size and kv_blocks must be >= 1")
        if not 0 < self.eta_link <= 1 or self.allreduce_latency_us < 0:
            raise ValueError("eta_link must be in (0, 1] and allreduce_latency_us >= 0")
        if self.ep < 1:
            raise ValueError("ep must be >= 1")
        if self.ep > 1 and not self.model.is_moe:
            raise ValueError(
                f"ep > 1 (expert parallelism) needs a mixture-of-experts model; {self.model.name} is dense"
            )
        if self.ep > 1 and self.ep > self.model.n_experts:
            raise ValueError(f"ep {self.ep} exceeds {self.model.name}'s {self.model.n_experts} experts")
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.router not in ROUTERS:
            raise ValueError(f"router {self.router!r}: give one of {', '.join(ROUTERS)}")
        if self.router_overlap_weight < 0:
            raise ValueError("the router's overlap weight must be >= 0")
        if self.replicas > 1 and self.disagg.enabled:
            raise ValueError("replicas and disaggregated pools do not combine: give one or the other")
        if self.system is not None:
            instances = self.disagg.prefill + self.disagg.decode if self.disagg.enabled else self.replicas
            if instances * self.gpus > self.system.gpus:
                raise ValueError(
                    f"{instances} instance(s) of {self.gpus} GPUs (tp {self.tp} × ep {self.ep}) exceed "
                    f"{self.system.name}'s {self.system.gpus} GPUs"
                )
        if (self.tp > 1 or self.ep > 1) and self.gpu.nvlink_gbs <= 0:
            raise ValueError(f"tp > 1 needs an NVLink bandwidth; {self.gpu.name} has none")

    @property
    def model_name(self) -> str:
        """The model id the server advertises and accepts."""
        return self.served_model_name or self.model.name

    @property
    def gpus(self) -> int:
        """GPUs of one instance: tp × ep."""
        return self.tp * self.ep

    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s across the instance's GPUs, at the weights' precision."""
        return self.gpu.tflops(self.model.precision) * 1e12 * self.gpus

    @property
    def peak_bw(self) -> float:
        """HBM bytes/s across the instance's GPUs."""
        return self.gpu.hbm_bw_tbs * 1e12 * self.gpus

    @property
    def a2a_link_bw(self) -> float:
        """Bytes/s per GPU one way for the expert all-to-all: NVLink within a domain, else scale-out."""
        sys = self.system
        if sys is not None and self.gpus > sys.nvlink_domain_gpus:
            return sys.scale_out_gbs * GB
        return self.link_bw

    @property
    def link_bw(self) -> float:
        """NVLink bytes/s per GPU in one direction (half the datasheet's bidirectional figure)."""
        return self.gpu.nvlink_gbs * GB / 2

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        """KV bytes per token on one GPU: KV heads split over TP (replicated when tp > n_kv_heads);
        an MLA latent is not split (every TP rank holds it whole)."""
        m = self.model
        if m.is_mla:
            return m.kv_bytes_per_token(self.kv_bytes_per_elem)
        heads = math.ceil(m.n_kv_heads / self.tp)
        return 2 * m.n_layers * heads * m.head_dim * self.kv_bytes_per_elem

    @property
    def weight_bytes_per_gpu(self) -> float:
        """Dense weights split over TP (each of the ep groups holds them), routed experts over all GPUs."""
        m = self.model
        if self.ep == 1:
            return m.weight_bytes / self.tp
        return m.dense_weight_bytes / self.tp + m.expert_weight_bytes / self.gpus

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds: (mem_util·HBM − weights/tp − ~4 GB) / per-GPU KV bytes; 0 if none fit."""
        free = (
            self.gpu_memory_utilization * self.gpu.hbm_gb * GB
            - self.weight_bytes_per_gpu
            - ENGINE_OVERHEAD_GB * GB
        )
        return max(0, int(free // self.kv_bytes_per_token_per_gpu)) * self.ep  # each group its own KV

    @property
    def num_kv_blocks(self) -> int:
        """KV blocks of ``block_size`` tokens: ``kv_blocks`` if set, else computed from memory."""
        if self.kv_blocks is not None:
            return self.kv_blocks
        return self.kv_capacity_tokens // self.block_size

    def describe(self) -> dict[str, object]:
        return {
            "gpu": self.gpu.name,
            "model": self.model.name,
            "served_model_name": self.model_name,
            "tp": self.tp,
            "ep": self.ep,
            "system": self.system.name if self.system is not None else None,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "speedup": self.speedup,
            "seed": self.seed,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "block_size": self.block_size,
            "kv_blocks": self.num_kv_blocks,
            "kv_blocks_override": self.kv_blocks is not None,
            "enable_prefix_caching": self.enable_prefix_caching,
            "kv_bytes_per_elem": self.kv_bytes_per_elem,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "weight_gb_per_gpu": round(self.weight_bytes_per_gpu / GB, 3),
            "weight_precision": self.model.precision,
            "reasoning": self.model.reasoning,
            "eta_c": self.eta_c,
            "eta_bw": self.eta_bw,
            "eta_link": self.eta_link,
            "allreduce_latency_us": self.allreduce_latency_us,
            "num_speculative_tokens": self.spec.k,
            "spec_acceptance": self.spec.acceptance,
            "spec_draft_layers": self.spec.draft_layers,
            "disagg_prefill": self.disagg.prefill,
            "disagg_decode": self.disagg.decode,
            "disagg_link_gbs": self.disagg.link_gbs,
            "replicas": self.replicas,
            "router": self.router if self.replicas > 1 else None,
            "gpu_source": self.gpu.source,
            "model_source": self.model.source,
        }
