"""OpenAI tool definitions, tool-call and tool-result messages for synthetic agent conversations."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from loadtest.tokens.tokenizer import Tokenizer
from loadtest.workload.text import synth_text


def tools_json(tools: Sequence[dict[str, Any]]) -> str:
    """The text a tools list is counted as: its ``json.dumps`` (default separators, key order kept)."""
    return json.dumps(list(tools))


def tool_definitions(seed: int, n_tools: int, description_tokens: int) -> list[dict[str, Any]]:
    """``n_tools`` function tools in OpenAI ``tools`` format, the same for the same seed."""
    rng = random.Random(f"{seed}:tools")
    tools = []
    for i in range(n_tools):
        words = synth_text(2, rng).split()
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"{words[0]}_{words[1]}_{i}",
                    "description": synth_text(description_tokens, rng).lstrip(),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "input": {"type": "string", "description": synth_text(8, rng).lstrip()}
                        },
                        "required": ["input"],
                    },
                },
            }
        )
    return tools


def shared_prefix(
    seed: int, tokenizer: Tokenizer, prefix_tokens: int, n_tools: int
) -> tuple[str, list[dict[str, Any]]]:
    """A system prompt and tools (about half the budget) whose chat tokens plus tools JSON ≈ ``prefix_tokens``."""
    tools: list[dict[str, Any]] = []
    if n_tools > 0:
        bare = tokenizer.count(tools_json(tool_definitions(seed, n_tools, 0)))
        per_tool = max(0, (prefix_tokens // 2 - bare) // n_tools)
        tools = tool_definitions(seed, n_tools, per_tool)
    overhead = tokenizer.count_chat([{"role": "system", "content": ""}])
    budget = prefix_tokens - overhead - (tokenizer.count(tools_json(tools)) if tools else 0)
    system = synth_text(max(0, budget), random.Random(f"{seed}:agent-system"), tokenizer).lstrip()
    return system, tools


def tool_call_message(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message that makes ``calls``."""
    return {"role": "assistant", "content": None, "tool_calls": calls}


def tool_result_message(call_id: str, content: str) -> dict[str, Any]:
    """The tool message answering call ``call_id``."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def tool_calls_from_answer(
    text: str | None, returned: Sequence[dict[str, Any]] | None, name: str, call_id: str
) -> list[dict[str, Any]]:
    """The calls of an answer: the server's ``tool_calls``, else ``text`` as arguments (JSON kept, other text wrapped)."""
    if returned:
        calls = []
        for k, c in enumerate(returned):
            fn = c.get("function") or {}
            args = fn.get("arguments")
            calls.append(
                {
                    "id": c.get("id") or f"{call_id}_{k}",
                    "type": "function",
                    "function": {
                        "name": fn.get("name") or name,
                        "arguments": args if isinstance(args, str) else json.dumps(args or {}),
                    },
                }
            )
        return calls
    text = text or ""
    try:
        args = text if isinstance(json.loads(text), dict) else None
    except ValueError:
        args = None
    if args is None:
        args = json.dumps({"input": text})
    return [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]
