"""MLPerf Endpoints output tokens: an answer counted through the model's chat template (docs/sources.md §2)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jinja2.exceptions import TemplateError

if TYPE_CHECKING:
    from loadtest.tokens.tokenizer import Tokenizer

# The reference client renders the answer after a user message with no content and subtracts what
# that message and an empty assistant message cost, so only the assistant's payload is counted.
_PREFIX_USER: dict[str, Any] = {"role": "user", "content": ""}
_EMPTY_ASSISTANT: dict[str, Any] = {"role": "assistant", "content": ""}


class AssistantCounter:
    """Counts an answer (text, reasoning, tool calls) as MLPerf Endpoints v1.0 does: ``count(user +
    assistant) − count(user + empty assistant)`` through the model's chat template. Without a template
    (``templated`` false) the count is the tokenizer's plain count of the texts, as the run's own is."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self.templated = tokenizer.has_template
        self.failed = 0  # answers the template refused (counted plainly instead)
        self._baseline = 0
        if self.templated:
            try:
                self._baseline = tokenizer.count_rendered([_PREFIX_USER, _EMPTY_ASSISTANT], False)
            except TemplateError:
                self.templated = False

    def count(self, content: str, reasoning: str = "", tool_calls: Sequence[dict[str, Any]] = ()) -> int:
        """The answer's tokens; ``tool_calls``: each call's ``name`` and ``arguments`` text (parsed as
        JSON for the template when it is a JSON object, as the reference client does). Through the
        template when there is one and it takes the answer, else the plain count of the texts."""
        n = self.templated_count(content, reasoning, tool_calls)
        if n is not None:
            return n
        args = "".join(str(c.get("arguments") or "") for c in tool_calls)
        return self._tok.count(content + args) + self._tok.count(reasoning)

    def templated_count(
        self, content: str, reasoning: str = "", tool_calls: Sequence[dict[str, Any]] = ()
    ) -> int | None:
        """The answer's tokens through the chat template; None without one, or when the template refuses
        the answer (counted in ``failed``)."""
        if not self.templated:
            return None
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            msg["reasoning_content"] = reasoning
        if tool_calls:
            msg["tool_calls"] = [_for_template(c) for c in tool_calls]
        try:
            return max(0, self._tok.count_rendered([_PREFIX_USER, msg], False) - self._baseline)
        except (TemplateError, TypeError, ValueError):
            self.failed += 1
            return None


def _for_template(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped tool call whose ``arguments`` is the parsed JSON object when it parses as one."""
    args: Any = call.get("arguments") or ""
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        parsed = args
    if isinstance(parsed, dict):
        args = parsed
    return {"type": "function", "function": {"name": call.get("name") or "", "arguments": args}}
