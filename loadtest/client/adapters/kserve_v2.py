"""KServe v2 / Open Inference Protocol inference (``api: kserve_v2``, POST /v2/models/{model}/infer): JSON
input tensors in, output tensors out, one whole answer; latency is end to end (docs/sources.md §21)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from loadtest.client.adapters.base import JsonAdapter, done_time, json_encoder, json_object, list_at
from loadtest.client.http import Endpoint, Response
from loadtest.client.secrets import snippet

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord

INFER_PATH = "/v2/models/{model}/infer"  # {model}: the client's model (client/openai.py fills it in)
DATATYPES = frozenset(
    {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
    | {"FP16", "FP32", "FP64", "BF16", "BYTES"}
)


class KServeV2Adapter(JsonAdapter):
    names: ClassVar[tuple[str, ...]] = ("kserve_v2",)

    def path(self, endpoint: Endpoint, req: PreparedRequest) -> str:
        """The host's own path when it fixes one, else the protocol's path from the host's root."""
        return (endpoint.fixed_path or INFER_PATH) + endpoint.query

    def body(self, client: OpenAIClient, req: PreparedRequest) -> bytes:
        return json_encoder.encode({"id": req.request_id, **req.body})  # the model is in the path

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        rec.done_ns = done_time(resp)
        rec.inputs = samples_of(req.body)
        read_outputs(rec, resp, rec.inputs)


def samples_of(body: dict[str, Any]) -> int:
    """The samples a request carries: its first input tensor's first dimension (1 for a scalar)."""
    inputs = list_at(body, "inputs")
    shape = inputs[0].get("shape") if inputs and isinstance(inputs[0], dict) else None
    first = shape[0] if isinstance(shape, list) and shape else 1
    return first if isinstance(first, int) and first > 0 else 1


def _tensor_problem(t: Any, samples: int) -> str | None:
    """Why ``t`` is not an output tensor of ``samples`` samples, or None when it is one."""
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        return "an output is not a {name, shape, datatype, data} object"
    data = t.get("data")
    if t.get("datatype") in DATATYPES and not isinstance(data, list):
        return f"output {t['name']!r}: data is not a list"
    count = _flat_len(data) if isinstance(data, list) else 0
    return tensor_problem(t["name"], t.get("shape"), t.get("datatype"), count, samples)


def tensor_problem(name: str, shape: Any, dtype: Any, count: int, samples: int) -> str | None:
    """Why an output tensor (its name, shape, datatype and number of values) is not whole for ``samples``
    samples, or None; shared by the REST and gRPC adapters."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return f"output {name!r}: shape is not a list of dimensions"
    if dtype not in DATATYPES:
        return f"output {name!r}: unknown datatype {str(dtype)[:20]!r}"
    size = 1
    for d in shape:
        size *= d
    if count != size:
        return f"output {name!r}: {count} value(s) for shape {shape}"
    if shape and shape[0] != samples:
        return f"output {name!r}: {shape[0]} row(s) for {samples} sample(s)"
    return None


def _flat_len(data: list[Any]) -> int:
    """The number of values in a tensor's data, flat or nested row by row."""
    return sum(_flat_len(d) if isinstance(d, list) else 1 for d in data)


def read_outputs(rec: RequestRecord, resp: Response, samples: int) -> None:
    """An inference answer of a request of ``samples`` samples: ``outputs``, each tensor whole."""
    obj = json_object(rec, resp)
    if obj is None:
        return
    outputs = obj.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        rec.outcome, rec.error = (
            "protocol_error",
            f"not a v2 inference answer (no outputs): {snippet(resp.body)}",
        )
        return
    for t in outputs:
        if problem := _tensor_problem(t, samples):
            rec.outcome, rec.error = "protocol_error", problem
            return
    rec.finish_reason = "stop"
    rec.outcome = "ok"
