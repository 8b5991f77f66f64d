"""Shared prompt prefixes: per-group texts and Mooncake-style hash-id blocks that a prefix cache can reuse."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

from loadtest.tokens.tokenizer import Tokenizer
from loadtest.workload.text import synth_text


class PrefixBank:
    """Deterministic prefix texts from a seed; synth_text pieces are single tokens, so token counts add."""

    def __init__(
        self,
        seed: int,
        tokenizer: Tokenizer,
        block_tokens: int = 512,
        max_cached: int = 4096,
        nonce: int | None = None,
    ) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be ≥ 1")
        self.seed = seed
        # Hash-id blocks are keyed by the run nonce too: equal within a run, new in every run.
        self._key = str(seed) if nonce is None else f"{seed}:{nonce:x}"
        self.tokenizer = tokenizer
        self.block_tokens = block_tokens
        self.max_cached = max_cached
        self._blocks: OrderedDict[int, str] = OrderedDict()

    def group_text(self, group: int, n_tokens: int) -> str:
        """The prefix of ``group``: exactly ``n_tokens`` tokens; a shorter one is a prefix of a longer one."""
        return synth_text(n_tokens, random.Random(f"{self.seed}:prefix-group:{group}"), self.tokenizer)

    def block(self, hash_id: int) -> str:
        """The ``block_tokens``-token text of one hash id (cached, least recently used dropped first)."""
        text = self._blocks.get(hash_id)
        if text is None:
            text = synth_text(self.block_tokens, random.Random(f"{self._key}:block:{hash_id}"))
            self._blocks[hash_id] = text
            if len(self._blocks) > self.max_cached:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(hash_id)
        return text

    def blocks_text(self, hash_ids: Sequence[int], total_tokens: int) -> str:
        """The blocks of ``hash_ids`` in order, cut to exactly ``total_tokens`` tokens.

        Equal hash-id prefixes give byte-identical text prefixes. Tokens beyond the blocks (a trace
        whose ids cover less than its length) are filled with text keyed by the last hash id.
        """
        parts: list[str] = []
        left = total_tokens
        for h in hash_ids:
            if left <= 0:
                break
            text = self.block(h)
            parts.append(text if left >= self.block_tokens else _first_pieces(text, left))
            left -= self.block_tokens
        if left > 0:
            last = hash_ids[-1] if hash_ids else "none"
            key = f"{self._key}:tail:{len(hash_ids)}:{last}"
            parts.append(synth_text(left, random.Random(key)))
        return "".join(parts)


def _first_pieces(text: str, n: int) -> str:
    """The first ``n`` space-led pieces of synth_text output (its first ``n`` tokens)."""
    cut = -1
    for _ in range(n + 1):
        cut = text.find(" ", cut + 1)
        if cut < 0:
            return text
    return text[:cut]
