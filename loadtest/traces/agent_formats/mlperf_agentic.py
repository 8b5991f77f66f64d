"""Reader for the MLPerf Endpoints agentic JSONL: recorded conversations with their text, one row a message.

One JSON object a line (docs/sources.md §20): ``conversation_id``, ``turn`` (1, 2, ... within it),
``role`` ``user`` / ``assistant`` / ``tool``, ``content``, ``system`` (the system prompt, on the first user
row), ``tools`` (tool definitions, on client rows), ``tool_calls`` (an assistant's dispatch),
``tool_results`` (a tool row's ``[{tool_call_id, content}]``), ``reasoning_content``, ``delay_seconds``
(the wait before a client row). As the reference client does, each client row (user or tool) is one call
whose messages are the system prompt, every earlier row as recorded (assistant rows too) and its own
messages (a tool row one ``tool`` message per result); its output length is the recorded answer's (the
assistant row after it), and that row is kept as the call's expected answer (with its ``intent_codes``,
the workflow domain's ground truth) for the inline accuracy check. Rows of a conversation are consecutive, their roles follow user -> assistant ->
tool|user, tool -> assistant|user.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from loadtest.traces._io import json_lines
from loadtest.traces.agent_formats.common import BLOCK_TOKENS, CountTokens
from loadtest.traces.agent_graph import AgentCall, Conversation, RecordedChat, chain_hash_ids
from loadtest.traces.errors import TraceFormatError

_NEXT = {
    "start": {"user"},
    "user": {"assistant"},
    "assistant": {"tool", "user"},
    "tool": {"assistant", "user"},
}
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "reasoning_content")


def sniff(first: Any) -> bool:
    """A row with ``conversation_id``, ``turn`` and ``role``."""
    return isinstance(first, dict) and {"conversation_id", "turn", "role"} <= first.keys()


def read(path: Path, count: CountTokens) -> list[Conversation]:
    """Every conversation of the file, its client rows as calls carrying their recorded messages."""
    groups: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    last = None
    for lineno, row in json_lines(path):
        if row.get("_type") == "dataset_metadata":
            continue
        cid = row.get("conversation_id")
        if not isinstance(cid, str | int) or isinstance(cid, bool) or str(cid) == "":
            raise TraceFormatError(path, lineno, "field 'conversation_id': a non-empty string is required")
        cid = str(cid)
        if cid != last and cid in groups:
            raise TraceFormatError(
                path,
                lineno,
                f"field 'conversation_id': rows of {cid!r} are not consecutive (keep each together)",
            )
        groups.setdefault(cid, []).append((lineno, row))
        last = cid
    if not groups:
        raise TraceFormatError(path, None, "the file holds no rows")
    return [_conversation(path, cid, rows, count) for cid, rows in groups.items()]


def _conversation(
    path: Path, cid: str, rows: list[tuple[int, dict[str, Any]]], count: CountTokens
) -> Conversation:
    state = "start"
    history: list[dict[str, Any]] = []
    history_tokens = 0  # the history's text tokens, counted once a message
    # each client row: its input tokens, messages, tools, delay and turn
    pending: list[tuple[int, tuple[dict[str, Any], ...], tuple[dict[str, Any], ...], float, int]] = []
    answers: list[int] = []  # each client row's recorded answer tokens
    expected: list[dict[str, Any] | None] = []  # each client row's recorded answer (None: none recorded)
    tool_tokens: dict[str, int] = {}  # tool definitions' tokens by their JSON (rows repeat them)
    system = next((r["system"] for _, r in rows if isinstance(r.get("system"), str) and r["system"]), None)
    if system is not None:
        history.append({"role": "system", "content": system})
        history_tokens = count(system)
    for expect, (lineno, row) in enumerate(rows, start=1):
        turn, role = row.get("turn"), row.get("role")
        if isinstance(turn, bool) or not isinstance(turn, int) or turn != expect:
            raise TraceFormatError(
                path,
                lineno,
                f"field 'turn': {turn!r} in conversation {cid!r}, expected {expect} (turns count 1, 2, ...)",
            )
        if not isinstance(role, str) or role not in _NEXT[state]:
            raise TraceFormatError(
                path,
                lineno,
                f"field 'role': {role!r} after {state!r} in conversation {cid!r} "
                f"(allowed: {sorted(_NEXT[state])})",
            )
        msgs = _messages(path, lineno, row)
        n_msgs = sum(_tokens(m, count) for m in msgs)
        if role == "assistant":
            if pending and len(answers) < len(pending):
                answers.append(max(1, n_msgs))
                expected.append(_expected(msgs[0], row))
        else:
            delay = row.get("delay_seconds", 0.0) or 0.0
            if (
                isinstance(delay, bool)
                or not isinstance(delay, int | float)
                or not math.isfinite(delay)
                or delay < 0
            ):
                raise TraceFormatError(
                    path, lineno, f"field 'delay_seconds': {delay!r} is not a non-negative number"
                )
            tools = row.get("tools") or []
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise TraceFormatError(
                    path, lineno, "field 'tools': expected a list of tool definitions (objects)"
                )
            if len(answers) < len(pending):
                answers.append(1)  # a client row right after another: nothing recorded to answer it
                expected.append(None)
            spec = json.dumps(tools) if tools else ""
            if spec not in tool_tokens:
                tool_tokens[spec] = count(spec) if spec else 0
            n_in = history_tokens + n_msgs + tool_tokens[spec]
            pending.append((n_in, tuple(history + msgs), tuple(tools), float(delay), turn))
        history += msgs
        history_tokens += n_msgs
        state = role
    if len(answers) < len(pending):
        answers.append(1)
        expected.append(None)
    calls: list[AgentCall] = []
    t = 0.0
    for (n_in, messages, tools, delay, turn), out, exp in zip(pending, answers, expected, strict=True):
        t += delay
        calls.append(
            AgentCall(
                start_s=t,
                input_tokens=max(1, n_in),
                output_tokens=out,
                hash_ids=(),
                api_time_s=0.0,
                delay_before_s=delay,
                recorded=RecordedChat(messages, tools, exp, turn),
            )
        )
    chained, _ = chain_hash_ids(calls, BLOCK_TOKENS, 1)
    return Conversation(cid, BLOCK_TOKENS, tuple(chained), system_tokens=count(system or ""))


def _messages(path: Path, lineno: int, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The row as OpenAI chat messages: a tool row one message per result, any other one message."""
    role = row["role"]
    if role == "tool":
        results = row.get("tool_results")
        if not isinstance(results, list) or not results:
            raise TraceFormatError(path, lineno, "field 'tool_results': a tool row needs a non-empty list")
        out = []
        for i, r in enumerate(results):
            if not isinstance(r, dict) or not isinstance(r.get("tool_call_id"), str) or not r["tool_call_id"]:
                raise TraceFormatError(
                    path, lineno, f"field 'tool_results[{i}].tool_call_id': a non-empty string is required"
                )
            if not isinstance(r.get("content"), str):
                raise TraceFormatError(
                    path, lineno, f"field 'tool_results[{i}].content': a string is required"
                )
            out.append({"role": "tool", "tool_call_id": r["tool_call_id"], "content": r["content"]})
        return out
    msg = {k: row[k] for k in _MESSAGE_KEYS if row.get(k) is not None}
    calls = msg.get("tool_calls")
    if calls is not None:
        if (
            role != "assistant"
            or not isinstance(calls, list)
            or not calls
            or not all(_tool_call(c) for c in calls)
        ):
            raise TraceFormatError(
                path,
                lineno,
                "field 'tool_calls': an assistant's list of {id, type: function, function: {name, arguments}}",
            )
        msg.setdefault("content", None)
    elif not isinstance(msg.get("content"), str):
        raise TraceFormatError(path, lineno, f"field 'content': a {role} row needs its text (a string)")
    for key in ("content", "reasoning_content", "name"):
        if msg.get(key) is not None and not isinstance(msg[key], str):
            raise TraceFormatError(path, lineno, f"field {key!r}: a string is required")
    return [msg]


def _expected(msg: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """The assistant row as its expected answer: its message, and its ``intent_codes`` (strings) if any."""
    codes = row.get("intent_codes")
    if isinstance(codes, list) and codes:
        return {**msg, "intent_codes": [c for c in codes if isinstance(c, str) and c]}
    return msg


def _tool_call(c: Any) -> bool:
    fn = c.get("function") if isinstance(c, dict) else None
    return (
        isinstance(fn, dict)
        and isinstance(c.get("id"), str)
        and c.get("type") == "function"
        and isinstance(fn.get("name"), str)
        and isinstance(fn.get("arguments"), str)
    )


def _tokens(msg: dict[str, Any], count: CountTokens) -> int:
    """A message's text tokens: its content, reasoning and tool calls' names and arguments."""
    parts = [msg.get("content") or "", msg.get("reasoning_content") or ""]
    parts += [c["function"]["name"] + c["function"]["arguments"] for c in msg.get("tool_calls") or []]
    return sum(count(p) for p in parts if p)
