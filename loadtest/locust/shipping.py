"""Record lines between processes: a worker's shipped log (lines wait for the next report) and the master's
sink (each worker's lines appended to ``records-w<i>.jsonl`` in the run folder; a failed write stops the
sink and counts what it could not write, docs/durability.md)."""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path

from loadtest.client.record import RequestRecord
from loadtest.contracts.record_line import LINE_ENCODER
from loadtest.results.durable import AppendFile, FailureHandler, WriteFailure

log = logging.getLogger("loadtest")


class ShippedLog:
    """A worker's record log: each line goes to a local file (if any) and waits for the next report.

    ``take()`` hands over the lines finished since the last call (zlib-compressed); the caller takes the
    histogram delta in the same step, so lines and counts always travel together.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path if path is not None else Path(os.devnull)
        self._copy: AppendFile | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._copy = AppendFile(path, self._copy_failed)
        self._pending: list[bytes] = []
        self.count = 0

    def _copy_failed(self, failure: WriteFailure) -> None:
        """The local copy is insurance: the lines still go to the master, which holds the run's records."""
        log.warning(
            "%s: this worker's own copy of its records stops; its lines still go to the master",
            failure.describe(),
        )

    def write(self, rec: RequestRecord) -> None:
        line = LINE_ENCODER.encode(rec.to_log()) + b"\n"
        if self._copy is not None:
            self._copy.append(line)
        self._pending.append(line)
        self.count += 1

    @property
    def lost(self) -> int:
        """Nothing: every line goes to the master (which counts what it cannot write)."""
        return 0

    @property
    def failure(self) -> WriteFailure | None:
        return None

    def take(self) -> bytes:
        if not self._pending:
            return b""
        blob = zlib.compress(b"".join(self._pending), 1)
        self._pending = []
        return blob

    def close(self) -> None:
        if self._copy is not None:
            self._copy.close()


class RecordSink:
    """The master's side: appends each worker's shipped lines to ``records-w<i>.jsonl`` in the run folder.
    From the first failed write (a full disk) on, no line is written: ``lost`` counts them, ``on_failure``
    hears of it once."""

    def __init__(self, out: Path, on_failure: FailureHandler | None = None) -> None:
        self.out = out
        self.on_failure = on_failure
        self._files: dict[int, AppendFile] = {}
        self.counts: dict[int, int] = {}
        self.failure: WriteFailure | None = None
        self._lost = 0

    def add(self, index: int, blob: bytes | None) -> None:
        if blob:
            self.add_raw(index, zlib.decompress(blob))

    def add_raw(self, index: int, raw: bytes) -> None:
        """Append whole record lines (each ending in a newline) to worker ``index``'s log."""
        if not raw:
            return
        lines = raw.count(b"\n")
        if self.failure is not None:
            self._lost += lines
            return
        f = self._files.get(index)
        if f is None:
            try:
                f = self._files[index] = AppendFile(self.out / f"records-w{index}.jsonl", self._failed)
            except OSError as e:
                self._lost += lines
                self._failed(WriteFailure.of(self.out / f"records-w{index}.jsonl", e))
                return
        if f.append(raw, lines):
            self.counts[index] = self.counts.get(index, 0) + lines
        elif index not in self.counts:
            self.counts[index] = 0  # the file exists (maybe empty): it is one of the run's logs

    def _failed(self, failure: WriteFailure) -> None:
        if self.failure is None:
            self.failure = failure
            if self.on_failure is not None:
                self.on_failure(failure)

    @property
    def lost(self) -> int:
        """Record lines received but not written (after a failed write)."""
        return self._lost + sum(f.lost for f in self._files.values())

    @property
    def files(self) -> list[str]:
        """Every log written, also after ``close``."""
        return [f"records-w{i}.jsonl" for i in sorted(self.counts)]

    def close(self) -> None:
        for f in self._files.values():
            f.close()
            self._lost += f.lost
        self._files.clear()
