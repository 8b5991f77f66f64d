"""The rerank API (``api: rerank``, POST /v1/rerank, the Cohere/Jina shape vLLM serves): a query and
documents in, one relevance score per returned document out; latency only, like embeddings."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import msgspec

from loadtest.client.adapters.base import JsonAdapter, done_time
from loadtest.client.http import Response
from loadtest.client.secrets import snippet
from loadtest.client.usage_counts import UsageCounts

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord


class _Result(msgspec.Struct, gc=False):
    index: int
    relevance_score: float


class _Usage(UsageCounts):
    total_tokens: int | None = None
    prompt_tokens: int | None = None


class _Answer(msgspec.Struct, gc=False):
    results: list[_Result] | None = None
    usage: _Usage | None = None
    error: dict | str | None = None


_decoder = msgspec.json.Decoder(_Answer)


class RerankAdapter(JsonAdapter):
    names: ClassVar[tuple[str, ...]] = ("rerank",)
    route: ClassVar[str] = "/rerank"

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        rec.done_ns = done_time(resp)
        docs = req.body.get("documents")
        n_docs = len(docs) if isinstance(docs, list) else 0
        rec.inputs = n_docs
        top_n = req.body.get("top_n")
        want = min(top_n, n_docs) if isinstance(top_n, int) and top_n > 0 else n_docs
        read_results(rec, resp, n_docs, want)


def read_results(rec: RequestRecord, resp: Response, n_docs: int, want: int) -> None:
    """The results of a request of ``n_docs`` documents that asked for ``want`` of them back."""
    if resp.broken:
        rec.outcome, rec.error = resp.broken_outcome, resp.broken
        return
    try:
        ans = _decoder.decode(resp.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        rec.outcome, rec.error = "protocol_error", f"not a rerank answer: {snippet(resp.body)}"
        return
    if ans.error:
        rec.outcome, rec.error = "stream_error", f"error in a 200 answer: {snippet(resp.body)}"
        return
    if ans.results is None:
        rec.outcome, rec.error = "protocol_error", f"not a rerank answer (no results): {snippet(resp.body)}"
        return
    bad = [r.index for r in ans.results if not 0 <= r.index < n_docs]
    if len(ans.results) != want or bad or len({r.index for r in ans.results}) != len(ans.results):
        rec.outcome = "protocol_error"
        rec.error = f"{len(ans.results)} result(s) for {want} asked of {n_docs} document(s), indexes {bad or 'repeated'}"
        return
    u = ans.usage
    if u is not None:
        rec.prompt_tokens_server = u.prompt_tokens if u.prompt_tokens is not None else u.total_tokens
    rec.finish_reason = "stop"
    rec.outcome = "ok"
