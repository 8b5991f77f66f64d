"""Offline tokenizers and chat-template token counting shared by the workload, client and engine."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import quicktok

# Tokenizer families bundled by quicktok (no download, works offline).
TOKENIZER_ALIASES: dict[str, str] = {
    "llama3": "llama3",
    "llama-3": "llama3",
    "cl100k": "cl100k_base",
    "cl100k_base": "cl100k_base",
    "o200k": "o200k_base",
    "o200k_base": "o200k_base",
    "o200k_harmony": "o200k_harmony",
    "qwen3": "qwen3",
}
DEFAULT_TOKENIZER = "llama3"


class Tokenizer:
    """A named offline BPE tokenizer with a chat-template token counter."""

    def __init__(self, name: str = DEFAULT_TOKENIZER) -> None:
        key = TOKENIZER_ALIASES.get(name.lower())
        if key is None:
            raise ValueError(f"unknown tokenizer {name!r}; choose one of {sorted(set(TOKENIZER_ALIASES))}")
        self.name = key
        self._enc = quicktok.get_encoding(key)

    def count(self, text: str) -> int:
        """Tokens in plain text (no special tokens)."""
        return self._enc.count(text) if text else 0

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode_ordinary(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt string a Llama-3-style chat template produces, ending with the assistant header."""
        parts = ["<|begin_of_text|>"]
        for m in messages:
            content = _text_of(m.get("content"))
            parts.append(
                f"<|start_header_id|>{m.get('role', 'user')}<|end_header_id|>\n\n{content}<|eot_id|>"
            )
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
        return "".join(parts)

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Token ids of the templated chat prompt (Llama-3 template; others: contents joined by newlines)."""
        if self.name != "llama3":
            return self.encode("\n".join(_text_of(m.get("content")) for m in messages))
        enc = self._enc
        special = enc.encode_single_token
        begin, start, end, eot = (
            special(t) for t in ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
        )
        ids = [begin]
        for m in messages:
            ids.append(start)
            ids += enc.encode_ordinary(str(m.get("role", "user")))
            ids.append(end)
            ids += enc.encode_ordinary("\n\n" + _text_of(m.get("content")))
            ids.append(eot)
        ids += [start, *enc.encode_ordinary("assistant"), end, *enc.encode_ordinary("\n\n")]
        return ids

    def count_chat(self, messages: Sequence[dict[str, Any]]) -> int:
        """Prompt tokens of a chat request: the templated prompt, special tokens included.

        Special tokens split the prompt into ordinary segments that tokenize independently, so the
        count is the specials plus each segment's count (equal to encoding ``render_chat``; tested).
        """
        if self.name == "llama3":
            n = 1 + 2 + self.count("assistant") + self.count("\n\n")  # begin, final header
            for m in messages:
                n += (
                    3
                    + self.count(str(m.get("role", "user")))
                    + self.count("\n\n" + _text_of(m.get("content")))
                )
            return n
        # Other families: content tokens plus a fixed per-message overhead (OpenAI's cookbook rule).
        return 3 + sum(4 + self.count(_text_of(m.get("content"))) for m in messages)


def _text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a content-part list."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


@lru_cache(maxsize=8)
def get_tokenizer(name: str = DEFAULT_TOKENIZER) -> Tokenizer:
    """A shared tokenizer instance per name."""
    return Tokenizer(name)
