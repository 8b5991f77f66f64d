"""Salts that defeat prefix caching: the per-query salt and the per-run nonce mixed into every prompt.

A salt is a 64-bit value written as ``SALT_TOKENS`` single-token words. The per-query salt of
query ``index`` follows from the seed (MLPerf's rule); the run nonce (``run_salt: per_run``, the
default) is a fresh random value per run, mixed into every query's salt, so that no run's prompts
repeat an earlier run's past the profile's intentionally shared prefixes (docs/profiles.md).
"""

from __future__ import annotations

import random
import secrets
from hashlib import blake2b

from loadtest.workload.text import TOKEN_PIECES

SALT_BITS = 64
# The nonce the workload fingerprint is computed with: the fingerprint must not depend on the nonce.
FINGERPRINT_NONCE = 0


def _digits_needed(bits: int, base: int) -> int:
    """Base-``base`` digits that hold any ``bits``-bit value."""
    n, cap = 0, 1
    while cap < 1 << bits:
        cap *= base
        n += 1
    return n


SALT_TOKENS = _digits_needed(SALT_BITS, len(TOKEN_PIECES))
_rng = random.Random()  # salt_value's generator
# salt_value's hash with its parameters set, copied per query, and the last seed and nonce with the key's
# text before and after the index (a nonce's hex made once, not once a query)
_BLAKE2B = blake2b(digest_size=SALT_BITS // 8)
_key_ends: tuple[int, int, str, str] | None = None


def new_run_nonce() -> int:
    """A fresh random 64-bit run nonce (one per run, shared by every worker of that run)."""
    return secrets.randbits(SALT_BITS)


def resolve_nonce(mode: str, nonce: int | None, seed: int) -> int | None:
    """The nonce a run's prompts carry: ``nonce`` (per_run), one derived from the seed (per_seed), or none."""
    if mode == "off":
        return None
    if mode == "per_seed":
        return random.Random(f"{seed}:run-salt").getrandbits(SALT_BITS)
    return new_run_nonce() if nonce is None else nonce


def describe_run_salt(mode: str, nonce: int | None, seed: int) -> dict[str, str | None]:
    """run.json's ``config.run_salt``: the mode and the nonce the prompts carried, in hex (null when off)."""
    value = resolve_nonce(mode, nonce, seed) if nonce is not None or mode != "per_run" else None
    return {"mode": mode, "nonce": None if value is None else f"{value:016x}"}


def salt_value(seed: int, index: int | str, nonce: int | None = None) -> int:
    """The 64-bit salt of query ``index``: the same for the same seed, index and run nonce.

    Without a nonce (``run_salt: off``) it is MLPerf's per-query salt as loadtest has always drawn it, a
    Mersenne Twister seeded by the seed and the index; with one, a BLAKE2b hash of the three (seeding a
    generator per query cost about 8 µs of a short request's CPU in a run, docs/profiles.md)."""
    if nonce is None:
        _rng.seed(f"{seed}:salt:{index}")  # reseeded, not made anew: one allocation less per query
        return _rng.getrandbits(SALT_BITS)
    global _key_ends
    ends = _key_ends
    if ends is None or ends[0] != seed or ends[1] != nonce:
        ends = _key_ends = (seed, nonce, f"{seed}:salt:", f":{nonce:x}")
    h = _BLAKE2B.copy()
    h.update((ends[2] + str(index) + ends[3]).encode())  # the key f"{seed}:salt:{index}:{nonce:x}"
    return int.from_bytes(h.digest(), "little")


_BASE = len(TOKEN_PIECES)


def salt_text(seed: int, index: int | str, nonce: int | None = None) -> str:
    """Query ``index``'s salt as text (salt_words of salt_value)."""
    return salt_words(salt_value(seed, index, nonce))


def salt_words(v: int) -> str:
    """A salt value as ``SALT_TOKENS`` single-token words (leading space each), its
    base-``len(TOKEN_PIECES)`` digits low first: distinct values, distinct text.

    One digit at a time from the pool itself: a table of every digit pair (ten thousand strings) took
    half the divisions but was out of the cache by the next request, 2 µs of a short request's CPU in a
    run (tests/bench/README.md, the eighth pass)."""
    pieces, base = TOKEN_PIECES, _BASE
    # The first division in 32-bit halves: every number after it is below 2**58, a machine integer.
    q_hi, r = divmod(v >> 32, base)
    q_lo, d = divmod((r << 32) | (v & 0xFFFFFFFF), base)
    rest = (q_hi << 32) | q_lo
    words = [pieces[d]]
    for _ in range(SALT_TOKENS - 1):
        words.append(pieces[rest % base])
        rest //= base
    return "".join(words)
