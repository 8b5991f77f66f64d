"""The cc-traces format in the registry: its reader (loadtest/traces/cctraces.py) and its sniffer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadtest.traces.agent_formats.common import CountTokens
from loadtest.traces.agent_graph import Conversation
from loadtest.traces.cctraces import read_cc_conversations


def sniff(first: Any) -> bool:
    """A cc-traces session: an object with ``requests`` and ``block_size``."""
    return isinstance(first, dict) and "requests" in first and "block_size" in first


def read(path: Path, count: CountTokens) -> list[Conversation]:
    """The sessions of a cc-traces JSONL (token counts are recorded: ``count`` is not needed)."""
    return read_cc_conversations(path)
