"""Reader for BurstGPT CSV traces: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.

`Timestamp` is seconds. BurstGPT logs failed requests with 0 response tokens; they are kept (with
`output_tokens == 0`) so arrival statistics stay true to the trace; filter them out if unwanted.
"""

from __future__ import annotations

from pathlib import Path

from loadtest.traces._io import as_count, as_number, csv_rows, finish
from loadtest.traces.record import TraceRecord

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Log Type")


def read_burstgpt(path: Path) -> list[TraceRecord]:
    """Read a BurstGPT CSV; `Model` goes to `model`, `Log Type` to `kind`."""
    path = Path(path)
    records = [
        TraceRecord(
            as_number(row["Timestamp"], "Timestamp", path, n),
            as_count(row["Request tokens"], "Request tokens", path, n),
            as_count(row["Response tokens"], "Response tokens", path, n),
            kind=row["Log Type"].strip() or None,
            model=row["Model"].strip() or None,
        )
        for n, row in csv_rows(path, COLUMNS)
    ]
    return finish(records, path)
