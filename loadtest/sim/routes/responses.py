"""POST /v1/responses: ``input`` in (served as chat messages); typed events or one ``response`` object
(wire shapes in sim/responses.py)."""

from __future__ import annotations

from typing import Any

from loadtest.sim.protocol import GenRequest, OutputPlan
from loadtest.sim.responses import RESPONSES_PATH, ResponsesWriter, full_object, parse_responses_request
from loadtest.sim.routes.base import Answer, EngineRequest, Flow
from loadtest.tokens.tokenizer import Tokenizer


class ResponsesRoute:
    api = "responses"
    path = RESPONSES_PATH
    id_prefix = "resp_"
    flow: Flow = "generate"

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> GenRequest:
        return parse_responses_request(body, tok)

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> ResponsesWriter:
        return ResponsesWriter(response_id, created, model, plan)

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        a = answer
        assert a.plan is not None  # a generated answer
        return full_object(
            a.response_id,
            a.created,
            a.model,
            a.plan,
            a.finish_reason,
            a.prompt_tokens,
            a.cached_tokens,
            with_usage=a.with_usage,
        )
