"""A preallocated KV cache: one fixed-length region per sequence slot, per layer."""

from __future__ import annotations

import torch

from servers.torch_ref.config import ModelConfig


class SlotKVCache:
    """``num_slots`` regions of ``max_len`` positions, K and V as [slots, max_len, kv_heads, head_dim]."""

    def __init__(
        self, cfg: ModelConfig, num_slots: int, max_len: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        shape = (num_slots, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.num_slots = num_slots
        self.max_len = max_len
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.bytes = 2 * cfg.num_hidden_layers * self.k[0].numel() * self.k[0].element_size()


def slots_that_fit(
    cfg: ModelConfig, max_len: int, bytes_per_elem: int, budget_bytes: float, max_slots: int
) -> int:
    """How many slots of ``max_len`` positions a memory budget holds (at most ``max_slots``)."""
    per_slot = cfg.kv_bytes_per_token(bytes_per_elem) * max_len
    return max(0, min(max_slots, int(budget_bytes // per_slot)))
