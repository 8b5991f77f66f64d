"""Speculative decoding / multi-token prediction: draft length, acceptance draws and the draft's cost."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class SpecDecode:
    """Draft ``k`` tokens per decode step (vLLM's ``num_speculative_tokens``); each is accepted with
    probability ``acceptance`` while every earlier one was (the standard geometric model, docs/sources.md
    §25); one draft token costs ``draft_layers`` of the target's layers (an MTP module is one layer)."""

    k: int = 0
    acceptance: float = 0.0
    draft_layers: float = 1.0

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError("num_speculative_tokens must be >= 0")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError("spec acceptance must be within [0, 1]")
        if self.draft_layers < 0:
            raise ValueError("spec draft layers must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.k > 0

    def expected_tokens_per_step(self) -> float:
        """Tokens one decode step emits on average: (1 − a^(k+1)) / (1 − a); k + 1 at a = 1."""
        a, k = self.acceptance, self.k
        if a >= 1.0:
            return float(k + 1)
        return (1.0 - a ** (k + 1)) / (1.0 - a)

    def expected_acceptance_rate(self) -> float:
        """vLLM's acceptance rate (accepted ÷ draft tokens) of full-length drafts: Σ_{i=1..k} a^i / k."""
        if not self.k:
            return 0.0
        return sum(self.acceptance**i for i in range(1, self.k + 1)) / self.k

    def draw_accepted(self, rng: random.Random, n_draft: int) -> int:
        """Draft tokens accepted out of ``n_draft``: the leading run of independent acceptances."""
        a = self.acceptance
        n = 0
        while n < n_draft and rng.random() < a:
            n += 1
        return n


def parse_spec_decode(text: str) -> SpecDecode:
    """``K:A`` (draft tokens, acceptance rate), e.g. ``3:0.7``; ValueError naming the fix otherwise."""
    k_text, sep, a_text = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return SpecDecode(k=int(k_text), acceptance=float(a_text))
    except ValueError as e:
        detail = f" ({e})" if str(e) else ""
        raise ValueError(
            f"spec decode {text!r}{detail}: write K:A, draft tokens K >= 0 and acceptance A in [0, 1], e.g. 3:0.7"
        ) from e
