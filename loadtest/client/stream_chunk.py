"""The shape msgspec decodes an OpenAI stream's events into: only the fields the metrics read.

A module of its own because the compiled build (setup.py) compiles sse.py and not these classes:
msgspec reads their annotations, which a compiled module does not keep.
"""

from __future__ import annotations

from typing import Any

import msgspec

from loadtest.client.usage_counts import UsageCounts


class Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None  # read item by item (read_tool_call): servers vary its shape


class Choice(msgspec.Struct, gc=False):
    delta: Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class Usage(UsageCounts):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: dict | None = None
    completion_tokens_details: dict | None = None


class Chunk(msgspec.Struct, gc=False):
    choices: list[Choice] | None = None
    usage: Usage | None = None
    error: dict | str | None = None
    message: str | None = None  # vLLM-style {"object": "error", "message": ...}
