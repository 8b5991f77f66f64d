"""OpenAI wire shapes the simulated server speaks: request parsing, SSE chunks, full responses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loadtest.workload.text import token_piece
from loadtest.workload.tokenizer import Tokenizer

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
DONE_EVENT = b"data: [DONE]\n\n"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


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


def _opt_int(body: dict[str, Any], *names: str, minimum: int) -> int | None:
    for name in names:
        v = body.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise RequestError(400, f"'{name}' must be an integer >= {minimum}", "invalid_value", name)
        return v
    return None


def _count_prompt(prompt: Any, tok: Tokenizer) -> int:
    if isinstance(prompt, str):
        return tok.count(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return len(prompt)  # token ids
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return sum(tok.count(p) for p in prompt)  # several prompts are simulated as one
    raise RequestError(
        400, "'prompt' must be a string, a list of strings or a list of token ids", "invalid_value", "prompt"
    )


def parse_request(raw: bytes, chat: bool, tok: Tokenizer) -> GenRequest:
    """Validate a request body; raises RequestError (400) on malformed input."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"request body is not valid JSON: {e}", "invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object", "invalid_json")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError(
                400,
                "'messages' is required and must be a non-empty list of objects",
                "missing_required_parameter",
                "messages",
            )
        prompt_tokens = tok.count_chat(messages)
    else:
        if "prompt" not in body:
            raise RequestError(400, "'prompt' is required", "missing_required_parameter", "prompt")
        prompt_tokens = _count_prompt(body["prompt"], tok)
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = _opt_int(body, *names, minimum=1)
    min_tokens = _opt_int(body, "min_tokens", minimum=0) or 0
    opts = body.get("stream_options") or {}
    model = body.get("model")
    return GenRequest(
        chat=chat,
        prompt_tokens=prompt_tokens,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        model=model if isinstance(model, str) else None,
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class ChunkWriter:
    """Pre-rendered SSE event bytes for one streamed response (chat or text completion)."""

    def __init__(self, chat: bool, response_id: str, created: int, model: str) -> None:
        self.chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = f'data: {{"id":{_dumps(response_id)},"object":"{obj}","created":{created},"model":{_dumps(model)},'
        if chat:
            self._tok_pre = self._head + '"choices":[{"index":0,"delta":{"content":'
            self._tok_post = '},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._tok_pre = self._head + '"choices":[{"index":0,"text":'
            self._tok_post = ',"logprobs":null,"finish_reason":null}]}\n\n'

    def role(self) -> bytes:
        """The chat stream's first event: the assistant role with an empty content fragment."""
        return (
            self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}\n\n'
        ).encode()

    def token(self, index: int) -> str:
        return self._tok_pre + _dumps(token_piece(index)) + self._tok_post

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

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        return self._head + f'"choices":[],"usage":{_dumps(usage(prompt_tokens, completion_tokens))}}}\n\n'


def full_response(
    chat: bool,
    response_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A non-streaming chat.completion or text_completion object."""
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }
