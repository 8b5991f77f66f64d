"""OpenAI wire shapes the simulated server speaks: request parsing, SSE chunks, full responses."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from loadtest.sim.reference import RecordedAnswer
from loadtest.tokens.tokenizer import Tokenizer
from loadtest.workload.text import TOKEN_PIECES, token_piece

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
DONE_EVENT = b"data: [DONE]\n\n"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _chunk(body: bytes) -> bytes:
    """One chunk of an HTTP/1.1 chunked body."""
    return b"%x\r\n%b\r\n" % (len(body), body)


class RequestError(Exception):
    """A request the server rejects with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": "invalid_request_error",
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class GenRequest:
    """The fields of a (chat) completion request the engine cares about."""

    chat: bool
    prompt_tokens: int
    stream: bool
    include_usage: bool
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    model: str | None
    prompt_ids: list[int] = field(default_factory=list, repr=False)
    reasoning_effort: str | None = None
    tool_name: str | None = None  # the function to call: tools given and tool_choice not "none"
    api: str = "chat"  # chat, completions or responses: the wire shape of the answer


def _opt_int(body: dict[str, Any], *names: str, minimum: int) -> int | None:
    for name in names:
        v = body.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise RequestError(400, f"'{name}' must be an integer >= {minimum}", "invalid_value", name)
        return v
    return None


def _prompt_ids(prompt: Any, tok: Tokenizer) -> list[int]:
    if isinstance(prompt, str):
        return tok.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return list(prompt)  # token ids
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return [i for p in prompt for i in tok.encode(p)]  # several prompts are simulated as one
    raise RequestError(
        400, "'prompt' must be a string, a list of strings or a list of token ids", "invalid_value", "prompt"
    )


def _tool_name(body: dict[str, Any]) -> str | None:
    """The function a tool-calling request will call: tool_choice's, else the first tool's."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestError(400, "'tools' must be a list of objects", "invalid_value", "tools")
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if isinstance(name, str) and name:
            return name
    fn = tools[0].get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) and name else "function"


def json_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; RequestError (400, invalid_json) when it is not one."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"request body is not valid JSON: {e}", "invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object", "invalid_json")
    return body


def parse_request(body: dict[str, Any], chat: bool, tok: Tokenizer) -> GenRequest:
    """Validate a request body (decoded by ``json_body``); raises RequestError (400) on malformed input."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError(
                400,
                "'messages' is required and must be a non-empty list of objects",
                "missing_required_parameter",
                "messages",
            )
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        ids = tok.encode_request(messages, tools)
    else:
        if "prompt" not in body:
            raise RequestError(400, "'prompt' is required", "missing_required_parameter", "prompt")
        ids = _prompt_ids(body["prompt"], tok)
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = _opt_int(body, *names, minimum=1)
    min_tokens = _opt_int(body, "min_tokens", minimum=0) or 0
    opts = body.get("stream_options") or {}
    model = body.get("model")
    effort = body.get("reasoning_effort")
    return GenRequest(
        chat=chat,
        prompt_tokens=len(ids),
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        model=model if isinstance(model, str) else None,
        prompt_ids=ids,
        reasoning_effort=str(effort) if chat and effort is not None else None,
        tool_name=_tool_name(body) if chat else None,
    )


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, reasoning_tokens: int | None = None
) -> dict[str, Any]:
    """The usage object; completion_tokens_details only for reasoning outputs."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


@dataclass(frozen=True, slots=True)
class RunParts:
    """One step's tokens of a stream (speculative decoding), as one event per part: the reasoning text
    (empty: none), the run's first answer token's index within the answer (None: no answer tokens) and
    the answer part's text (the tool call's argument fragments for a tool call)."""

    reasoning: str
    answer_from: int | None
    answer: str


@dataclass(frozen=True)
class OutputPlan:
    """How one response's output tokens split: reasoning first, then the answer or a tool call."""

    target: int
    n_reasoning: int = 0
    reasoning: bool = False
    tool_name: str | None = None
    tool_id: str = ""
    reference: str | None = None  # reference-answer mode: the whole answer's text (sim/reference.py)
    recorded: RecordedAnswer | None = None  # recorded-answer mode: the recorded message (sim/reference.py)

    @classmethod
    def make(
        cls, target: int, reasoning_fraction: float | None, tool_name: str | None, tool_id: str
    ) -> OutputPlan:
        """``reasoning_fraction`` None: no reasoning; else that share (at least 1, answer keeps 1)."""
        n = 0
        if reasoning_fraction is not None:
            n = max(1, round(reasoning_fraction * target))
            n = min(n, target - 1) if target > 1 else int(tool_name is None)
        return cls(target, n, reasoning_fraction is not None, tool_name, tool_id)

    @property
    def n_answer(self) -> int:
        return self.target - self.n_reasoning

    def tool_fragment(self, j: int) -> str:
        """The j-th argument fragment: a JSON object with one fragment per output token."""
        n = self.n_answer
        if n <= 2:
            return ("{}", " ")[j]
        if j < 3:
            return ('{"', "text", '":"')[j] if n > 3 else ('{"', "text", '":""}')[j]
        return '"}' if j == n - 1 else token_piece(j)

    def reasoning_text(self) -> str:
        return "".join(token_piece(i) for i in range(self.n_reasoning))

    def run_parts(self, first: int, n: int) -> RunParts:
        """The ``n`` tokens from ``first`` that one step produced, split as a stream writes them: the
        reasoning part's text and the answer part's (text, or the tool call's argument fragments)."""
        end = first + n
        stop = min(end, self.n_reasoning) if first < self.n_reasoning else first
        reasoning = "".join(token_piece(i) for i in range(first, stop))
        if stop >= end:
            return RunParts(reasoning, None, "")
        j0, j1 = stop - self.n_reasoning, end - self.n_reasoning
        if self.tool_name is not None:
            answer = "".join(self.tool_fragment(j) for j in range(j0, j1))
        else:
            answer = "".join(token_piece(i) for i in range(stop, end))
        return RunParts(reasoning, j0, answer)

    def answer_text(self) -> str:
        if self.recorded is not None:
            return self.recorded.message.get("content") or ""
        if self.reference is not None:
            return self.reference
        if self.tool_name is not None:
            return "".join(self.tool_fragment(j) for j in range(self.n_answer))
        return "".join(token_piece(i) for i in range(self.n_reasoning, self.target))


