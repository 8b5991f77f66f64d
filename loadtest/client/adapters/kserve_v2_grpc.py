"""KServe v2 / Open Inference Protocol over gRPC (``api: kserve_v2_grpc``): one unary ``ModelInfer`` call of
``inference.GRPCInferenceService`` on the host's ``grpc://host:port``, the REST adapter's tensors in
``contents``; latency is the call's end to end time; a gRPC status is an endpoint outcome (docs/sources.md
§21, docs/api-surface.md "KServe v2 over gRPC")."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, ClassVar

# a process with gRPC channels may still start children (workers, the engine): grpcio's fork handlers would
# run in each between fork and exec and can abort it
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402
from google.protobuf.message import DecodeError

from loadtest.client.adapters.base import CAP_UNLIMITED_BYTES, json_encoder
from loadtest.client.adapters.kserve_v2 import samples_of, tensor_problem
from loadtest.client.http import Endpoint, Response
from loadtest.client.secrets import snippet
from loadtest.client.unreadable import mark_unreadable
from loadtest.contracts import kserve_v2_pb2 as pb

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient, PreparedRequest
    from loadtest.client.record import RequestRecord

SCHEME = "grpc"
SERVICE = "/inference.GRPCInferenceService/"
INFER = SERVICE + "ModelInfer"
# The contents list that carries each datatype's values (FP16 and BF16 come as raw bytes only).
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
ITEM_BYTES = {"BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BF16": 2}
ITEM_BYTES |= {"INT32": 4, "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8}
# gRPC status -> outcome, as google.rpc.Code maps each status to an HTTP status (docs/sources.md §21)
OUTCOME_OF = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: "http_429",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.INVALID_ARGUMENT: "http_4xx",
    grpc.StatusCode.NOT_FOUND: "http_4xx",
    grpc.StatusCode.ALREADY_EXISTS: "http_4xx",
    grpc.StatusCode.PERMISSION_DENIED: "http_4xx",
    grpc.StatusCode.UNAUTHENTICATED: "http_4xx",
    grpc.StatusCode.FAILED_PRECONDITION: "http_4xx",
    grpc.StatusCode.OUT_OF_RANGE: "http_4xx",
    grpc.StatusCode.ABORTED: "http_4xx",
    grpc.StatusCode.CANCELLED: "stream_error",  # the server (or the network) ended the call
}
# metadata a gRPC call may not carry (the transport's own) or does not need (HTTP content negotiation)
_NOT_METADATA = frozenset({"content-type", "accept", "accept-encoding", "te", "host", "connection"})
_gevent_ready = threading.Lock()
_gevent_done: list[bool] = []


def use_gevent() -> None:
    """grpcio's gevent integration, once per process, before its first channel, when gevent has patched
    the process (Locust's users): a call then waits in its own greenlet, never blocking the loop."""
    with _gevent_ready:
        if _gevent_done:
            return
        _gevent_done.append(True)
        try:
            from gevent import monkey
        except ImportError:
            return
        if monkey.is_module_patched("socket"):
            from grpc.experimental import gevent as grpc_gevent

            grpc_gevent.init_gevent()


def open_channel(endpoint: Endpoint) -> grpc.Channel:
    """A plaintext HTTP/2 channel to the endpoint's host and port (no proxy: gRPC goes direct)."""
    use_gevent()
    options = [
        ("grpc.max_receive_message_length", CAP_UNLIMITED_BYTES),
        ("grpc.max_send_message_length", CAP_UNLIMITED_BYTES),
        ("grpc.enable_http_proxy", 0),
        ("grpc.enable_retries", 0),  # a retry would be a hidden second request
    ]
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    return grpc.insecure_channel(f"{host}:{endpoint.port}", options=options)


def server_ready(endpoint: Endpoint, timeout: float) -> str | None:
    """Why the gRPC server at ``endpoint`` is not ready (its ServerReady call), or None when it is."""
    channel = open_channel(endpoint)
    try:
        call = channel.unary_unary(
            SERVICE + "ServerReady",
            request_serializer=pb.ServerReadyRequest.SerializeToString,
            response_deserializer=pb.ServerReadyResponse.FromString,
        )
        ready = call(pb.ServerReadyRequest(), timeout=timeout).ready
    except grpc.RpcError as err:
        return status_outcome(err)[1]
    finally:
        channel.close()
    return None if ready else "ServerReady answered ready: false"


def status_outcome(err: grpc.RpcError) -> tuple[str, str]:
    """A failed call's outcome and error text: its status as an HTTP class (UNAVAILABLE before any answer
    a ``connect_error``), its details."""
    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (err.details() if isinstance(err, grpc.Call) else None) or ""
    outcome = OUTCOME_OF.get(code, "http_5xx")  # UNAVAILABLE, INTERNAL, UNKNOWN, UNIMPLEMENTED, DATA_LOSS
    low = details.lower()
    if code == grpc.StatusCode.UNAVAILABLE and ("failed to connect" in low or "connection refused" in low):
        outcome = "connect_error"
    name = code.name if isinstance(code, grpc.StatusCode) else str(code)
    return outcome, f"gRPC {name}: {' '.join(details.split())[:300]}"


def infer_request(model: str | None, req: PreparedRequest) -> pb.ModelInferRequest:
    """The ModelInfer request of ``req``: its id, the client's model, each input tensor's values in the
    contents list of its datatype."""
    msg = pb.ModelInferRequest(model_name=model or "", id=req.request_id)
    for t in req.body.get("inputs") or ():
        dtype = str(t.get("datatype", ""))
        tensor = msg.inputs.add(name=str(t.get("name", "")), datatype=dtype, shape=list(t.get("shape") or ()))
        field = CONTENTS.get(dtype)
        if field is not None:
            getattr(tensor.contents, field).extend(t.get("data") or ())
    return msg


def _count(t: Any, raw: bytes | None) -> int | None:
    """The values an output tensor carries: in its raw bytes, else in its datatype's contents list."""
    if raw is not None:
        if t.datatype == "BYTES":  # each value: a 4-byte little-endian length, then its bytes
            n = at = 0
            while at + 4 <= len(raw):
                at += 4 + int.from_bytes(raw[at : at + 4], "little")
                n += 1
            return n if at == len(raw) else None
        size = ITEM_BYTES.get(t.datatype)
        return len(raw) // size if size and len(raw) % size == 0 else None
    field = CONTENTS.get(t.datatype)
    return len(getattr(t.contents, field)) if field else 0


def outputs_problem(resp: pb.ModelInferResponse, samples: int) -> str | None:
    """Why an answer is not a v2 inference answer for ``samples`` samples (each output whole), or None."""
    if not resp.outputs:
        return "not a v2 inference answer (no outputs)"
    raw: Sequence[bytes | None] = list(resp.raw_output_contents)
    if raw and len(raw) != len(resp.outputs):
        return f"{len(raw)} raw output(s) for {len(resp.outputs)} output(s)"
    for i, t in enumerate(resp.outputs):
        count = _count(t, raw[i] if raw else None)
        if count is None:
            return f"output {t.name!r}: raw contents do not fit datatype {t.datatype[:20]!r}"
        if problem := tensor_problem(t.name, list(t.shape), t.datatype, count, samples):
            return problem
    return None


class KServeV2GrpcAdapter:
    """Sends its requests itself (``exchange``) over one gRPC channel per client (a user's connection)."""

    names: ClassVar[tuple[str, ...]] = ("kserve_v2_grpc",)
    accept: ClassVar[str | None] = None
    capped_by_tokens: ClassVar[bool] = False
    default_headers: ClassVar[tuple[tuple[str, str], ...]] = ()

    def path(self, endpoint: Endpoint, req: PreparedRequest) -> str:
        return INFER

    def streams(self, req: PreparedRequest) -> bool:
        return False

    def body(self, client: OpenAIClient, req: PreparedRequest) -> bytes:
        return bytes(infer_request(client.model, req).SerializeToString())

    def classify(
        self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest, resp: Response
    ) -> None:
        read_answer(rec, resp.body, samples_of(req.body))

    def exchange(self, client: OpenAIClient, rec: RequestRecord, req: PreparedRequest) -> None:
        """One ModelInfer call: the request id and the client's headers as metadata, the read timeout (or
        the total one) as its deadline; never raises for what the server does."""
        channel = client.transport
        if channel is None:
            channel = client.transport = open_channel(client.endpoint)
        headers = client.request_headers(req, rec)
        metadata = [(k.lower(), v) for k, v in headers.items() if k.lower() not in _NOT_METADATA]
        rec.body_sent = json_encoder.encode({"id": req.request_id, **req.body})  # capture: readable
        rec.inputs = samples_of(req.body)
        call = channel.unary_unary(INFER)  # bytes in, bytes out: the answer is read here, whatever it is
        timeout = client.timeouts.total or client.timeouts.read
        body = self.body(client, req)
        rec.sent_ns = perf_counter_ns()
        try:
            answer = call(body, timeout=timeout, metadata=metadata)
        except grpc.RpcError as err:
            rec.done_ns = perf_counter_ns()
            rec.outcome, rec.error = status_outcome(err)
            return
        rec.done_ns = rec.headers_ns = perf_counter_ns()
        body = answer if isinstance(answer, bytes) else b""
        try:
            read_answer(rec, body, rec.inputs)
        except Exception as e:  # noqa: BLE001 - whatever a server sent, its request gets an endpoint outcome
            mark_unreadable(rec, e, body)


def read_answer(rec: RequestRecord, body: bytes, samples: int) -> None:
    """A ModelInfer answer's bytes into ``rec``: ok when it decodes and every output is whole, one row a
    sample; a ``protocol_error`` otherwise."""
    try:
        resp = pb.ModelInferResponse.FromString(body)
    except (DecodeError, ValueError, RecursionError) as e:
        rec.outcome, rec.error = "protocol_error", f"not a ModelInferResponse ({e}): {snippet(body)}"
        return
    if problem := outputs_problem(resp, samples):
        rec.outcome, rec.error = "protocol_error", problem
        return
    rec.finish_reason = "stop"
    rec.outcome = "ok"
