"""POST /v1/chat/completions: messages in; chat.completion.chunk events or one chat.completion object."""

from __future__ import annotations

from typing import Any

from loadtest.sim.protocol import CHAT_PATH, ChunkWriter, GenRequest, OutputPlan, full_response, parse_request
from loadtest.sim.routes.base import Answer, EngineRequest, Flow
from loadtest.tokens.tokenizer import Tokenizer


class ChatRoute:
    api = "chat"
    path = CHAT_PATH
    id_prefix = "chatcmpl-"
    flow: Flow = "generate"
    chat = True  # the chat shapes (messages, deltas); False: text completions

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> GenRequest:
        return parse_request(body, self.chat, tok)

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> ChunkWriter:
        return ChunkWriter(self.chat, response_id, created, model, plan)

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        a = answer
        assert a.plan is not None  # a generated answer
        return full_response(
            self.chat,
            a.response_id,
            a.created,
            a.model,
            a.plan,
            a.finish_reason,
            a.prompt_tokens,
            a.cached_tokens,
            with_usage=a.with_usage,
        )
