"""POST /v1/embeddings: inputs in, each prefilled by the engine; one vector per input (wire shapes in
sim/embeddings.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadtest.sim.embeddings import EMBEDDINGS_PATH, embeddings_body, parse_embeddings_request
from loadtest.sim.protocol import OutputPlan
from loadtest.sim.routes.base import Answer, EngineRequest, Flow, PrefillRequest, StreamWriter
from loadtest.tokens.tokenizer import Tokenizer


@dataclass(frozen=True)
class EmbeddingsRequest(PrefillRequest):
    dimensions: int


class EmbeddingsRoute:
    api = "embeddings"
    path = EMBEDDINGS_PATH
    id_prefix = "embd-"
    flow: Flow = "prefill"

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> EmbeddingsRequest:
        inputs, model, dims = parse_embeddings_request(body, tok)
        return EmbeddingsRequest(inputs, model, dims)

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> StreamWriter:
        raise NotImplementedError("embeddings answers are never streamed")

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        assert isinstance(req, EmbeddingsRequest)
        return embeddings_body(req.inputs, answer.model, req.dimensions)
