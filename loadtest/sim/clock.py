"""The per-step roofline time model of the simulated engine (docs/sources.md §3, plus TP, MoE and precision)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.sim.presets import EngineConfig, ModelSpec

# Base model (docs/sources.md §3), exact for a dense model on one GPU:
#   FLOPs  = 2·P_active·N + 4·L·d_attn·Σ n_i·(c_i + (n_i+1)/2)
#   Bytes  = W_bytes + kv_B·Σ (c_i + n_i)
#   T_step = t_fixed + t_req·B + max(FLOPs/(eta_c·F), Bytes/(eta_bw·BW))
# Extensions:
# - Precision: F is the GPU's dense peak at the weights' precision (bf16; fp8; MXFP4/NVFP4 use the
#   FP4 peak where the GPU has FP4 tensor cores, else FP8): GpuSpec.tflops.
# - Tensor parallelism (tp GPUs): weights, KV heads and FLOPs are split tp ways, so F and BW are the
#   group's (peak × tp) and the KV term uses per-GPU KV bytes × tp (KV heads are replicated when
#   tp > n_kv_heads, and an MLA latent is held whole by every rank, as vLLM does). Megatron-style
#   TP needs 2 all-reduces per layer (after attention and after the MLP) of the step's activations,
#   N·d_model·2 bytes (bf16). Ring all-reduce moves 2·(tp−1)/tp of the message over each GPU's link
#   (the NCCL "bus bandwidth" convention, nccl-tests doc/PERFORMANCE.md), so
#     T_ar = 2·L·(t_lat + 2·(tp−1)/tp · N·d_model·2 / (eta_link·B_link))
#   with B_link the per-direction NVLink bandwidth = half the datasheet's bidirectional figure
#   (H100: 900 GB/s bidirectional = 450 GB/s each way), eta_link = 0.7 (nccl-tests all_reduce on
#   8×H100 NVSwitch reaches a bus bandwidth of ~360 GB/s = 0.8 of 450 for large messages; the
#   few-MB messages of a decode step get less) and t_lat = 5 µs per all-reduce (the order of vLLM's
#   one-shot custom all-reduce for small messages on NVLink; NCCL's ring latency is higher). The
#   all-reduce is on the critical path (not overlapped) and added after the roofline max; zero at tp 1.
# - Mixture of experts: FLOPs use P_active. Weight bytes touched = dense (non-expert) weights +
#   the routed-expert weights of the experts the step's N tokens touch: with E experts and k per
#   token routed uniformly at random, a layer's expected distinct experts are E·(1 − (1 − k/E)^N),
#   so expert bytes = expert_weight_bytes·(1 − (1 − k/E)^N): k/E of them at N = 1, → all as N grows.
# - Attention FLOPs width: ModelSpec.d_attn for multi-token items, d_attn_decode for single-token
#   items (they differ only for MLA, which prefills in MHA form and decodes absorbed on the latent).
# - Wide expert parallelism (ep groups of tp GPUs, attention data-parallel over the groups, routed
#   experts spread over all tp·ep GPUs; docs/sources.md §27): F and BW are the instance's (× tp·ep);
#   every group reads the dense weights (dense bytes × ep), the touched experts are read once; each
#   group's all-reduces carry its N/ep tokens; each MoE layer adds an all-to-all, dispatch (fp8,
#   1 byte) and combine (bf16, 2 bytes) of every token's hidden state to its k experts, of which
#   (G−1)/G leave the GPU (G = tp·ep, uniform routing): per GPU (N/G)·k·d·3·(G−1)/G bytes over the
#   one-way link (NVLink within a domain, the scale-out link beyond), plus 2 × a2a_latency_us.
# - Speculative decoding (sim/spec_decode.py): a decode item verifies 1 + d tokens (the last sampled
#   token and d ≤ k drafts) in one target pass, attended in decode form; the k draft tokens are made
#   before it by k sequential passes of a draft of ``draft_layers`` layers over the decode items,
#   each costing draft_layers/L of a one-token decode step of those items (draft_time_s).

T_FIXED_PER_LAYER_US = 32.0
T_FIXED_BASE_US = 126.0
ACTIVATION_BYTES = 2  # bf16 activations in the TP all-reduces


@dataclass(frozen=True)
class StepCost:
    """One step's cost breakdown; FLOPs and bytes are totals over the TP group, times in seconds."""

    n_tokens: int
    n_seqs: int
    flops: float
    weight_bytes: float
    kv_bytes: float
    compute_s: float
    memory_s: float
    allreduce_s: float
    overhead_s: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def total_s(self) -> float:
        return self.overhead_s + max(self.compute_s, self.memory_s) + self.allreduce_s


def t_fixed_s(config: EngineConfig) -> float:
    """Per-step fixed overhead: 32 µs per layer + 126 µs."""
    return (T_FIXED_PER_LAYER_US * config.model.n_layers + T_FIXED_BASE_US) * 1e-6


def expert_fraction_touched(model: ModelSpec, n_tokens: int) -> float:
    """Expected fraction of a layer's routed experts that ``n_tokens`` tokens touch: 1 − (1 − k/E)^N."""
    if not model.is_moe or n_tokens <= 0:
        return 0.0
    return 1.0 - (1.0 - model.experts_per_token / model.n_experts) ** n_tokens


