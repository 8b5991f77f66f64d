"""Per-query salt: a 64-bit random value as a fixed number of single-token words (defeats prefix caching)."""

from __future__ import annotations

import random

from loadtest.workload.text import TOKEN_PIECES

SALT_BITS = 64


def _digits_needed(bits: int, base: int) -> int:
    """Base-``base`` digits that hold any ``bits``-bit value."""
    n, cap = 0, 1
    while cap < 1 << bits:
        cap *= base
        n += 1
    return n


SALT_TOKENS = _digits_needed(SALT_BITS, len(TOKEN_PIECES))


def salt_value(seed: int, index: int) -> int:
    """The 64-bit salt of query ``index`` (the same for the same seed and index)."""
    return random.Random(f"{seed}:salt:{index}").getrandbits(SALT_BITS)


def salt_text(seed: int, index: int) -> str:
    """The salt as ``SALT_TOKENS`` single-token words (leading space each): distinct values, distinct text."""
    v = salt_value(seed, index)
    base = len(TOKEN_PIECES)
    pieces = []
    for _ in range(SALT_TOKENS):
        v, d = divmod(v, base)
        pieces.append(TOKEN_PIECES[d])
    return "".join(pieces)
