"""The per-step roofline time model of the simulated engine (REFERENCE.md §3)."""

from __future__ import annotations

from collections.abc import Sequence

from loadtest.sim.presets import EngineConfig


def t_fixed_s(config: EngineConfig) -> float:
    """Per-step fixed overhead: 32 µs per layer + 126 µs."""
    return (32.0 * config.model.n_layers + 126.0) * 1e-6


def step_time_s(config: EngineConfig, items: Sequence[tuple[int, int]]) -> float:
    """Engine seconds for one step (before speedup); items = (n_new_tokens, n_cached_tokens) per request.

    FLOPs = 2·P_active·N + 4·L·d_attn·Σ n_i·(c_i + (n_i+1)/2); Bytes = W_bytes + kv_B·Σ(c_i + n_i);
    T = t_fixed + t_req·B + max(FLOPs/(eta_c·F), Bytes/(eta_bw·BW)). An empty step costs nothing.
    """
    if not items:
        return 0.0
    m = config.model
    n_total = 0
    attn = 0.0
    ctx = 0
    for n, c in items:
        n_total += n
        attn += n * (c + (n + 1) / 2)
        ctx += c + n
    flops = 2.0 * m.active_params_b * 1e9 * n_total + 4.0 * m.n_layers * m.d_attn * attn
    nbytes = m.weight_bytes + m.kv_bytes_per_token(config.kv_bytes_per_elem) * ctx
    compute = flops / (config.eta_c * config.peak_flops)
    memory = nbytes / (config.eta_bw * config.peak_bw)
    return t_fixed_s(config) + config.t_req_us * 1e-6 * len(items) + max(compute, memory)


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
