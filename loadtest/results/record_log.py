"""The per-request record log: one JSON line per finished request, handed to the OS as each request ends;
a write that fails stops the writing and is counted (results/durable.py, docs/durability.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from loadtest.client.record import RequestRecord
from loadtest.contracts.record_line import LINE_DECODER, LINE_ENCODER, RecordLine
from loadtest.results.durable import AppendFile, FailureHandler, WriteFailure


class RecordLog:
    """Append-only JSONL writer; each line reaches the OS as soon as its request finishes. After a failed
    write (a full disk) nothing more is written: ``lost`` counts the records that are not in the file."""

    def __init__(self, path: Path, on_failure: FailureHandler | None = None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = AppendFile(path, on_failure)
        self.count = 0

    def write(self, rec: RequestRecord) -> None:
        if self._file.append(LINE_ENCODER.encode(rec.to_log()) + b"\n"):
            self.count += 1

    @property
    def failure(self) -> WriteFailure | None:
        return self._file.failure

    @property
    def lost(self) -> int:
        return self._file.lost

    def close(self) -> None:
        self._file.close()


@dataclass
class ReadTally:
    """What ``read_lines`` skipped: a last line cut mid-way (a crash, a full disk) and lines that are not
    record lines."""

    cut: int = 0
    bad: int = 0


def read_lines(paths: list[Path], tally: ReadTally | None = None) -> Iterator[RecordLine]:
    """Every complete line of the given logs; a last line cut by a crash, or one that is not a record
    line, is skipped (and counted in ``tally``)."""
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    if tally is not None:
                        tally.cut += 1
                    break  # cut mid-line by a crash: everything before it is intact
                try:
                    yield LINE_DECODER.decode(line)
                except msgspec.DecodeError:  # also msgspec.ValidationError
                    if tally is not None:
                        tally.bad += 1
                    continue


def record_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("records*.jsonl"))
