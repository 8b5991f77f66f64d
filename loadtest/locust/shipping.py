"""Record lines between processes: a worker's shipped log (lines wait for the next report) and the master's
sink (each worker's lines appended to ``records-w<i>.jsonl`` in the run folder)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from loadtest.client.record import RequestRecord
from loadtest.contracts.record_line import LINE_ENCODER


class ShippedLog:
    """A worker's record log: each line goes to a local file (if any) and waits for the next report.

    ``take()`` hands over the lines finished since the last call (zlib-compressed); the caller takes the
    histogram delta in the same step, so lines and counts always travel together.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path if path is not None else Path(os.devnull)
        self._fd = -1
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._pending: list[bytes] = []
        self.count = 0

    def write(self, rec: RequestRecord) -> None:
        line = LINE_ENCODER.encode(rec.to_log()) + b"\n"
        if self._fd >= 0:
            os.write(self._fd, line)
        self._pending.append(line)
        self.count += 1

    def take(self) -> bytes:
        if not self._pending:
            return b""
        blob = zlib.compress(b"".join(self._pending), 1)
        self._pending = []
        return blob

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


class RecordSink:
    """The master's side: appends each worker's shipped lines to ``records-w<i>.jsonl`` in the run folder."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._fds: dict[int, int] = {}
        self.counts: dict[int, int] = {}

    def add(self, index: int, blob: bytes | None) -> None:
        if blob:
            self.add_raw(index, zlib.decompress(blob))

    def add_raw(self, index: int, raw: bytes) -> None:
        """Append whole record lines (each ending in a newline) to worker ``index``'s log."""
        if not raw:
            return
        fd = self._fds.get(index)
        if fd is None:
            path = self.out / f"records-w{index}.jsonl"
            fd = self._fds[index] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.counts[index] = self.counts.get(index, 0) + raw.count(b"\n")
        data = memoryview(raw)
        while data:
            data = data[os.write(fd, data) :]

    @property
    def files(self) -> list[str]:
        """Every log written, also after ``close``."""
        return [f"records-w{i}.jsonl" for i in sorted(self.counts)]

    def close(self) -> None:
        for fd in self._fds.values():
            os.fsync(fd)
            os.close(fd)
        self._fds.clear()
