"""GPU memory budget of the simulated engine: how many paged KV blocks fit next to the weights."""

from __future__ import annotations

import math
from typing import Any

ACTIVATION_RESERVE_BYTES = 4e9  # per GPU: activations, CUDA graphs, NCCL buffers (docs/sources.md §3)


def block_size(config: Any) -> int:
    """Tokens per KV block (vLLM's default 16)."""
    return int(getattr(config, "block_size", 16))


def kv_bytes_per_token_per_gpu(config: Any) -> float:
    """KV bytes per token on one GPU (the config's own split over TP when it has one, else kv_B/tp)."""
    per_gpu = getattr(config, "kv_bytes_per_token_per_gpu", None)
    if per_gpu is not None:
        return per_gpu
    return config.model.kv_bytes_per_token(config.kv_bytes_per_elem) / config.tp


def kv_capacity_blocks(config: Any) -> int:
    """KV blocks the engine gets: floor((util·HBM·tp − weights − 4 GB·tp) / (kv_B·block_size)).

    Computed per GPU (weights and KV heads split over TP), as ``EngineConfig.num_kv_blocks`` does.
    ``config.kv_blocks`` (when set) wins. Raises ValueError when the weights leave no room.
    """
    override = getattr(config, "kv_blocks", None)
    if override is not None:
        if int(override) < 1:
            raise ValueError(f"kv_blocks must be >= 1, got {override}")
        return int(override)
    util = float(getattr(config, "gpu_memory_utilization", 0.9))
    gpu, model, tp = config.gpu, config.model, config.tp
    usable = util * gpu.hbm_gb * 1e9 - ACTIVATION_RESERVE_BYTES  # per GPU, before weights
    ep = int(getattr(config, "ep", 1))
    free = usable - float(getattr(config, "weight_bytes_per_gpu", model.weight_bytes / tp))
    # with expert parallelism each of the ep groups keeps the KV of its own requests
    blocks = ep * int(free // kv_bytes_per_token_per_gpu(config)) // block_size(config) if free > 0 else 0
    if blocks >= 1:
        return blocks
    if usable <= 0:
        raise ValueError(
            f"gpu_memory_utilization {util} leaves no memory on a {gpu.name} "
            f"({gpu.hbm_gb:g} GB) after the {ACTIVATION_RESERVE_BYTES / 1e9:g} GB reserve"
        )
    per_block = model.kv_bytes_per_token(config.kv_bytes_per_elem) * block_size(config)
    need_tp = math.ceil((model.weight_bytes + per_block) / usable)
    pow2 = 1 << (need_tp - 1).bit_length()
    hint = f" (e.g. {pow2})" if pow2 != need_tp else ""
    raise ValueError(
        f"{model.name} needs {model.weight_bytes / 1e9:.0f} GB of weights; {tp}×{gpu.name} has "
        f"{gpu.hbm_gb * tp:g} GB ({util:g} usable, {ACTIVATION_RESERVE_BYTES / 1e9:g} GB/GPU reserved, "
        f"no room left for the KV cache): use --tp ≥ {need_tp}{hint}"
    )
