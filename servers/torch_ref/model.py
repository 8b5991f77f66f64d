"""A Llama-style decoder in plain PyTorch (RMSNorm, RoPE, GQA attention, SwiGLU) over a flat token batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from servers.torch_ref.config import ModelConfig
from servers.torch_ref.kv_cache import SlotKVCache


@dataclass
class Layer:
    """One decoder layer's weights (q, k, v fused; gate and up fused), as [out, in] matrices."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass
class Weights:
    embed: torch.Tensor  # [vocab, d]
    layers: list[Layer]
    norm: torch.Tensor
    lm_head: torch.Tensor  # [vocab, d] (the embedding itself when tied)


@dataclass
class StepInput:
    """One engine step, flattened: every scheduled token with its sequence's slot and position.

    ``items`` are (slot, start, n) per scheduled sequence, in token order; the tokens of item j are
    positions start..start+n-1 of the sequence in ``slot``. ``sample_rows`` are the token rows whose
    logits are wanted (the last token of each item that reaches the end of its known tokens).
    """

    token_ids: list[int]
    items: list[tuple[int, int, int]]
    sample_rows: list[int]


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies, with Llama-3's long-context scaling when the config asks for it."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type") or rs.get("type")
    if kind == "llama3":
        factor = float(rs.get("factor", 8.0))
        low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
        old = float(rs.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        mid = (wavelen <= old / low) & (wavelen >= old / high)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif kind == "linear":
        inv = inv / float(rs.get("factor", 1.0))
    return inv.float()


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF-style (rotate-half) RoPE on [N, heads, head_dim] with cos/sin [N, 1, head_dim]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


class LlamaModel:
    """Forward passes over one step's flattened tokens, reading and writing a per-slot KV cache."""

    def __init__(self, cfg: ModelConfig, weights: Weights, cache: SlotKVCache) -> None:
        self.cfg = cfg
        self.w = weights
        self.cache = cache
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        inv = rope_inv_freq(cfg).to(self.device)
        pos = torch.arange(cache.max_len, device=self.device, dtype=torch.float32)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()  # [max_len, head_dim], float32
        self.q_size = cfg.num_attention_heads * cfg.head_dim
        self.kv_size = cfg.num_key_value_heads * cfg.head_dim

    def _tensor(self, values: list[int]) -> torch.Tensor:
        t = torch.tensor(values, dtype=torch.long)
        return t.to(self.device, non_blocking=True) if self.device.type != "cpu" else t

    @torch.inference_mode()
    def forward(self, step: StepInput) -> torch.Tensor:
        """Run the step; returns float32 logits [len(sample_rows), vocab]."""
        cfg = self.cfg
        slots_l: list[int] = []
        pos_l: list[int] = []
        decode: list[tuple[int, int, int]] = []  # (row, slot, length after this token)
        prefill: list[tuple[int, int, int, int]] = []  # (row0, slot, start, n)
        row = 0
        for slot, start, n in step.items:
            slots_l += [slot] * n
            pos_l += range(start, start + n)
            if n == 1:
                decode.append((row, slot, start + 1))
            else:
                prefill.append((row, slot, start, n))
            row += n
        ids = self._tensor(step.token_ids)
        slots = self._tensor(slots_l)
        positions = self._tensor(pos_l)
        cos = self.cos.index_select(0, positions).unsqueeze(1)
        sin = self.sin.index_select(0, positions).unsqueeze(1)
        dec = self._decode_plan(decode) if decode else None
        pre = [self._prefill_mask(start, n) for _, _, start, n in prefill]
        x = self.w.embed.index_select(0, ids)
        n_tok = x.shape[0]
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        for li, layer in enumerate(self.w.layers):
            h = _rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
            qkv = h @ layer.qkv.t()
            q = qkv[:, : self.q_size].view(n_tok, H, D)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(n_tok, Hkv, D)
            v = qkv[:, self.q_size + self.kv_size :].view(n_tok, Hkv, D)
            q = _rotate(q, cos, sin)
            k = _rotate(k, cos, sin)
            kc, vc = self.cache.k[li], self.cache.v[li]
            kc[slots, positions] = k
            vc[slots, positions] = v
            attn = torch.empty(n_tok, H * D, device=self.device, dtype=self.dtype)
            if dec is not None:
                attn[dec[0]] = self._decode_attention(q, kc, vc, dec)
            for (r0, slot, start, n), mask in zip(prefill, pre, strict=True):
                attn[r0 : r0 + n] = self._prefill_attention(q[r0 : r0 + n], kc, vc, slot, start + n, mask)
            x = x + attn @ layer.o.t()
            h = _rms_norm(x, layer.post_norm, cfg.rms_norm_eps)
            gu = h @ layer.gate_up.t()
            ff = gu.shape[-1] // 2
            x = x + (F.silu(gu[:, :ff]) * gu[:, ff:]) @ layer.down.t()
        rows = self._tensor(step.sample_rows)
        hs = _rms_norm(x.index_select(0, rows), self.w.norm, cfg.rms_norm_eps)
        return (hs @ self.w.lm_head.t()).float()

    def _decode_plan(self, decode: list[tuple[int, int, int]]) -> tuple[torch.Tensor, ...]:
        """Rows, the slot range [lo, hi] they span, each slot's query index and the length mask."""
        rows = [r for r, _, _ in decode]
        slot_list = [s for _, s, _ in decode]
        lo, hi = min(slot_list), max(slot_list)
        t_max = max(n for _, _, n in decode)
        lengths = [1] * (hi - lo + 1)  # slots in the range that do not decode see one position
        for _, s, n in decode:
            lengths[s - lo] = n
        lens = self._tensor(lengths)
        mask = torch.arange(t_max, device=self.device)[None, :] < lens[:, None]
        return (
            self._tensor(rows),
            self._tensor([s - lo for s in slot_list]),
            torch.tensor([lo, hi + 1, t_max]),
            mask[:, None, None, :],
        )

    def _decode_attention(
        self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, dec: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """One query per sequence; the slots' caches are read in place (a view of the slot range)."""
        cfg = self.cfg
        rows, rel, bounds, mask = dec
        lo, hi, t_max = (int(b) for b in bounds)
        Hkv, G, D = cfg.num_key_value_heads, cfg.group_size, cfg.head_dim
        qd = q.index_select(0, rows).view(-1, Hkv, G, D)
        if rel.shape[0] != hi - lo:
            full = torch.zeros(hi - lo, Hkv, G, D, device=self.device, dtype=self.dtype)
            full[rel] = qd
            qd = full
        k = kc[lo:hi, :t_max].transpose(1, 2)  # [S, Hkv, T, D], no copy
        v = vc[lo:hi, :t_max].transpose(1, 2)
        out = F.scaled_dot_product_attention(qd, k, v, attn_mask=mask)  # [S, Hkv, G, D]
        if out.shape[0] != rel.shape[0]:
            out = out.index_select(0, rel)
        return out.reshape(-1, cfg.num_attention_heads * D)

    def _prefill_mask(self, start: int, n: int) -> torch.Tensor:
        """Causal mask of a chunk at positions start..start+n-1 over start+n keys, repeated per group."""
        i = torch.arange(n, device=self.device)[:, None]
        t = torch.arange(start + n, device=self.device)[None, :]
        return (t <= i + start).repeat(self.cfg.group_size, 1)

    def _prefill_attention(
        self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slot: int, total: int, mask: torch.Tensor
    ) -> torch.Tensor:
        """A chunk of one sequence; GQA as G·n queries per KV head, so the cache is never expanded."""
        cfg = self.cfg
        n = q.shape[0]
        Hkv, G, D = cfg.num_key_value_heads, cfg.group_size, cfg.head_dim
        qg = q.view(n, Hkv, G, D).permute(1, 2, 0, 3).reshape(1, Hkv, G * n, D)
        k = kc[slot : slot + 1, :total].transpose(1, 2)
        v = vc[slot : slot + 1, :total].transpose(1, 2)
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
        return out.view(Hkv, G, n, D).permute(2, 0, 1, 3).reshape(n, cfg.num_attention_heads * D)
