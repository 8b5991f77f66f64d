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

    def endpoints_counts(
        self,
        content: str,
        reasoning: str,
        tool_calls: Sequence[dict[str, Any]],
        first: str | None,
        plain: int | None = None,
    ) -> tuple[int, int | None]:
        """An answer's two MLPerf Endpoints counts, as its reference client makes them: the output tokens,
        and the tokens after the first output-bearing chunk (TPOT's denominator; None when the answer was
        not streamed). A text-only answer is counted plainly; one with reasoning or tool calls through the
        chat template (without one, the plain count of its parts joined by newlines, as the reference
        falls back). The first chunk is the first reasoning fragment when there is reasoning, else the
        first text fragment, else the first tool-call delta, whose call name goes with it (``first``: the
        first output-bearing event's fragments; ``plain``: the content's plain count when the caller
        has it)."""
        structured = bool(reasoning or tool_calls)  # decided on the whole answer, for both counts
        if structured or plain is None:
            total = self._endpoints_count(structured, content, reasoning, tool_calls)
        else:
            total = plain
        if first is None:
            return total, None
        if reasoning:
            reasoning = _after(reasoning, first)
        elif content:
            content = _after(content, first)
        elif tool_calls:
            head = {"name": "", "arguments": _after(str(tool_calls[0].get("arguments") or ""), first)}
            tool_calls = [head, *tool_calls[1:]]
        return total, self._endpoints_count(structured, content, reasoning, tool_calls)

    def _endpoints_count(
        self, structured: bool, content: str, reasoning: str, tool_calls: Sequence[dict[str, Any]]
    ) -> int:
        if not structured:
            return self._tok.count(content)
        n = self.templated_count(content, reasoning, tool_calls)
        if n is not None:
            return n
        calls = json.dumps(list(tool_calls), separators=(",", ":")) if tool_calls else ""
        return self._tok.count("\n".join(p for p in (content, reasoning, calls) if p))

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


def _after(text: str, first: str) -> str:
    """What followed the first chunk in one channel: ``text`` less its leading ``first``."""
    return text[len(first) :] if text.startswith(first) else text
