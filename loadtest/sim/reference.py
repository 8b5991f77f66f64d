"""The engine's reference-answer mode: a prompt found in the reference file is answered with its reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_references(path: str | Path) -> dict[str, str]:
    """prompt → answer from a JSONL file of ``{"prompt": ..., "answer": ...}`` lines; ValueError names the line."""
    refs: dict[str, str] = {}
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--reference-answers {p}: cannot read ({e})") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--reference-answers {p}: line {n} is not JSON ({e})") from e
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
