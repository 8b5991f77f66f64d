"""KServe v2 over gRPC in the embedded engine (``--grpc-port``): a grpc.aio server on the engine's loop
serving ``inference.GRPCInferenceService`` (ServerLive, ServerReady, ModelReady, ModelMetadata and
ModelInfer, the last as the REST route's timed compute pass: the same admission, device and truth;
docs/sources.md §21)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message
from multidict import CIMultiDict, CIMultiDictProxy

from loadtest.contracts import kserve_v2_pb2 as pb
from loadtest.sim import faults as F
from loadtest.sim.protocol import RequestError
from loadtest.sim.routes import ROUTES, Answer
from loadtest.sim.server import SimState, _finish, _model_ok, admit_compute, compute_pass
from loadtest.sim.truth import OUTCOME_CLIENT_DISCONNECTED

SERVICE = "inference.GRPCInferenceService"
INFER_PATH = f"/{SERVICE}/ModelInfer"  # the path the truth log and the request log name
# an HTTP status of the engine's errors and faults -> the gRPC status a v2 server answers with
STATUS_OF = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
FAULT_STATUS = {F.HTTP_429: 429, F.HTTP_503: 503}  # the other pre-engine faults: INTERNAL
# the contents list each datatype's values travel in (the request's are read from it)
CONTENTS = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT64": "int64_contents"}
CONTENTS |= dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents")
CONTENTS |= dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents")
CONTENTS |= {"UINT64": "uint64_contents", "BOOL": "bool_contents", "BYTES": "bytes_contents"}


@dataclass(frozen=True)
class Call:
    """A gRPC call as the request log and the fault pick read it: its path and its metadata as headers."""

    path: str
    headers: Mapping[str, str]


def _call(context: grpc.aio.ServicerContext) -> Call:
    md = CIMultiDict((k, v) for k, v in context.invocation_metadata() or () if isinstance(v, str))
    return Call(INFER_PATH, CIMultiDictProxy(md))


def infer_body(req: pb.ModelInferRequest) -> dict[str, Any]:
    """A ModelInfer request as the REST route's body: its id, model and input tensors (values from the
    datatype's contents list, or from the raw contents' byte count)."""
    inputs = []
    for i, t in enumerate(req.inputs):
        field = CONTENTS.get(t.datatype)
        data: list[Any] = list(getattr(t.contents, field)) if field else []
        if not data and i < len(req.raw_input_contents):  # raw bytes: their values, counted
            size = 8 if t.datatype in ("FP64", "INT64", "UINT64") else 4
            data = [0] * (len(req.raw_input_contents[i]) // size)
        inputs.append({"name": t.name, "shape": list(t.shape), "datatype": t.datatype, "data": data})
    return {"id": req.id, "model": req.model_name, "inputs": inputs}


def infer_response(answer: dict[str, Any]) -> pb.ModelInferResponse:
    """The REST route's whole answer as a ModelInferResponse (each output's values in its contents)."""
    out = pb.ModelInferResponse(model_name=answer.get("model_name", ""), id=answer.get("id", ""))
    for t in answer["outputs"]:
        tensor = out.outputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        getattr(tensor.contents, CONTENTS[t["datatype"]]).extend(t["data"])
    return out


class KServeService:
    """The service's handlers over the engine's shared state."""

    def __init__(self, st: SimState) -> None:
        self.st = st
        self.route = ROUTES["kserve_v2"]

    async def server_live(self, req: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, req: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def model_ready(self, req: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=_model_ok(self.st.config, req.name))

    async def model_metadata(
        self, req: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        if not _model_ok(self.st.config, req.name):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"The model `{req.name}` does not exist.")
        meta = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=self.st.config.model_name,
            platform="loadtest-sim",
            inputs=[meta(name="features", datatype="FP32", shape=[-1, -1])],
            outputs=[meta(name="scores", datatype="FP32", shape=[-1, 1])],
        )

    async def model_infer(
        self, req: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        """One timed pass on the device, as the REST route's; an error or fault is a gRPC status."""
        arrival_ns = time.perf_counter_ns()
        st, call = self.st, _call(context)
        body = infer_body(req)
        admitted = admit_compute(st, self.route, call, req.SerializeToString(), body, arrival_ns)
        if isinstance(admitted, RequestError):
            await context.abort(STATUS_OF.get(admitted.status, grpc.StatusCode.INTERNAL), admitted.message)
        assert not isinstance(admitted, RequestError)
        c, fault, rec, client_id = admitted
        try:
            if fault is not None and fault.kind in F.PRE_ENGINE:
                rec.fault = rec.outcome = fault.kind
                status = STATUS_OF.get(FAULT_STATUS.get(fault.kind, 500), grpc.StatusCode.INTERNAL)
                await context.abort(status, f"Injected fault {fault.kind}")
            await compute_pass(st, c, rec)
            if client_id:
                context.set_trailing_metadata((("x-request-id", client_id),))
            answer = Answer(rec.response_id, int(time.time()), st.config.model_name, "stop", 0)
            rec.finish_reason = "stop"
            return infer_response(self.route.whole(c, answer))
        except BaseException:
            if rec.outcome == "ok" and not rec.fault:  # the client went away (the call cancelled)
                rec.outcome = OUTCOME_CLIENT_DISCONNECTED
            raise
        finally:
            rec.done_ns = time.perf_counter_ns()
            _finish(st, rec, submitted=rec.outcome == "ok")


def _unary(
    fn: Callable[[Any, Any], Awaitable[Message]], request_type: type[Message]
) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=request_type.FromString,
        response_serializer=lambda m: m.SerializeToString(),
    )


async def start_grpc(st: SimState, host: str, port: int) -> grpc.aio.Server:
    """The service on ``host:port`` (0: a free port), started; the bound port in ``st.grpc_port``."""
    svc = KServeService(st)
    handlers = {
        "ServerLive": _unary(svc.server_live, pb.ServerLiveRequest),
        "ServerReady": _unary(svc.server_ready, pb.ServerReadyRequest),
        "ModelReady": _unary(svc.model_ready, pb.ModelReadyRequest),
        "ModelMetadata": _unary(svc.model_metadata, pb.ModelMetadataRequest),
        "ModelInfer": _unary(svc.model_infer, pb.ModelInferRequest),
    }
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 2**20)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    shown = f"[{host}]" if ":" in host else host
    st.grpc_port = server.add_insecure_port(f"{shown}:{port}")
    await server.start()
    return server
