"""Reader for Qwen-Bailian JSONL traces (`chat_id, parent_chat_id, timestamp, input_length, output_length,
type, turn, hash_ids`).

Assumptions: `timestamp` is in seconds (the published traces use fractional seconds from the start of
the capture); `parent_chat_id` is -1 (or absent/null) for the first turn of a conversation; `hash_ids`
are prefix-chained blocks, 16 tokens each in the published Bailian traces (not Mooncake's 512).
`session_id` is the chat_id of the conversation's root: follow `parent_chat_id` back while the parent
is in the file (a parent missing from the file becomes the root id); `parent_id` is `parent_chat_id`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.traces._io import as_count, as_hash_ids, as_number, as_opt_str, finish, json_lines, req
from loadtest.traces.errors import TraceFormatError
from loadtest.traces.record import TraceRecord

_NO_PARENT = {None, -1, "-1", ""}


def read_bailian(path: Path) -> list[TraceRecord]:
    """Read a Qwen-Bailian trace; `type` goes to `kind`, the conversation root to `session_id`."""
    path = Path(path)
    rows: list[tuple[str, str | None, TraceRecord]] = []
    for n, obj in json_lines(path):
        chat_id = as_opt_str(req(obj, "chat_id", path, n))
        parent = obj.get("parent_chat_id")
        parent_id = None if parent in _NO_PARENT else str(parent)
        record = TraceRecord(
            as_number(req(obj, "timestamp", path, n), "timestamp", path, n),
            as_count(req(obj, "input_length", path, n), "input_length", path, n),
            as_count(req(obj, "output_length", path, n), "output_length", path, n),
            as_hash_ids(obj.get("hash_ids"), "hash_ids", path, n),
            turn=_turn(obj.get("turn"), path, n),
            parent_id=parent_id,
            kind=as_opt_str(obj.get("type")),
        )
        rows.append((str(chat_id), parent_id, record))
    parents = {chat_id: parent for chat_id, parent, _ in rows}
    records = [replace(rec, session_id=_root(chat_id, parents, path)) for chat_id, _, rec in rows]
    return finish(records, path)


def _turn(value: Any, path: Path, lineno: int) -> int | None:
    """An optional turn number."""
    return None if value is None else as_count(value, "turn", path, lineno)


def _root(chat_id: str, parents: dict[str, str | None], path: Path) -> str:
    """Follow parent links back to the conversation's first request present (cycle-safe)."""
    seen = {chat_id}
    node = chat_id
    while (parent := parents.get(node)) is not None:
        if parent in seen:
            raise TraceFormatError(path, None, f"parent_chat_id cycle through {parent!r}")
        seen.add(parent)
        node = parent
        if node not in parents:
            break
    return node
