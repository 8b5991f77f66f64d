"""The per-request record log: one JSON line per finished request, flushed as the run goes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgspec

from loadtest.client.record import RequestRecord
from loadtest.contracts.record_line import LINE_DECODER, LINE_ENCODER, RecordLine


class RecordLog:
    """Append-only JSONL writer; each line reaches the OS as soon as its request finishes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.count = 0

    def write(self, rec: RequestRecord) -> None:
        os.write(self._fd, LINE_ENCODER.encode(rec.to_log()) + b"\n")
        self.count += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


def read_lines(paths: list[Path]) -> Iterator[RecordLine]:
    """Every complete line of the given logs; a last line cut by a crash, or one that is not a record
    line, is skipped."""
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break  # cut mid-line by a crash: everything before it is intact
                try:
                    yield LINE_DECODER.decode(line)
                except msgspec.DecodeError:  # also msgspec.ValidationError
                    continue


def record_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("records*.jsonl"))
