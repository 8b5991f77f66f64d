"""Offline tokenizers and chat-template token counting shared by the workload, client and engine."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import quicktok
from jinja2.sandbox import ImmutableSandboxedEnvironment

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
    """An offline tokenizer with a chat-template token counter.

    ``name`` is a bundled encoding (``llama3``, ``cl100k``, ``o200k``, ``o200k_harmony``, ``qwen3``)
    or the path of a Hugging Face ``tokenizer.json`` or of a folder holding one (its
    ``tokenizer_config.json`` chat template, when present, is used for chat prompts).
    """

    def __init__(self, name: str = DEFAULT_TOKENIZER) -> None:
        key = TOKENIZER_ALIASES.get(name.lower())
        self._hf: Any = None
        self._template: Any = None
        self._special: dict[str, str] = {}
        if key is not None:
            self.name = key
            self._enc = quicktok.get_encoding(key)
            return
        path = Path(name).expanduser()
        if not path.exists():
            raise ValueError(
                f"unknown tokenizer {name!r}: use one of {sorted(set(TOKENIZER_ALIASES))} "
                "or the path of a tokenizer.json (or a folder holding one)"
            )
        self.name = str(path)
        self._load_hf(path)

    def _load_hf(self, path: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        folder = path if path.is_dir() else path.parent
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"{path}: no tokenizer.json there")
        try:
            self._hf = HfTokenizer.from_file(str(file))
        except Exception as e:  # the library raises its own exception types
            raise ValueError(f"{file}: not a Hugging Face tokenizer.json ({e})") from e
        config = folder / "tokenizer_config.json"
        if config.is_file():
            cfg = json.loads(config.read_text())
            template = cfg.get("chat_template")
            if isinstance(template, list):  # named templates: take the default one
                template = next((t.get("template") for t in template if t.get("name") == "default"), None)
            if isinstance(template, str):
                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                self._template = env.from_string(template)
            for key in ("bos_token", "eos_token"):
                tok = cfg.get(key)
                self._special[key] = tok.get("content", "") if isinstance(tok, dict) else (tok or "")

    def count(self, text: str) -> int:
        """Tokens in plain text (no special tokens)."""
        if not text:
            return 0
        if self._hf is not None:
            return len(self._hf.encode(text, add_special_tokens=False).ids)
        return self._enc.count(text)

    def encode(self, text: str) -> list[int]:
        if self._hf is not None:
            return list(self._hf.encode(text, add_special_tokens=False).ids)
        return list(self._enc.encode_ordinary(text))

    def decode(self, ids: Sequence[int]) -> str:
        if self._hf is not None:
            return self._hf.decode(list(ids), skip_special_tokens=False)
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
        """Token ids of the templated chat prompt: the tokenizer's own template (HF), the Llama-3 template,
        harmony for ``o200k_harmony`` (gpt-oss), or for other families a ChatML layout
        (``<|im_start|>role\\ncontent<|im_end|>``, special tokens where the encoding has them)."""
        if self._template is not None:
            return list(self._hf.encode(self._render_hf(messages), add_special_tokens=False).ids)
        if self.name != "llama3":
            text = _harmony(messages) if self.name == "o200k_harmony" else _chatml(messages)
            if self._hf is not None:
                return list(self._hf.encode(text, add_special_tokens=False).ids)
            return list(self._enc.encode(text, allowed_special="all"))
        enc = self._enc
        special = enc.encode_single_token
        begin, start, end, eot = (
            special(t)
            for t in ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
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

    def encode_request(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Prompt ids of a chat request, tools included: the templated messages, then the JSON of the
        tool definitions and of each assistant tool call (how templates render them, as JSON text).
        The workload counts prompts and the embedded engine prefills them with this same function."""
        ids = self.encode_chat(messages)
        for extra in _tool_texts(messages, tools):
            ids += self.encode(extra)
        return ids

    def count_request(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> int:
        """``len(encode_request(...))`` without building the ids."""
        return self.count_chat(messages) + sum(self.count(t) for t in _tool_texts(messages, tools))

    def count_chat(self, messages: Sequence[dict[str, Any]]) -> int:
        """Prompt tokens of a chat request: the templated prompt, special tokens included.

        Special tokens split the prompt into ordinary segments that tokenize independently, so the
        count is the specials plus each segment's count (equal to encoding ``render_chat``; tested).
        """
        if self._template is not None:
            return len(self._hf.encode(self._render_hf(messages), add_special_tokens=False).ids)
        if self.name == "llama3":
            n = 1 + 2 + self.count("assistant") + self.count("\n\n")  # begin, final header
            for m in messages:
                n += (
                    3
                    + self.count(str(m.get("role", "user")))
                    + self.count("\n\n" + _text_of(m.get("content")))
                )
            return n
        return len(self.encode_chat(messages))

    def _render_hf(self, messages: Sequence[dict[str, Any]]) -> str:
        return self._template.render(messages=list(messages), add_generation_prompt=True, **self._special)


def _chatml(messages: Sequence[dict[str, Any]]) -> str:
    """The ChatML layout used for families without a template of their own here."""
    parts = [
        f"<|im_start|>{m.get('role', 'user')}\n{_text_of(m.get('content'))}<|im_end|>\n" for m in messages
    ]
    return "".join(parts) + "<|im_start|>assistant\n"


def _harmony(messages: Sequence[dict[str, Any]]) -> str:
    """OpenAI's harmony layout (gpt-oss), whose markers are special tokens of ``o200k_harmony``."""
    parts = [
        f"<|start|>{m.get('role', 'user')}<|message|>{_text_of(m.get('content'))}<|end|>" for m in messages
    ]
    return "".join(parts) + "<|start|>assistant"


def _tool_texts(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[str]:
    """The JSON texts a request's tools and tool calls add to its prompt (``json.dumps``, key order kept)."""
    texts = [json.dumps(list(tools))] if tools else []
    texts += [json.dumps(list(m["tool_calls"])) for m in messages if m.get("tool_calls")]
    return texts


def _text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a content-part list."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


@lru_cache(maxsize=8)
def get_tokenizer(name: str = DEFAULT_TOKENIZER) -> Tokenizer:
    """A shared tokenizer instance per name."""
    return Tokenizer(name)
