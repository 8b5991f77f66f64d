"""The error every trace reader raises for malformed input."""

from __future__ import annotations

from pathlib import Path


class TraceFormatError(ValueError):
    """Malformed trace input, naming the file, the 1-based line and what is wrong."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        self.path = Path(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {message}")
