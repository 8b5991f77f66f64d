"""POST /v2/models/{model}/infer (KServe v2 / Open Inference Protocol, JSON): a recommender-like model's
batch of samples in, one score per sample out; served as one timed pass whose time a small cost model
gives, a fixed part plus a per-sample part (docs/sources.md §21)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from loadtest.sim.protocol import OutputPlan, RequestError
from loadtest.sim.routes.base import Answer, ComputeRequest, EngineRequest, Flow, StreamWriter
from loadtest.tokens.tokenizer import Tokenizer

INFER_PATH = "/v2/models/{model}/infer"
# The cost model at speedup 1: a pass's fixed time (launch, copies) and each sample's; 76 us a sample is
# one GPU's share of DLRMv3's Offline 104,637 samples/s on 8 GPUs (docs/sources.md §21).
FIXED_S = 0.5e-3
PER_SAMPLE_S = 76e-6
MAX_SAMPLES = 65536


@dataclass(frozen=True)
class InferRequest(ComputeRequest):
    request_id: str | None
    first: dict[str, Any]  # the first input tensor (name, shape, datatype)


def _bad(message: str, param: str = "inputs") -> RequestError:
    return RequestError(400, message, "invalid_value", param)


def parse_infer_request(body: dict[str, Any]) -> InferRequest:
    """The samples of a v2 request: its first input tensor's first dimension; shapes and data checked."""
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise _bad("'inputs' is required: a non-empty list of tensors")
    for t in inputs:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise _bad("each input is a {name, shape, datatype, data} object")
        shape, data = t.get("shape"), t.get("data")
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            raise _bad(f"input {t['name']!r}: shape must be a list of positive dimensions")
        if not isinstance(t.get("datatype"), str) or not isinstance(data, list):
            raise _bad(f"input {t['name']!r}: datatype (a string) and data (a list) are required")
        size = 1
        for d in shape:
            size *= d
        if len(data) != size:
            raise _bad(f"input {t['name']!r}: {len(data)} value(s) for shape {shape}")
    samples = inputs[0]["shape"][0]
    if samples > MAX_SAMPLES:
        raise _bad(f"at most {MAX_SAMPLES} samples a request")
    model, rid = body.get("model"), body.get("id")
    first = {k: inputs[0][k] for k in ("name", "shape", "datatype")}
    return InferRequest(
        samples,
        FIXED_S + PER_SAMPLE_S * samples,
        model if isinstance(model, str) else None,
        rid if isinstance(rid, str) else None,
        first,
    )


def scores(req: InferRequest, salt: str) -> list[float]:
    """A deterministic score in [0, 1) per sample."""
    digest = hashlib.blake2b(f"{salt}:{req.first}".encode(), digest_size=8).digest()
    seed = int.from_bytes(digest, "big")
    return [round(((seed * (k + 1)) % 1_000_003) / 1_000_003, 6) for k in range(req.samples)]


class KServeV2Route:
    api = "kserve_v2"
    path = INFER_PATH
    id_prefix = "infer-"
    flow: Flow = "compute"

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> InferRequest:
        return parse_infer_request(body)

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> StreamWriter:
        raise NotImplementedError("v2 inference answers are never streamed")

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        assert isinstance(req, InferRequest)
        out = {
            "name": "scores",
            "shape": [req.samples, 1],
            "datatype": "FP32",
            "data": scores(req, answer.response_id),
        }
        return {
            "model_name": answer.model,
            "id": req.request_id or answer.response_id,
            "outputs": [out],
        }
