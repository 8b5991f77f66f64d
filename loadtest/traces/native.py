"""Reader for the project's own `loadtest` JSONL trace format (see the package docstring)."""

from __future__ import annotations

from pathlib import Path

from loadtest.traces._io import as_count, as_hash_ids, as_number, as_opt_str, finish, json_lines, req
from loadtest.traces.record import TraceRecord


def read_loadtest(path: Path) -> list[TraceRecord]:
    """Read a `loadtest` JSONL trace: `t` (s), token counts, optional hash_ids/session/turn/scenario."""
    path = Path(path)
    records: list[TraceRecord] = []
    for n, obj in json_lines(path):
        turn = obj.get("turn")
        records.append(
            TraceRecord(
                as_number(req(obj, "t", path, n), "t", path, n),
                as_count(req(obj, "input_tokens", path, n), "input_tokens", path, n),
                as_count(req(obj, "output_tokens", path, n), "output_tokens", path, n),
                as_hash_ids(obj.get("hash_ids"), "hash_ids", path, n),
                session_id=as_opt_str(obj.get("session")),
                turn=None if turn is None else as_count(turn, "turn", path, n),
                kind=as_opt_str(obj.get("scenario")),
            )
        )
    return finish(records, path)
