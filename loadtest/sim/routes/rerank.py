"""POST /v1/rerank (the Cohere/Jina shape vLLM serves): a query and documents in, each query+document pair
prefilled by the engine (a cross-encoder's pass); the scores sorted, the first top_n (docs/sources.md §10)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from loadtest.sim.protocol import OutputPlan, RequestError
from loadtest.sim.routes.base import Answer, EngineRequest, Flow, PrefillRequest, StreamWriter
from loadtest.tokens.tokenizer import Tokenizer

RERANK_PATH = "/v1/rerank"


@dataclass(frozen=True)
class RerankRequest(PrefillRequest):
    documents: list[str]
    top_n: int | None
    return_documents: bool


def _document(d: Any) -> str:
    """A document: a string, or an object with its ``text``."""
    if isinstance(d, dict) and isinstance(d.get("text"), str):
        return d["text"]
    if isinstance(d, str):
        return d
    raise RequestError(400, "'documents' must be strings or {text} objects", "invalid_value", "documents")


def parse_rerank_request(body: dict[str, Any], tok: Tokenizer) -> RerankRequest:
    """The pairs to prefill (query ids + document ids, one per document), top_n, return_documents."""
    query, docs = body.get("query"), body.get("documents")
    if not isinstance(query, str) or not query:
        raise RequestError(
            400, "'query' is required: a non-empty string", "missing_required_parameter", "query"
        )
    if not isinstance(docs, list) or not docs:
        raise RequestError(
            400, "'documents' is required: a non-empty list", "missing_required_parameter", "documents"
        )
    texts = [_document(d) for d in docs]
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise RequestError(400, "'top_n' must be an integer >= 1", "invalid_value", "top_n")
    q = tok.encode(query)
    model = body.get("model")
    return RerankRequest(
        [q + (tok.encode(t) or [0]) for t in texts],
        model if isinstance(model, str) else None,
        texts,
        top_n,
        body.get("return_documents", True) is not False,
    )


def score(ids: list[int]) -> float:
    """A deterministic relevance score in [0, 1) for one query+document pair."""
    digest = hashlib.blake2b(str(ids).encode(), digest_size=8).digest()
    return round(int.from_bytes(digest, "big") / 2**64, 6)


def rerank_body(req: RerankRequest, response_id: str, model: str) -> dict[str, Any]:
    scored = sorted(((score(ids), k) for k, ids in enumerate(req.inputs)), key=lambda s: (-s[0], s[1]))
    results = []
    for s, k in scored[: req.top_n or len(scored)]:
        r: dict[str, Any] = {"index": k, "relevance_score": s}
        if req.return_documents:
            r["document"] = {"text": req.documents[k]}
        results.append(r)
    n = sum(len(i) for i in req.inputs)
    return {"id": response_id, "model": model, "usage": {"total_tokens": n}, "results": results}


class RerankRoute:
    api = "rerank"
    path = RERANK_PATH
    id_prefix = "rerank-"
    flow: Flow = "prefill"

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> RerankRequest:
        return parse_rerank_request(body, tok)

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> StreamWriter:
        raise NotImplementedError("rerank answers are never streamed")

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        assert isinstance(req, RerankRequest)
        return rerank_body(req, answer.response_id, answer.model)
