"""Reader for Mooncake (FAST'25) JSONL traces: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`."""

from __future__ import annotations

from pathlib import Path

from loadtest.traces._io import as_count, as_hash_ids, as_number, finish, json_lines, req
from loadtest.traces.record import TraceRecord


def read_mooncake(path: Path) -> list[TraceRecord]:
    """Read a Mooncake trace; timestamps are milliseconds, hash_ids are 512-token prefix-chained blocks."""
    path = Path(path)
    records = [
        TraceRecord(
            as_number(req(obj, "timestamp", path, n), "timestamp", path, n) / 1000.0,
            as_count(req(obj, "input_length", path, n), "input_length", path, n),
            as_count(req(obj, "output_length", path, n), "output_length", path, n),
            as_hash_ids(obj.get("hash_ids"), "hash_ids", path, n),
        )
        for n, obj in json_lines(path)
    ]
    return finish(records, path)
