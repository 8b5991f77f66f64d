"""Reader for the Azure LLM inference traces (2023/2024): `TIMESTAMP,ContextTokens,GeneratedTokens`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from loadtest.traces._io import as_count, csv_rows, finish
from loadtest.traces.errors import TraceFormatError
from loadtest.traces.record import TraceRecord

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure(path: Path) -> list[TraceRecord]:
    """Read an Azure LLM trace CSV; timestamps keep all 7 fractional digits."""
    path = Path(path)
    days: dict[str, int] = {}
    records: list[TraceRecord] = []
    for lineno, row in csv_rows(path, COLUMNS):
        t = _seconds(row["TIMESTAMP"], days, path, lineno)
        records.append(
            TraceRecord(
                t,
                as_count(row["ContextTokens"], "ContextTokens", path, lineno),
                as_count(row["GeneratedTokens"], "GeneratedTokens", path, lineno),
            )
        )
    return finish(records, path)


def _seconds(text: str, days: dict[str, int], path: Path, lineno: int) -> float:
    """Parse `YYYY-MM-DD HH:MM:SS[.fffffff]` into seconds since midnight of the first date seen."""
    text = text.strip()
    date, _, clock = text.partition(" ")
    if not clock:
        date, _, clock = text.partition("T")
    try:
        day = days.get(date)
        if day is None:
            day = days[date] = dt.date.fromisoformat(date).toordinal()
        hh, mm, ss = clock.split(":")
        h, m, sec = int(hh), int(mm), float(ss)
        if not (0 <= h < 24 and 0 <= m < 60 and 0 <= sec < 61):
            raise ValueError(text)
    except ValueError:
        raise TraceFormatError(
            path, lineno, f"column 'TIMESTAMP': {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'"
        ) from None
    first = next(iter(days.values()))
    return (day - first) * 86400 + h * 3600 + m * 60 + sec
