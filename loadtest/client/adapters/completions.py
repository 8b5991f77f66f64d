"""The (text) completions API (``api: completions``, POST /v1/completions): a prompt in, the ``choices``
shape out (text_completion chunks or object), read as chat's."""

from __future__ import annotations

from typing import ClassVar

from loadtest.client.adapters.chat import ChatAdapter


class CompletionsAdapter(ChatAdapter):
    names: ClassVar[tuple[str, ...]] = ("completions",)
    route: ClassVar[str] = "/completions"
