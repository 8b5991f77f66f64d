"""The Responses API (/v1/responses) wire shapes: request translation, streaming events, the full object."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from loadtest.sim.protocol import (
    GenRequest,
    OutputPlan,
    RequestError,
    _chunk,
    _dumps,
    parse_request,
)
from loadtest.tokens.tokenizer import Tokenizer
from loadtest.workload.text import token_piece

RESPONSES_PATH = "/v1/responses"


def parse_responses_request(body: dict[str, Any], tok: Tokenizer) -> GenRequest:
    """A Responses API body (decoded) as the engine sees it: ``input`` (text or messages) as chat
    messages, ``max_output_tokens`` as max_tokens, ``reasoning.effort`` as the reasoning effort."""
    given = body.get("input")
    if isinstance(given, str) and given:
        messages: Any = [{"role": "user", "content": given}]
    elif isinstance(given, list) and given and all(isinstance(m, dict) for m in given):
        messages = [{"role": m.get("role", "user"), "content": _content(m.get("content"))} for m in given]
    else:
        raise RequestError(
            400,
            "'input' is required: a string or a non-empty list of messages",
            "missing_required_parameter",
            "input",
        )
    if isinstance(body.get("instructions"), str):
        messages = [{"role": "system", "content": body["instructions"]}, *messages]
    chat: dict[str, Any] = {"messages": messages, "stream": bool(body.get("stream", False))}
    chat["stream_options"] = {"include_usage": True}
    for key in ("model", "min_tokens", "ignore_eos"):
        if key in body:
            chat[key] = body[key]
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    return dataclasses.replace(parse_request(chat, True, tok), api="responses")


def _content(c: Any) -> Any:
    """Responses content parts (input_text ...) as chat text."""
    if isinstance(c, list):
        return "".join(str(p.get("text") or "") for p in c if isinstance(p, dict))
    return c if isinstance(c, str) else ""


def _usage(prompt: int, output: int, cached: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + output,
    }


class ResponsesWriter:
    """Streaming events of one response (a routes.base.StreamWriter, as protocol.ChunkWriter is)."""

    def __init__(self, response_id: str, created: int, model: str, plan: OutputPlan) -> None:
        self.rid = response_id
        self.created = created
        self.model = model
        self.plan = plan
        self.msg_id = "msg_" + uuid.uuid4().hex[:24]
        self.rs_id = "rs_" + uuid.uuid4().hex[:24]
        self.seq = 0
        self.msg_index = 1 if plan.n_reasoning else 0

    def _event(self, kind: str, data: dict[str, Any]) -> str:
        data = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {_dumps(data)}\n\n"

    def _shell(self, status: str) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": [],
        }

    def role(self) -> bytes:
        """response.created and the output items the deltas belong to."""
        out = self._event("response.created", {"response": self._shell("in_progress")})
        if self.plan.n_reasoning:
            item = {"id": self.rs_id, "type": "reasoning", "summary": []}
            out += self._event("response.output_item.added", {"output_index": 0, "item": item})
        item = {
            "id": self.msg_id,
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        out += self._event("response.output_item.added", {"output_index": self.msg_index, "item": item})
        return out.encode()

    def opening(self) -> bytes:
        return self.role()

    def token(self, index: int) -> str:
        piece = token_piece(index)
        if index < self.plan.n_reasoning:
            return self._event(
                "response.reasoning_text.delta",
                {"item_id": self.rs_id, "output_index": 0, "content_index": 0, "delta": piece},
            )
        return self._event(
            "response.output_text.delta",
            {"item_id": self.msg_id, "output_index": self.msg_index, "content_index": 0, "delta": piece},
        )

    def tokens(self, first: int, n: int) -> str:
        """One delta event for the ``n`` tokens from ``first`` that one step produced (speculative
        decoding), a part each: ``response.reasoning_text.delta``, then ``response.output_text.delta``."""
        if n == 1:
            return self.token(first)
        parts = self.plan.run_parts(first, n)
        out = ""
        if parts.reasoning:
            out = self._event(
                "response.reasoning_text.delta",
                {"item_id": self.rs_id, "output_index": 0, "content_index": 0, "delta": parts.reasoning},
            )
        if parts.answer_from is not None:
            out += self._event(
                "response.output_text.delta",
                {
                    "item_id": self.msg_id,
                    "output_index": self.msg_index,
                    "content_index": 0,
                    "delta": parts.answer,
                },
            )
        return out

    def framed_token(self, index: int) -> bytes:
        return _chunk(self.token(index).encode())

    def completed(
        self, finish_reason: str | None, prompt: int, output: int, cached: int, with_usage: bool
    ) -> str:
        """response.completed (response.incomplete when the output hit max_output_tokens)."""
        body = full_object(
            self.rid, self.created, self.model, self.plan, finish_reason, prompt, cached, with_usage
        )
        for item in body["output"]:  # the deltas carried the text already
            for key in ("content", "summary"):
                if key in item:
                    item[key] = []
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return self._event(kind, {"response": body})

    def tail(
        self, finish_reason: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int, usage: bool
    ) -> str:
        """The end of a complete stream: response.completed carries the usage (``usage``); no [DONE]."""
        return self.completed(finish_reason, prompt_tokens, completion_tokens, cached_tokens, usage)

    def error(self, message: str, code: int = 500) -> str:
        return self._event("error", {"code": "server_error", "message": message, "param": None})

    def malformed(self) -> str:
        return 'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"x\n\n'


def full_object(
    response_id: str,
    created: int,
    model: str,
    plan: OutputPlan,
    finish_reason: str | None,
    prompt_tokens: int,
    cached_tokens: int = 0,
    with_usage: bool = True,
) -> dict[str, Any]:
    """A non-streaming Responses API object: a reasoning item (when any) and the assistant message."""
    output: list[dict[str, Any]] = []
    if plan.n_reasoning:
        text = plan.reasoning_text()
        output.append(
            {
                "id": "rs_" + response_id[-24:],
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": text}],
            }
        )
    output.append(
        {
            "id": "msg_" + response_id[-24:],
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": plan.answer_text(), "annotations": []}],
        }
    )
    status = "completed" if finish_reason != "length" else "incomplete"
    out: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": model,
        "output": output,
    }
    if with_usage:
        out["usage"] = _usage(prompt_tokens, plan.target, cached_tokens, plan.n_reasoning)
    return out
