"""The registry of recorded agent-trace formats: each name's reader and sniffer (one module a format)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.traces.agent_formats import cctraces, mlperf_agentic, otel_genai
from loadtest.traces.agent_formats.common import CountTokens, approx_tokens, first_object
from loadtest.traces.agent_graph import Conversation
from loadtest.traces.errors import TraceFormatError

__all__ = ["AGENT_FORMATS", "AgentFormat", "CountTokens", "read_agent_trace", "sniff_agent_format"]


@dataclass(frozen=True, slots=True)
class AgentFormat:
    """One format: its reader (file, token counter -> session graphs) and whether a first object is its."""

    read: Callable[[Path, CountTokens], list[Conversation]]
    sniff: Callable[[Any], bool]
    shape: str  # what its first object looks like, for the error that lists them


# A new format: a module with read(path, count) and sniff(first object), registered here (docs/traces.md).
AGENT_FORMATS: dict[str, AgentFormat] = {
    "cctraces": AgentFormat(cctraces.read, cctraces.sniff, "a session with 'requests' and 'block_size'"),
    "otel": AgentFormat(
        otel_genai.read, otel_genai.sniff, "OTLP JSON 'resourceSpans', a {'spans': [...]} object or one span"
    ),
    "mlperf_agentic": AgentFormat(
        mlperf_agentic.read, mlperf_agentic.sniff, "a row with 'conversation_id', 'turn' and 'role'"
    ),
}


def sniff_agent_format(path: Path | str) -> str:
    """The format of a recording from its first JSON value; a shape no format knows is a TraceFormatError
    naming the file and the fix."""
    path = Path(path)
    lineno, first = first_object(path)
    for name, fmt in AGENT_FORMATS.items():
        if fmt.sniff(first):
            return name
    keys = sorted(first)[:8] if isinstance(first, dict) else type(first).__name__
    shapes = "; ".join(f"{n}: {f.shape}" for n, f in AGENT_FORMATS.items())
    raise TraceFormatError(
        path,
        lineno,
        f"not a known agent-trace format (first object: {keys}); set agent_trace.format to one of "
        f"{', '.join(AGENT_FORMATS)} ({shapes}; docs/traces.md)",
    )


def read_agent_trace(
    path: Path | str, format: str = "auto", count: CountTokens = approx_tokens
) -> list[Conversation]:
    """Every recorded conversation of ``path`` in ``format`` (``auto``: sniffed) as session graphs;
    ``count`` gives a text's tokens where the format carries text instead of counts."""
    path = Path(path)
    name = sniff_agent_format(path) if format == "auto" else format
    if name not in AGENT_FORMATS:
        raise TraceFormatError(
            path, None, f"unknown agent-trace format {name!r}: one of auto, {', '.join(AGENT_FORMATS)}"
        )
    try:
        return AGENT_FORMATS[name].read(path, count)
    except TraceFormatError as e:
        sniffed = name
        if format != "auto":
            with contextlib.suppress(TraceFormatError):
                sniffed = sniff_agent_format(path)
        if sniffed == name:
            raise
        hint = f"the file looks like {sniffed}: set agent_trace.format to it or auto"
        raise TraceFormatError(path, e.line, f"{e.message} ({hint})") from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(
            path, None, f"not UTF-8 text ({e.reason} at byte {e.start}): give a text file"
        ) from None