def weight_bytes_touched(model: ModelSpec, n_tokens: int) -> float:
    """Weight bytes a step of ``n_tokens`` tokens reads: all of a dense model; dense part + touched experts."""
    if not model.is_moe:
        return model.weight_bytes
    return model.dense_weight_bytes + model.expert_weight_bytes * expert_fraction_touched(model, n_tokens)


def allreduce_time_s(config: EngineConfig, n_tokens: int) -> float:
    """The TP all-reduces of one step: 2 per layer of (N/ep)·d_model·2 bytes over a ring; 0 when tp == 1."""
    tp = config.tp
    if tp == 1 or n_tokens <= 0:
        return 0.0
    msg = n_tokens / config.ep * config.model.d_model * ACTIVATION_BYTES
    one = config.allreduce_latency_us * 1e-6 + 2.0 * (tp - 1) / tp * msg / (config.eta_link * config.link_bw)
    return 2 * config.model.n_layers * one


A2A_BYTES_PER_ELEM = 3  # dispatch in fp8 (1 byte) + combine in bf16 (2 bytes), as DeepEP sends them


def alltoall_time_s(config: EngineConfig, n_tokens: int) -> float:
    """The expert-parallel all-to-all of one step (every MoE layer: dispatch + combine); 0 when ep == 1."""
    m = config.model
    g = config.gpus
    if config.ep == 1 or not m.is_moe or n_tokens <= 0:
        return 0.0
    per_gpu = n_tokens / g * m.experts_per_token * m.d_model * A2A_BYTES_PER_ELEM * (g - 1) / g
    one = 2 * config.a2a_latency_us * 1e-6 + per_gpu / (config.eta_link * config.a2a_link_bw)
    return m.n_layers * one


def step_cost(config: EngineConfig, items: Sequence[tuple[int, int]]) -> StepCost:
    """The cost breakdown of one step; items = (n_new_tokens, n_cached_tokens) per request."""
    m = config.model
    n_total = 0
    attn_prefill = 0.0
    attn_decode = 0.0
    ctx = 0
    decode_width = 1 + config.spec.k
    for n, c in items:
        n_total += n
        if n == 1:
            attn_decode += c + 1
        elif n <= decode_width:
            attn_decode += n * (c + (n + 1) / 2)
        else:
            attn_prefill += n * (c + (n + 1) / 2)
        ctx += c + n
    flops = 2.0 * m.active_params_b * 1e9 * n_total + 4.0 * m.n_layers * (
        m.d_attn * attn_prefill + m.d_attn_decode * attn_decode
    )
    w_bytes = weight_bytes_touched(m, n_total) + m.dense_weight_bytes * (config.ep - 1)
    kv_bytes = float(config.kv_bytes_per_token_per_gpu * config.tp * ctx)
    return StepCost(
        n_tokens=n_total,
        n_seqs=len(items),
        flops=flops,
        weight_bytes=w_bytes,
        kv_bytes=kv_bytes,
        compute_s=flops / (config.eta_c * config.peak_flops),
        memory_s=(w_bytes + kv_bytes) / (config.eta_bw * config.peak_bw),
        allreduce_s=allreduce_time_s(config, n_total) + alltoall_time_s(config, n_total),
        overhead_s=t_fixed_s(config) + config.t_req_us * 1e-6 * -(-len(items) // config.ep),
    )


def step_time_s(config: EngineConfig, items: Sequence[tuple[int, int]]) -> float:
    """Engine seconds for one step (before speedup); items = (n_new_tokens, n_cached_tokens) per request.

    FLOPs = 2·P_active·N + 4·L·d_attn·Σ n_i·(c_i + (n_i+1)/2); Bytes = W_bytes + kv_B·Σ(c_i + n_i);
    T = t_fixed + t_req·B + max(FLOPs/(eta_c·F), Bytes/(eta_bw·BW)) (+ TP all-reduces; MoE: touched
    experts only). An empty step costs nothing.
    """
    if not items:
        return 0.0
    return step_cost(config, items).total_s


def draft_time_s(config: EngineConfig, decode_contexts: Sequence[int]) -> float:
    """The draft passes before a speculative step: k passes of ``draft_layers`` layers over the decode
    items (their cached contexts); 0 when speculative decoding is off or no item decodes."""
    spec = config.spec
    if not spec.enabled or not decode_contexts:
        return 0.0
    one = step_time_s(config, [(1, c) for c in decode_contexts])
    return spec.k * one * spec.draft_layers / config.model.n_layers


def decode_step_time_s(config: EngineConfig, batch: int, context: int) -> float:
    """One decode step of ``batch`` requests, each with ``context`` cached tokens."""
    return step_time_s(config, [(1, context)] * batch)


def prefill_time_s(config: EngineConfig, prompt_tokens: int) -> float:
    """Time from admission to first token for one request alone (chunked by the token budget)."""
    total = 0.0
    done = 0
    while True:
        chunk = min(prompt_tokens - done, config.max_num_batched_tokens)
        total += step_time_s(config, [(max(chunk, 0), done)])
        done += chunk
        if done >= prompt_tokens:
            return total
