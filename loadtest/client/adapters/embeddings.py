"""The embeddings API (``api: embeddings``, POST /v1/embeddings): inputs in, one vector per input out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from loadtest.client.adapters.base import JsonAdapter, count_at, done_time, json_object, obj_at
from loadtest.client.http import Response
from loadtest.client.secrets import snippet

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord


class EmbeddingsAdapter(JsonAdapter):
    names: ClassVar[tuple[str, ...]] = ("embeddings",)
    route: ClassVar[str] = "/embeddings"

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        rec.done_ns = done_time(resp)
        self.read_list(rec, resp, req.body.get("input"))

    @staticmethod
    def read_list(rec: RequestRecord, resp: Response, inputs: Any) -> None:
        """The embeddings list of a request that carried ``inputs`` (its body's ``input``)."""
        n_in = len(inputs) if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else 1
        rec.inputs = n_in
        obj = json_object(rec, resp)
        if obj is None:
            return
        data = obj.get("data")
        if not isinstance(data, list) or not all(isinstance(d, dict) and "embedding" in d for d in data):
            rec.outcome, rec.error = "protocol_error", f"not an OpenAI embeddings list: {snippet(resp.body)}"
            return
        if len(data) != n_in:
            rec.outcome, rec.error = (
                "protocol_error",
                f"{len(data)} embedding(s) returned for {n_in} input(s)",
            )
            return
        rec.prompt_tokens_server = count_at(obj_at(obj, "usage"), "prompt_tokens")
        rec.finish_reason = "stop"
        rec.outcome = "ok"
