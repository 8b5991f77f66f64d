"""POST /v1/messages: the Anthropic Messages API served by the engine like chat (prefill, then decode steps):
typed events (message_start … message_stop) or one Message object (docs/sources.md §9)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from loadtest.sim.protocol import GenRequest, OutputPlan, RequestError, _chunk, _dumps, parse_request
from loadtest.sim.routes.base import Answer, EngineRequest, Flow
from loadtest.tokens.tokenizer import Tokenizer
from loadtest.workload.text import TOKEN_PIECES, token_piece

MESSAGES_PATH = "/v1/messages"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
THINKING_EFFORT = "medium"  # ``thinking`` enabled: the engine answers with reasoning first, as for chat


def _text(content: Any) -> str:
    """A Messages ``content`` (a string or text blocks) as chat text."""
    if isinstance(content, list):
        return "".join(str(b.get("text") or "") for b in content if isinstance(b, dict))
    return content if isinstance(content, str) else ""


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    """Messages tools ({name, input_schema}) and tool_choice as chat's, for the engine's tool-call plan."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return {}
    fns = [
        {"type": "function", "function": {"name": t.get("name"), "parameters": t.get("input_schema")}}
        for t in tools
        if isinstance(t, dict)
    ]
    choice = body.get("tool_choice")
    out: dict[str, Any] = {"tools": fns}
    if isinstance(choice, dict) and choice.get("type") == "none":
        out["tool_choice"] = "none"
    elif isinstance(choice, dict) and choice.get("type") == "tool" and choice.get("name"):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    return out


def parse_messages_request(body: dict[str, Any], tok: Tokenizer) -> GenRequest:
    """A Messages body as the engine sees it: ``system`` and ``messages`` as chat messages, ``max_tokens``
    (required), ``thinking`` as a reasoning effort, tools as chat's."""
    given = body.get("messages")
    if not isinstance(given, list) or not given or not all(isinstance(m, dict) for m in given):
        raise RequestError(400, "messages: a non-empty list of objects is required", "invalid_request_error")
    if "max_tokens" not in body:
        raise RequestError(400, "max_tokens: Field required", "invalid_request_error", "max_tokens")
    messages = [{"role": m.get("role", "user"), "content": _text(m.get("content"))} for m in given]
    system = _text(body.get("system"))
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    chat: dict[str, Any] = {"messages": messages, "stream": bool(body.get("stream", False))}
    chat["stream_options"] = {"include_usage": True}
    chat.update(_tools(body))
    for key in ("model", "max_tokens", "min_tokens", "ignore_eos"):
        if key in body:
            chat[key] = body[key]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        chat["reasoning_effort"] = THINKING_EFFORT
    return dataclasses.replace(parse_request(chat, True, tok), api="messages")


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {_dumps({'type': kind, **data})}\n\n"


def _usage(prompt: int, output: int, cached: int) -> dict[str, Any]:
    """Messages usage: input_tokens leaves out the prompt tokens read from the cache."""
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    }


class MessagesWriter:
    """The events of one streamed Message (a routes.base.StreamWriter): a thinking block (reasoning), then
    a text block or a tool_use block whose input_json deltas carry the arguments."""

    def __init__(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> None:
        self.rid, self.model, self.plan, self.prompt = response_id, model, plan, prompt_tokens
        self.answer_index = 1 if plan.n_reasoning else 0
        pre = f'event: content_block_delta\ndata: {{"type":"content_block_delta","index":{self.answer_index},'
        self._text_pre = pre + '"delta":{"type":"text_delta","text":'
        self._framed: list[bytes] | None = None

    def _answer_block(self) -> dict[str, Any]:
        p = self.plan
        if p.tool_name is not None:
            return {"type": "tool_use", "id": "toolu_" + p.tool_id[-24:], "name": p.tool_name, "input": {}}
        return {"type": "text", "text": ""}

    def _start(self, index: int) -> str:
        block = {"type": "thinking", "thinking": "", "signature": ""} if index < self.answer_index else None
        return _event("content_block_start", {"index": index, "content_block": block or self._answer_block()})

    def _close_thinking(self) -> str:
        sig = {"index": 0, "delta": {"type": "signature_delta", "signature": "sim-" + self.rid[-12:]}}
        return _event("content_block_delta", sig) + _event("content_block_stop", {"index": 0})

    def opening(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.rid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(self.prompt, 0, 0),
        }
        return (_event("message_start", {"message": message}) + self._start(0) + _event("ping", {})).encode()

    def token(self, index: int) -> str:
        p = self.plan
        if index < p.n_reasoning:
            delta = {"type": "thinking_delta", "thinking": token_piece(index)}
            return _event("content_block_delta", {"index": 0, "delta": delta})
        j = index - p.n_reasoning
        head = self._close_thinking() + self._start(self.answer_index) if j == 0 and p.n_reasoning else ""
        if p.tool_name is not None:
            delta = {"type": "input_json_delta", "partial_json": p.tool_fragment(j)}
            return head + _event("content_block_delta", {"index": self.answer_index, "delta": delta})
        return head + self._text_pre + _dumps(token_piece(index)) + "}}\n\n"

    def tokens(self, first: int, n: int) -> str:
        """One ``content_block_delta`` for the ``n`` tokens from ``first`` that one step produced
        (speculative decoding), a part each: the thinking part, then the answer's text or tool input."""
        if n == 1:
            return self.token(first)
        p = self.plan
        parts = p.run_parts(first, n)
        out = ""
        if parts.reasoning:
            delta = {"type": "thinking_delta", "thinking": parts.reasoning}
            out = _event("content_block_delta", {"index": 0, "delta": delta})
        if parts.answer_from is None:
            return out
        if parts.answer_from == 0 and p.n_reasoning:
            out += self._close_thinking() + self._start(self.answer_index)
        if p.tool_name is not None:
            delta = {"type": "input_json_delta", "partial_json": parts.answer}
            return out + _event("content_block_delta", {"index": self.answer_index, "delta": delta})
        return out + self._text_pre + _dumps(parts.answer) + "}}\n\n"

    def framed_token(self, index: int) -> bytes:
        p = self.plan
        if p.tool_name is None and index > p.n_reasoning:  # plain text tokens: one cached chunk per piece
            if self._framed is None:
                self._framed = [
                    _chunk((self._text_pre + _dumps(t) + "}}\n\n").encode()) for t in TOKEN_PIECES
                ]
            return self._framed[index % len(TOKEN_PIECES)]
        return _chunk(self.token(index).encode())

    def tail(
        self, finish_reason: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int, usage: bool
    ) -> str:
        """The open block's stop, message_delta (stop_reason; the usage with ``usage``), message_stop."""
        p = self.plan
        close = self._close_thinking() if p.n_answer == 0 else ""
        close += _event("content_block_stop", {"index": self.answer_index}) if p.n_answer else ""
        delta: dict[str, Any] = {
            "delta": {"stop_reason": STOP_REASONS.get(finish_reason), "stop_sequence": None}
        }
        if usage:
            delta["usage"] = _usage(prompt_tokens, completion_tokens, cached_tokens)
        return close + _event("message_delta", delta) + _event("message_stop", {})

    def error(self, message: str, code: int = 500) -> str:
        kind = "overloaded_error" if code == 529 else "api_error"
        return _event("error", {"error": {"type": kind, "message": message}})

    def malformed(self) -> str:
        return self._text_pre + '"' + token_piece(0).strip() + "\n\n"


def _tool_input(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"text": text}


def full_message(answer: Answer) -> dict[str, Any]:
    """A non-streamed Message: a thinking block (reasoning), then the text or tool_use block."""
    p = answer.plan
    assert p is not None  # a generated answer
    content: list[dict[str, Any]] = []
    if p.n_reasoning:
        content.append({"type": "thinking", "thinking": p.reasoning_text(), "signature": "sim"})
    if p.tool_name is not None:
        tool_id = "toolu_" + p.tool_id[-24:]
        content.append(
            {"type": "tool_use", "id": tool_id, "name": p.tool_name, "input": _tool_input(p.answer_text())}
        )
    elif p.n_answer:
        content.append({"type": "text", "text": p.answer_text()})
    out: dict[str, Any] = {
        "id": answer.response_id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": content,
        "stop_reason": STOP_REASONS.get(answer.finish_reason or ""),
        "stop_sequence": None,
    }
    if answer.with_usage:
        out["usage"] = _usage(answer.prompt_tokens, p.target, answer.cached_tokens)
    return out


class MessagesRoute:
    api = "messages"
    path = MESSAGES_PATH
    id_prefix = "msg_"
    flow: Flow = "generate"

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> GenRequest:
        return parse_messages_request(body, tok)

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> MessagesWriter:
        return MessagesWriter(response_id, created, model, plan, prompt_tokens)

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        return full_message(answer)
