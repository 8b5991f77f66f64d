"""Token ids ↔ text for the server: end tokens, the word-only output vocabulary, incremental decoding."""

from __future__ import annotations

import re
from collections.abc import Sequence

from loadtest.tokens.tokenizer import Tokenizer

_WORD = re.compile(r"^ [a-z]{2,12}$")
_END_NAMES = ("<|eot_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>", "</s>", "<|end|>", "<|return|>")


def vocab_size(tok: Tokenizer) -> int:
    hf = getattr(tok, "_hf", None)
    if hf is not None:
        return int(hf.get_vocab_size(with_added_tokens=True))
    return int(tok._enc.n_vocab)


def token_id(tok: Tokenizer, text: str) -> int | None:
    """The id of a single (special) token, or None when the tokenizer has no such token."""
    hf = getattr(tok, "_hf", None)
    if hf is not None:
        i = hf.token_to_id(text)
        return int(i) if i is not None else None
    try:
        return int(tok._enc.encode_single_token(text))
    except (KeyError, ValueError):
        return None


def end_token_ids(tok: Tokenizer, configured: Sequence[int] = ()) -> set[int]:
    """End-of-sequence ids: the model config's, else the tokenizer's eos token and the usual end markers."""
    if configured:
        return set(configured)
    names = [*_END_NAMES]
    eos = getattr(tok, "_special", {}).get("eos_token")
    if eos:
        names.insert(0, eos)
    return {i for i in (token_id(tok, n) for n in names) if i is not None}


def word_vocabulary(tok: Tokenizer, model_vocab: int) -> list[int]:
    """Ids of single-word tokens (a space and 2-12 lowercase letters) that re-encode to themselves.

    A random-weight model samples only from these: any sequence of them decodes to text whose token
    count equals the number of tokens generated, so the client's count agrees with the server's usage.
    """
    out = []
    for i in range(min(vocab_size(tok), model_vocab)):
        try:
            piece = tok.decode([i])
        except Exception:  # ids without a piece (reserved, unused)
            continue
        if _WORD.match(piece) and tok.encode(piece) == [i]:
            out.append(i)
    return out


class IncrementalDecoder:
    """Text deltas of a growing id sequence, never splitting a multi-byte character (vLLM's method)."""

    def __init__(self, tok: Tokenizer, prompt_tail: Sequence[int] = ()) -> None:
        self.tok = tok
        self.ids: list[int] = list(prompt_tail)
        self.prefix = 0
        self.read = len(self.ids)

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        prefix_text = self.tok.decode(self.ids[self.prefix : self.read])
        new_text = self.tok.decode(self.ids[self.prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""