# The plan of a response without one: all answer tokens, no tool call (``run_parts`` reads no more).
_PLAIN = OutputPlan(0)


class ChunkWriter:
    """Pre-rendered SSE event bytes for one streamed response (chat or text completion)."""

    def __init__(
        self, chat: bool, response_id: str, created: int, model: str, plan: OutputPlan | None = None
    ) -> None:
        self.chat = chat
        self.plan = plan
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = f'data: {{"id":{_dumps(response_id)},"object":"{obj}","created":{created},"model":{_dumps(model)},'
        if chat:
            self._tok_pre = self._head + '"choices":[{"index":0,"delta":{"content":'
            self._tok_post = '},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._tok_pre = self._head + '"choices":[{"index":0,"text":'
            self._tok_post = ',"logprobs":null,"finish_reason":null}]}\n\n'
        self._delta_pre = self._head + '"choices":[{"index":0,"delta":'
        self._framed: list[bytes] | None = None

    def framed_token(self, index: int) -> bytes:
        """``token(index)`` as one HTTP/1.1 chunk; plain answer tokens come from a per-response cache."""
        p = self.plan
        if p is None or (index >= p.n_reasoning and p.tool_name is None and p.recorded is None):
            if self._framed is None:  # plain answer tokens only: reasoning and tool tokens differ
                self._framed = [
                    _chunk((self._tok_pre + _dumps(piece) + self._tok_post).encode())
                    for piece in TOKEN_PIECES
                ]
            return self._framed[index % len(TOKEN_PIECES)]
        return _chunk(self.token(index).encode())

    def role(self) -> bytes:
        """The chat stream's first event: the assistant role with an empty content fragment."""
        return (
            self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}\n\n'
        ).encode()

    def opening(self) -> bytes:
        """The events before the first token: the role event of a chat stream, none for text completions."""
        return self.role() if self.chat else b""

    def _delta(self, delta: dict[str, Any]) -> str:
        return self._delta_pre + _dumps(delta) + self._tok_post[1:]

    def token(self, index: int) -> str:
        """The event carrying output token ``index`` (reasoning, content or a tool-call fragment)."""
        p = self.plan
        if p is not None and p.recorded is not None:
            return self._delta(p.recorded.deltas[index])
        if p is None or (index >= p.n_reasoning and p.tool_name is None):
            return self._tok_pre + _dumps(token_piece(index)) + self._tok_post
        if index < p.n_reasoning:
            piece = token_piece(index)
            # Both names: reasoning_content (DeepSeek, SGLang, older vLLM) and reasoning (newer vLLM).
            return self._delta({"reasoning_content": piece, "reasoning": piece})
        j = index - p.n_reasoning
        fn: dict[str, Any] = {"arguments": p.tool_fragment(j)}
        call: dict[str, Any] = {"index": 0, "function": fn}
        if j == 0:
            return self._tool_opening() + self._delta({"tool_calls": [call]})
        return self._delta({"tool_calls": [call]})

    def _tool_opening(self) -> str:
        """The tool call's first event: its id, type and name, with empty arguments."""
        p = self.plan
        assert p is not None  # only plans with a tool call have one
        call = {
            "index": 0,
            "id": p.tool_id,
            "type": "function",
            "function": {"name": p.tool_name, "arguments": ""},
        }
        return self._delta({"tool_calls": [call]})

    def tokens(self, first: int, n: int) -> str:
        """One event for the ``n`` tokens from ``first`` that one step produced (speculative decoding),
        as vLLM streams them: the reasoning part and the answer part each one delta of joined text."""
        if n == 1 or (self.plan is not None and self.plan.recorded is not None):
            # a recorded answer's deltas are its own pieces: each one its event, written together
            return "".join([self.token(i) for i in range(first, first + n)])
        p = self.plan or _PLAIN
        parts = p.run_parts(first, n)
        out: list[str] = []
        if parts.reasoning:
            piece = parts.reasoning
            out.append(self._delta({"reasoning_content": piece, "reasoning": piece}))
        if parts.answer_from is not None:
            if p.tool_name is None:
                out.append(self._tok_pre + _dumps(parts.answer) + self._tok_post)
            else:
                if parts.answer_from == 0:  # the call's opening event, then the fragments
                    out.append(self._tool_opening())
                args = {"tool_calls": [{"index": 0, "function": {"arguments": parts.answer}}]}
                out.append(self._delta(args))
        return "".join(out)

    def finish(self, reason: str) -> str:
        if self.chat:
            return (
                self._head
                + f'"choices":[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"{reason}"}}]}}\n\n'
            )
        return (
            self._head
            + f'"choices":[{{"index":0,"text":"","logprobs":null,"finish_reason":"{reason}"}}]}}\n\n'
        )

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> str:
        reasoning = self.plan.n_reasoning if self.plan is not None and self.plan.reasoning else None
        u = usage(prompt_tokens, completion_tokens, cached_tokens, reasoning)
        return self._head + f'"choices":[],"usage":{_dumps(u)}}}\n\n'

    def tail(
        self, finish_reason: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int, usage: bool
    ) -> str:
        """The end of a complete stream: the finish event, the usage event (``usage``), [DONE]."""
        parts = [self.finish(finish_reason)]
        if usage:
            parts.append(self.usage(prompt_tokens, completion_tokens, cached_tokens))
        return "".join(parts) + DONE_EVENT.decode()

    def malformed(self) -> str:
        """An event whose data is not valid JSON (cut off mid-object)."""
        return self._tok_pre + '"' + token_piece(0).strip() + "\n\n"

    @staticmethod
    def error(message: str, code: int = 500) -> str:
        """A mid-stream error frame."""
        return (
            "data: "
            + _dumps({"error": {"message": message, "type": "server_error", "param": None, "code": code}})
            + "\n\n"
        )


def full_response(
    chat: bool,
    response_id: str,
    created: int,
    model: str,
    plan: OutputPlan,
    finish_reason: str | None,
    prompt_tokens: int,
    cached_tokens: int = 0,
    with_usage: bool = True,
) -> dict[str, Any]:
    """A non-streaming chat.completion or text_completion object."""
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": plan.answer_text()}
        if plan.reasoning:
            message["reasoning_content"] = message["reasoning"] = plan.reasoning_text()
        if plan.recorded is not None:
            message = {"role": "assistant", **plan.recorded.message}
        elif plan.tool_name is not None:
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": plan.tool_id,
                    "type": "function",
                    "function": {"name": plan.tool_name, "arguments": plan.answer_text()},
                }
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    else:
        choice = {"index": 0, "text": plan.answer_text(), "logprobs": None, "finish_reason": finish_reason}
    out: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if with_usage:
        reasoning = plan.n_reasoning if plan.reasoning else None
        out["usage"] = usage(prompt_tokens, plan.target, cached_tokens, reasoning)
    return out
