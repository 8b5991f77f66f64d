"""Format registry, sniffing and the `read_trace` entry point."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from loadtest.traces._io import open_text
from loadtest.traces.azure import read_azure
from loadtest.traces.bailian import read_bailian
from loadtest.traces.burstgpt import read_burstgpt
from loadtest.traces.cctraces import first_block_tokens, read_cc_traces
from loadtest.traces.errors import TraceFormatError
from loadtest.traces.mooncake import read_mooncake
from loadtest.traces.native import read_loadtest
from loadtest.traces.record import BLOCK_TOKENS, FORMAT_BLOCK_TOKENS, TraceRecord

Reader = Callable[[Path], list[TraceRecord]]

TRACE_FORMATS: dict[str, Reader] = {
    "azure": read_azure,
    "mooncake": read_mooncake,
    "burstgpt": read_burstgpt,
    "bailian": read_bailian,
    "loadtest": read_loadtest,
    "cc-traces": read_cc_traces,
}


def sniff_format(path: Path) -> str:
    """Guess a trace's format from its first non-blank line (CSV header or first JSON object's keys)."""
    path = Path(path)
    with open_text(path) as fh:
        lineno, first = 0, ""
        for lineno, raw in enumerate(fh, start=1):  # noqa: B007 - lineno used after the loop
            first = raw.strip().lstrip("\ufeff")
            if first:
                break
    if not first:
        raise TraceFormatError(path, None, "empty file, cannot tell its trace format")
    if first.startswith("{"):
        try:
            keys = set(msgspec.json.decode(first))
        except (msgspec.DecodeError, TypeError):
            raise TraceFormatError(path, lineno, "first line is not a JSON object") from None
        if {"id", "block_size", "requests"} <= keys:
            return "cc-traces"
        if "chat_id" in keys:
            return "bailian"
        if {"t", "input_tokens", "output_tokens"} <= keys:
            return "loadtest"
        if {"timestamp", "input_length", "output_length"} <= keys:
            return "mooncake"
        raise TraceFormatError(path, lineno, f"unknown JSONL trace, first object has keys {sorted(keys)}")
    columns = {c.strip() for c in first.split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= columns:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= columns:
        return "burstgpt"
    raise TraceFormatError(path, lineno, f"unknown trace format, first line {first[:80]!r}")


def read_trace(path: Path | str, format: str = "auto") -> list[TraceRecord]:
    """Read any supported trace, sorted by arrival and rebased to 0 s; `format` is a TRACE_FORMATS key or auto."""
    path = Path(path)
    name = sniff_format(path) if format == "auto" else format
    try:
        reader = TRACE_FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown trace format {name!r}; expected auto or one of {sorted(TRACE_FORMATS)}"
        ) from None
    return reader(path)


def trace_block_tokens(path: Path | str, format: str = "auto") -> int:
    """Tokens per ``hash_ids`` block in a trace of ``format`` (auto: sniffed), 512 where it has none."""
    name = sniff_format(Path(path)) if format == "auto" else format
    if name == "cc-traces":  # each session names its own: the first session's
        return first_block_tokens(path)
    return FORMAT_BLOCK_TOKENS.get(name, BLOCK_TOKENS)
