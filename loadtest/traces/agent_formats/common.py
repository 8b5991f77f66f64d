"""What the agent-trace readers share: a text's token counter and the first JSON value of a file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from loadtest.traces._io import open_text
from loadtest.traces.errors import TraceFormatError

CountTokens = Callable[[str], int]  # a text's tokens
BLOCK_TOKENS = 64  # tokens per synthetic hash block, where a recording carries none
_JSON = msgspec.json.Decoder()


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate: about four characters a token."""
    return -(-len(text) // 4)


def whole_json(path: Path) -> Any:
    """The file as one JSON value; TraceFormatError when it is not one (line 1 named)."""
    with open_text(path) as fh:
        text = fh.read()
    try:
        return _JSON.decode(text)
    except msgspec.DecodeError as e:
        raise TraceFormatError(path, 1, f"invalid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(path, None, f"not UTF-8 text: {e}") from None


def first_object(path: Path) -> tuple[int | None, Any]:
    """The first non-blank line as JSON (a JSONL file), else the whole file as one JSON value (a
    pretty-printed export), with its line number (None for the whole file)."""
    try:
        with open_text(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                if raw.strip():
                    try:
                        return lineno, _JSON.decode(raw.strip())
                    except msgspec.DecodeError:
                        break
            else:
                raise TraceFormatError(path, None, "the file is empty: give a recording")
    except UnicodeDecodeError as e:
        raise TraceFormatError(path, None, f"not UTF-8 text: {e}") from None
    return None, whole_json(path)
