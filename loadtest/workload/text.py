"""Synthetic text with an exact token count: shared by prompt synthesis and the engine's output."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator

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
_shake_128 = hashlib.shake_128  # keyed_text's, looked up once


def synth_text(n_tokens: int, rng: random.Random, tokenizer: Tokenizer | None = None) -> str:
    """Text of exactly ``n_tokens`` tokens (checked against ``tokenizer`` when given)."""
    if n_tokens <= 0:
        return ""
    text = "".join(rng.choices(TOKEN_PIECES, k=n_tokens))
    return _exact(text, n_tokens, tokenizer, lambda: rng.choice(TOKEN_PIECES))


_POOL_TOKENS: dict[str, bool] = {}  # pool_words_are_tokens by tokenizer name


def pool_words_are_tokens(tokenizer: Tokenizer) -> bool:
    """Whether every word of the pool is one token of ``tokenizer`` and no token spans two of them, so
    that ``n`` pool words are ``n`` tokens without counting: a bundled encoding (its pre-tokenizer
    splits before every word) that counts each word, and all of them joined, one token a word."""
    known = _POOL_TOKENS.get(tokenizer.name)
    if known is None:
        known = _POOL_TOKENS[tokenizer.name] = (
            tokenizer.bundled
            and all(tokenizer.count(w) == 1 for w in TOKEN_PIECES)
            and tokenizer.count("".join(TOKEN_PIECES)) == len(TOKEN_PIECES)
        )
    return known


_CHAT_ADDS: dict[str, bool] = {}  # chat_adds_pool_words by tokenizer name


def chat_adds_pool_words(tokenizer: Tokenizer) -> bool:
    """Whether a chat prompt whose last message is pool words counts the prompt with that message empty
    plus the words' own count (the template's text before a message ends where a word begins, and none
    after it merges with one), so a prompt built of pool words needs no count of its own. Checked once
    per tokenizer, with and without a system message before it, on pool words and a single one."""
    known = _CHAT_ADDS.get(tokenizer.name)
    if known is None:
        system = [{"role": "system", "content": "".join(TOKEN_PIECES[:9])}]
        known = _CHAT_ADDS[tokenizer.name] = all(
            tokenizer.count_chat([*lead, {"role": "user", "content": words}])
            == tokenizer.count_chat([*lead, {"role": "user", "content": ""}]) + tokenizer.count(words)
            for lead in ([], system)
            for words in ("".join(TOKEN_PIECES), TOKEN_PIECES[0], TOKEN_PIECES[-1])
        )
    return known


def keyed_text(n_tokens: int, key: bytes, tokenizer: Tokenizer | None = None) -> str:
    """Text of exactly ``n_tokens`` tokens whose words follow from ``key`` alone: one SHAKE-128 draw of
    two bytes (little-endian) a word, no generator to seed (a Mersenne Twister seeded per request cost
    more than the rest of a short request's build)."""
    if n_tokens <= 0:
        return ""
    pieces, m = TOKEN_PIECES, len(TOKEN_PIECES)
    d = _shake_128(key).digest(2 * n_tokens + 2)  # word i: bytes 2i and 2i + 1, little-endian
    text = "".join([pieces[(d[2 * i] | d[2 * i + 1] << 8) % m] for i in range(n_tokens)])
    if tokenizer is None or pool_words_are_tokens(tokenizer) or tokenizer.count(text) == n_tokens:
        return text
    after = d[2 * n_tokens] | d[2 * n_tokens + 1] << 8
    return _exact(text, n_tokens, tokenizer, _pool_words_from(after).__next__)


def _pool_words_from(start: int) -> Iterator[str]:
    """The pool's words from ``start`` on, cycling, without end (a generator function: the compiled
    build makes a list of a generator expression)."""
    pieces, m = TOKEN_PIECES, len(TOKEN_PIECES)
    k = start
    while True:
        yield pieces[k % m]
        k += 1


def _exact(text: str, n_tokens: int, tokenizer: Tokenizer | None, more: Callable[[], str]) -> str:
    """``text`` cut or grown (by ``more()`` words) to exactly ``n_tokens`` tokens of ``tokenizer``."""
    if tokenizer is None:
        return text
    got = tokenizer.count(text)
    # Single-token words never merge, so this holds; fall back to trimming if a tokenizer disagrees.
    while got > n_tokens:
        text = text[: text.rfind(" ")]
        got = tokenizer.count(text)
    while got < n_tokens:
        text += more()
        got = tokenizer.count(text)
    return text


def token_piece(i: int) -> str:
    """The i-th output token's text, cycling deterministically through the word pool."""
    return TOKEN_PIECES[i % len(TOKEN_PIECES)]


def default_tokenizer() -> Tokenizer:
    return get_tokenizer()
