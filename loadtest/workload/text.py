"""Synthetic text with an exact token count: shared by prompt synthesis and the engine's output."""

from __future__ import annotations

import hashlib
import random

from loadtest.tokens.tokenizer import Tokenizer, get_tokenizer

# Common English words; each " word" is a single token in the bundled tokenizers, and a run of them
# tokenizes to exactly one token per word (checked by tests for every bundled family).
WORDS: tuple[str, ...] = tuple(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "you",
        "that",
        "it",
        "he",
        "was",
        "for",
        "on",
        "are",
        "as",
        "with",
        "his",
        "they",
        "at",
        "be",
        "this",
        "have",
        "from",
        "or",
        "one",
        "had",
        "by",
        "word",
        "but",
        "not",
        "what",
        "all",
        "were",
        "we",
        "when",
        "your",
        "can",
        "said",
        "there",
        "use",
        "an",
        "each",
        "which",
        "she",
        "do",
        "how",
        "their",
        "if",
        "will",
        "up",
        "other",
        "about",
        "out",
        "many",
        "then",
        "them",
        "these",
        "so",
        "some",
        "her",
        "would",
        "make",
        "like",
        "him",
        "into",
        "time",
        "has",
        "look",
        "two",
        "more",
        "write",
        "go",
        "see",
        "number",
        "no",
        "way",
        "could",
        "people",
        "my",
        "than",
        "first",
        "water",
        "been",
        "call",
        "who",
        "oil",
        "its",
        "now",
        "find",
        "long",
        "down",
        "day",
        "did",
        "get",
        "come",
        "made",
        "may",
        "part",
    ]
)
TOKEN_PIECES: tuple[str, ...] = tuple(" " + w for w in WORDS)


def synth_text(n_tokens: int, rng: random.Random, tokenizer: Tokenizer | None = None) -> str:
    """Text of exactly ``n_tokens`` tokens (checked against ``tokenizer`` when given)."""
    if n_tokens <= 0:
        return ""
    text = "".join(rng.choices(TOKEN_PIECES, k=n_tokens))
    if tokenizer is not None:
        got = tokenizer.count(text)
        # Single-token words never merge, so this holds; fall back to trimming if a tokenizer disagrees.
        while got > n_tokens:
            text = text[: text.rfind(" ")]
            got = tokenizer.count(text)
        while got < n_tokens:
            text += rng.choice(TOKEN_PIECES)
            got = tokenizer.count(text)
    return text


def keyed_text(n_tokens: int, key: bytes, tokenizer: Tokenizer | None = None) -> str:
    """Text of exactly ``n_tokens`` tokens whose words follow from ``key`` alone: one SHAKE-128 draw of
    two bytes a word, no generator to seed (a Mersenne Twister seeded per request cost more than the
    rest of a short request's build)."""
    if n_tokens <= 0:
        return ""
    pieces, m = TOKEN_PIECES, len(TOKEN_PIECES)
    draw = memoryview(hashlib.shake_128(key).digest(2 * n_tokens + 2)).cast("H")
    text = "".join([pieces[v % m] for v in draw[:n_tokens]])
    if tokenizer is not None:
        got = tokenizer.count(text)
        # Single-token words never merge, so this holds; fall back to trimming if a tokenizer disagrees.
        while got > n_tokens:
            text = text[: text.rfind(" ")]
            got = tokenizer.count(text)
        extra = draw[n_tokens]
        while got < n_tokens:
            text += pieces[extra % m]
            extra += 1
            got = tokenizer.count(text)
    return text


def token_piece(i: int) -> str:
    """The i-th output token's text, cycling deterministically through the word pool."""
    return TOKEN_PIECES[i % len(TOKEN_PIECES)]


def default_tokenizer() -> Tokenizer:
    return get_tokenizer()
