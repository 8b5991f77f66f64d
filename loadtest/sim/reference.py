"""The engine's reference-answer modes: a prompt found in the reference file is answered with its
reference; a chat whose messages match a recorded call is answered with the recorded assistant message."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _json_rows(p: Path, flag: str) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON) of each non-blank line of ``p``; ValueError names ``flag``, the file and
    the line."""
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{flag} {p}: cannot read ({e})") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{flag} {p}: line {n} is not JSON ({e})") from e


def load_references(path: str | Path) -> dict[str, str]:
    """prompt → answer from a JSONL file of ``{"prompt": ..., "answer": ...}`` lines; ValueError names the line."""
    refs: dict[str, str] = {}
    p = Path(path)
    for n, row in _json_rows(p, "--reference-answers"):
        if not (
            isinstance(row, dict)
            and isinstance(row.get("prompt"), str)
            and isinstance(row.get("answer"), str)
        ):
            raise ValueError(f"--reference-answers {p}: line {n} needs string fields 'prompt' and 'answer'")
        refs[row["prompt"]] = row["answer"]
    return refs


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None


def prompt_of(body: dict[str, Any]) -> str | None:
    """The text a reference is looked up by: the last user message (chat) or the prompt (completions)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "user":
                return _text(m.get("content"))
        return None
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else None


# The MLPerf Endpoints trajectory salt around a system prompt (docs/sources.md §20): not part of the key.
_SALTED = re.compile(r"\A\[salt: [0-9a-f]+\]\n\n(.*)\n\n\[salt: [0-9a-f]+\]\Z", re.DOTALL)
PIECE_CHARS = 4  # characters of recorded text a streamed event carries (about one token)


def chat_key(messages: Any) -> str | None:
    """What a recorded call is looked up by: its messages' roles, texts (a system prompt without its
    salt), a tool message's ``tool_call_id``, an assistant message's tool calls' names and arguments
    (not the calls' ids, nor reasoning, which clients drop or rename); None for a body without a
    message list."""
    if not isinstance(messages, list):
        return None
    canon = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        text = _text(m.get("content"))
        if m.get("role") == "system" and text is not None:
            salted = _SALTED.match(text)
            text = salted.group(1) if salted else text
        calls = [
            [fn.get("name"), fn.get("arguments")]
            for c in m.get("tool_calls") or ()
            if isinstance(c, dict) and isinstance(fn := c.get("function"), dict)
        ]
        canon.append([m.get("role"), text, m.get("tool_call_id"), calls])
    return hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RecordedAnswer:
    """A recorded assistant message, and its stream: one delta a token (reasoning, text, each tool call's
    opening then its arguments, ``piece`` characters a delta)."""

    message: dict[str, Any]
    deltas: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, message: dict[str, Any], piece: int = PIECE_CHARS) -> RecordedAnswer:
        deltas: list[dict[str, Any]] = []
        for field in ("reasoning_content", "content"):
            text = message.get(field)
            if isinstance(text, str):
                deltas += [{field: text[i : i + piece]} for i in range(0, len(text), piece)]
        for i, c in enumerate(message.get("tool_calls") or ()):
            fn = c["function"]
            head = {
                "index": i,
                "id": c["id"],
                "type": "function",
                "function": {"name": fn["name"], "arguments": ""},
            }
            deltas.append({"tool_calls": [head]})
            args = fn["arguments"]
            deltas += [
                {"tool_calls": [{"index": i, "function": {"arguments": args[j : j + piece]}}]}
                for j in range(0, len(args), piece)
            ]
        if not deltas:
            deltas.append({"content": ""})
        return cls(message, tuple(deltas))

    @classmethod
    def fitting(cls, message: dict[str, Any], limit: int | None) -> RecordedAnswer:
        """The message streamed in at most ``limit`` deltas where it can be (longer pieces; the fewest
        are one a text and two a tool call), so that a recorded answer fits the recorded length."""
        answer, piece = cls.of(message), PIECE_CHARS
        while limit is not None and len(answer.deltas) > limit and piece < _longest(message):
            piece *= 2
            answer = cls.of(message, piece)
        return answer

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.message.get("tool_calls") else "stop"


def _longest(message: dict[str, Any]) -> int:
    texts = [message.get("reasoning_content"), message.get("content")]
    texts += [c["function"]["arguments"] for c in message.get("tool_calls") or ()]
    return max((len(t) for t in texts if isinstance(t, str)), default=0)


def load_recorded(path: str | Path) -> dict[str, dict[str, Any]]:
    """messages key → recorded answer from a JSONL file of ``{"messages": [...], "answer": {assistant
    message}}`` lines (``loadtest run --engine-recorded`` writes it); ValueError names the line."""
    out: dict[str, dict[str, Any]] = {}
    p = Path(path)
    for n, row in _json_rows(p, "--recorded-answers"):
        key = chat_key(row.get("messages")) if isinstance(row, dict) else None
        answer = row.get("answer") if isinstance(row, dict) else None
        if (
            key is None
            or not isinstance(answer, dict)
            or not all(_call(c) for c in answer.get("tool_calls") or ())
            or not all(isinstance(answer.get(k), str | None) for k in ("content", "reasoning_content"))
        ):
            raise ValueError(
                f"--recorded-answers {p}: line {n} needs 'messages' (a list of messages) and 'answer' "
                "(an assistant message: content and reasoning_content strings, tool_calls [{id, function: "
                "{name, arguments}}])"
            )
        out[key] = answer
    return out


def _call(c: Any) -> bool:
    fn = c.get("function") if isinstance(c, dict) else None
    return (
        isinstance(fn, dict)
        and isinstance(c.get("id"), str)
        and isinstance(fn.get("name"), str)
        and isinstance(fn.get("arguments"), str)
    )
