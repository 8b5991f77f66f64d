"""Shared helpers for the readers: opening, field checks, sorting and rebasing."""

from __future__ import annotations

import csv
import gzip
import math
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import msgspec

from loadtest.traces.errors import TraceFormatError
from loadtest.traces.record import TraceRecord

_JSON = msgspec.json.Decoder()


def open_text(path: Path) -> IO[str]:
    """Open a trace as text, transparently un-gzipping `*.gz`."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line of a JSONL file."""
    with open_text(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            text = raw.strip()
            if not text:
                continue
            try:
                obj = _JSON.decode(text)
            except msgspec.DecodeError as exc:
                raise TraceFormatError(path, lineno, f"invalid JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def csv_rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, {column: text}) for each data row, checking the header names `columns`."""
    with open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(path, 1, "empty file, expected a CSV header")
        names = [h.strip().lstrip("\ufeff") for h in header]
        missing = [c for c in columns if c not in names]
        if missing:
            raise TraceFormatError(path, 1, f"CSV header lacks column(s) {missing}; found {names}")
        index = {c: names.index(c) for c in columns}
        for row in reader:
            lineno = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(names):
                raise TraceFormatError(path, lineno, f"expected {len(names)} columns, got {len(row)}")
            yield lineno, {c: row[i] for c, i in index.items()}


def req(obj: Mapping[str, Any], key: str, path: Path, lineno: int) -> Any:
    """Return a required field or raise naming it."""
    try:
        return obj[key]
    except KeyError:
        raise TraceFormatError(path, lineno, f"missing field {key!r}") from None


def as_number(value: Any, key: str, path: Path, lineno: int) -> float:
    """Check a finite JSON number (or numeric CSV text) and return it as float."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise TraceFormatError(path, lineno, f"field {key!r}: {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceFormatError(path, lineno, f"field {key!r}: {value!r} is not a finite number")
    return float(value)


def as_count(value: Any, key: str, path: Path, lineno: int) -> int:
    """Check a non-negative integer (JSON int, integral float or CSV text) and return it."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                raise TraceFormatError(path, lineno, f"field {key!r}: {value!r} is not an integer") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(path, lineno, f"field {key!r}: {value!r} is not an integer")
    if value < 0:
        raise TraceFormatError(path, lineno, f"field {key!r}: {value} is negative")
    return value


def as_hash_ids(value: Any, key: str, path: Path, lineno: int) -> tuple[int, ...]:
    """Check a list of integer block ids and return it as a tuple."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise TraceFormatError(path, lineno, f"field {key!r}: expected a list of integers")
    return tuple(value)


def as_opt_str(value: Any) -> str | None:
    """Render an optional id or label as a string (None stays None)."""
    return None if value is None else str(value)


def finish(records: list[TraceRecord], path: Path) -> list[TraceRecord]:
    """Sort by arrival (stable) and rebase so the first request is at 0 s."""
    if not records:
        raise TraceFormatError(path, None, "trace holds no requests")
    records.sort(key=lambda r: r.timestamp_s)
    t0 = records[0].timestamp_s
    if t0 == 0.0:
        return records
    return [replace(r, timestamp_s=r.timestamp_s - t0) for r in records]
