"""Run files that survive a full disk: whole lines appended or none, the first write failure kept (what,
where, when) with a count of what could not be written, and a space reserve for run.json (docs/durability.md)."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RESERVE_NAME = ".loadtest-reserve"
# Held in the run folder while the load runs and released when it ends (or a write fails): room for
# run.json, the report (about 5 MB: its chart library is inline) and the MLPerf summary on a disk the
# record log filled.
RESERVE_BYTES = 8 << 20
_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EIO: "I/O error",
}


@dataclass(frozen=True, slots=True)
class WriteFailure:
    """The first write that failed: which file, when (epoch s), the OS error."""

    file: str
    at: float
    errno: int
    error: str

    @classmethod
    def of(cls, path: Path | str, e: OSError) -> WriteFailure:
        return cls(Path(path).name, time.time(), e.errno or 0, e.strerror or str(e))

    @property
    def cause(self) -> str:
        """``disk full``, ``read-only file system``, ``I/O error``... in a few words."""
        return _CAUSES.get(self.errno, "write error")

    def describe(self) -> str:
        """``disk full at 14:02:03 UTC writing records.jsonl (No space left on device)``."""
        stamp = time.strftime("%H:%M:%S UTC", time.gmtime(self.at))
        return f"{self.cause} at {stamp} writing {self.file} ({self.error})"


FailureHandler = Callable[[WriteFailure], None]


class AppendFile:
    """An append-only file written a block of whole lines at a time. A block that does not fit is cut
    back out of the file (no half line is left behind when the OS allows it); from the first failure on,
    nothing more is written and every line offered is counted in ``lost``; ``on_failure`` hears of it once."""

    def __init__(self, path: Path, on_failure: FailureHandler | None = None, truncate: bool = False) -> None:
        self.path = path
        self.on_failure = on_failure
        self.failure: WriteFailure | None = None
        self.lost = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        self._fd = os.open(path, flags, 0o644)
        self._size = os.fstat(self._fd).st_size

    def append(self, data: bytes, lines: int = 1) -> bool:
        """Append ``data`` (``lines`` whole lines); False when it was not written (counted in ``lost``)."""
        if self._fd < 0 or self.failure is not None:
            self.lost += lines
            return False
        try:
            written = os.write(self._fd, data)  # one call for a line (the usual case: all of it)
            if written < len(data):
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(self._fd, view) :]
        except OSError as e:
            with contextlib.suppress(OSError):  # a block that does not fit leaves no half line behind
                os.ftruncate(self._fd, self._size)
            self.lost += lines
            self._failed(e)
            return False
        self._size += len(data)
        return True

    def _failed(self, e: OSError) -> None:
        if self.failure is None:
            self.failure = WriteFailure.of(self.path, e)
            if self.on_failure is not None:
                self.on_failure(self.failure)

    def close(self) -> None:
        """Flush to the disk and close; a failure here is kept like a failed write."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            os.fsync(fd)
        except OSError as e:
            self._failed(e)
        finally:
            os.close(fd)


class Reserve:
    """Space held in the run folder while the load runs (``RESERVE_BYTES``), given back when it ends or a
    write fails, so that run.json can still be written on a disk the record log filled."""

    def __init__(self, folder: Path, size: int = RESERVE_BYTES) -> None:
        self.path: Path | None = folder / RESERVE_NAME
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                block = bytes(min(size, 1 << 16))
                left = size
                while left > 0:  # written, not fallocated: every file system counts written blocks
                    left -= os.write(fd, block[: min(left, len(block))])
            finally:
                os.close(fd)
        except OSError:  # no room even for the reserve: the run goes on without one
            self.release()

    def release(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None
