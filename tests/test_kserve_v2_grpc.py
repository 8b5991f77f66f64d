"""KServe v2 over gRPC (``api: kserve_v2_grpc``): the ModelInfer request carries the REST adapter's tensors,
any answer bytes and any gRPC status become an endpoint outcome, runs against the embedded engine's gRPC
service match its truth, and calls from several gevent users overlap (docs/api-surface.md)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import locust  # noqa: F401 - gevent patches this process before grpcio starts, as in the suite's Locust tests
import pytest
from conftest import read_lines, run_cli, write_profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.client.adapters import adapter_for
from loadtest.client.adapters.kserve_v2_grpc import infer_request, read_answer, server_ready, use_gevent
from loadtest.client.http import Endpoint
from loadtest.client.openai import OpenAIClient, PreparedRequest, Timeouts
from loadtest.client.record import OUTCOMES, RequestRecord
from loadtest.contracts import kserve_v2_pb2 as pb
from loadtest.sim import SimProcess
from loadtest.sim.grpc_kserve import INFER_PATH
from loadtest.sim.routes.kserve_v2 import FIXED_S, PER_SAMPLE_S
from loadtest.tokens.tokenizer import get_tokenizer

use_gevent()  # before this process's first gRPC object: its servers and calls run as greenlets
TENSOR = {"name": "features", "shape": [3, 2], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]}
TOK = get_tokenizer("llama3")


def _req(rid: str = "r", tensor: dict[str, Any] = TENSOR) -> PreparedRequest:
    return PreparedRequest(rid, "kserve_v2_grpc", {"inputs": [tensor]}, 0, None, stream=False)


def _answer(**fields: Any) -> bytes:
    out = pb.ModelInferResponse(model_name="m")
    t = out.outputs.add(name="scores", datatype="FP32", shape=[3, 1])
    t.contents.fp32_contents.extend([0.1, 0.2, 0.3])
    for k, v in fields.items():
        setattr(out, k, v) if not isinstance(v, list) else getattr(out, k).extend(v)
    return bytes(out.SerializeToString())


def _read(body: bytes, samples: int = 3) -> RequestRecord:
    rec = RequestRecord("r", stream=False)
    read_answer(rec, body, samples)
    return rec


def _proto_fields(text: str) -> set[tuple[str, str, int]]:
    """(message, field, number) of every field the .proto declares, nested messages by their full name."""
    out: set[tuple[str, str, int]] = set()
    stack: list[str] = []  # the open braces: a message's name, or "" (a service, a oneof, an rpc)
    code = "\n".join(ln.split("//")[0] for ln in text.splitlines())
    for m in re.finditer(r"(message|oneof|service)\s+(\w+)\s*\{|\{|\}|(\w+)\s*=\s*(\d+)\s*;", code):
        if m.group(3):
            out.add((".".join(n for n in stack if n), m.group(3), int(m.group(4))))
        elif m.group(0) == "}":
            stack.pop()
        else:
            stack.append(m.group(2) if m.group(1) == "message" else "")
    return out


def test_the_committed_messages_are_the_protos() -> None:
    """kserve_v2_pb2.py (protoc's output, tools/gen_kserve_proto.py) declares exactly the .proto's fields."""
    proto = (Path(pb.__file__).parent / "kserve_v2.proto").read_text()
    built: set[tuple[str, str, int]] = set()

    def walk(desc: Any, prefix: str) -> None:
        if desc.GetOptions().map_entry:
            return
        name = f"{prefix}{desc.name}"
        built.update((name, f.name, f.number) for f in desc.fields)
        for nested in desc.nested_types:
            walk(nested, name + ".")

    for desc in pb.DESCRIPTOR.message_types_by_name.values():
        walk(desc, "")
    assert _proto_fields(proto) == built and len(built) > 40
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    assert methods == {"ServerLive", "ServerReady", "ModelReady", "ModelMetadata", "ModelInfer"}


def test_the_call_carries_the_tensors_the_id_and_the_model() -> None:
    client = OpenAIClient("grpc://127.0.0.1:9", "dlrm", TOK)  # never connects: encodes only
    msg = pb.ModelInferRequest.FromString(adapter_for("kserve_v2_grpc").body(client, _req("q-1")))
    assert (msg.model_name, msg.id, len(msg.inputs)) == ("dlrm", "q-1", 1)
    t = msg.inputs[0]
    assert (t.name, t.datatype, list(t.shape)) == ("features", "FP32", [3, 2])
    assert [round(v, 4) for v in t.contents.fp32_contents] == TENSOR["data"]
    assert infer_request(None, _req()).model_name == ""  # no model: the server's choice
    for bad in ("grpc://h", "grpc://h:1/v1", "ftp://h:1"):
        with pytest.raises(ValueError, match="grpc|scheme"):
            Endpoint.parse(bad)


def test_an_answer_must_carry_one_row_per_sample_in_whole_tensors() -> None:
    ok = _read(_answer())
    assert ok.outcome == "ok" and ok.finish_reason == "stop" and not ok.error
    raw = pb.ModelInferResponse()
    raw.outputs.add(name="p", datatype="INT64", shape=[3, 1])
    raw.raw_output_contents.append(b"\0" * 24)
    assert _read(bytes(raw.SerializeToString())).outcome == "ok"  # raw contents: 3 INT64 values
    short = pb.ModelInferResponse()
    short.outputs.add(name="p", datatype="INT64", shape=[3, 1])
    short.raw_output_contents.append(b"\0" * 20)
    wrong = [
        (b"", "no outputs"),
        (bytes(short.SerializeToString()), "raw contents do not fit"),
        (_answer(raw_output_contents=[b"", b""]), "2 raw output(s) for 1 output(s)"),
        (b"\xff\xff\xff", "not a ModelInferResponse"),
    ]
    for body, says in wrong:
        rec = _read(body)
        assert rec.outcome == "protocol_error" and says in rec.error, (body, rec.error)
    rows = _read(_answer(), samples=2)
    assert rows.outcome == "protocol_error" and "3 row(s) for 2 sample(s)" in rows.error


tensors = st.builds(
    lambda name, dtype, shape, n: (name, dtype, shape, n),
    st.text(max_size=3),
    st.sampled_from(["FP32", "INT64", "BYTES", "FP16", "XX", ""]),
    st.lists(st.integers(-2, 4), max_size=3),
    st.integers(0, 8),
)


def _built(parts: list[tuple[str, str, list[int], int]], raw: bool) -> bytes:
    out = pb.ModelInferResponse()
    for name, dtype, shape, n in parts:
        t = out.outputs.add(name=name, datatype=dtype, shape=shape)
        if raw:
            out.raw_output_contents.append(b"\1" * n)
        else:
            t.contents.fp32_contents.extend([0.5] * n)
    return bytes(out.SerializeToString())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=96),
        st.builds(_built, st.lists(tensors, max_size=3), st.booleans()),
    )
)
def test_no_answer_makes_the_reader_raise(body: bytes) -> None:
    rec = _read(body)
    assert rec.outcome in OUTCOMES and rec.outcome != "cancelled"
    assert (rec.outcome == "ok") == (not rec.error)


# ---- a hostile gRPC server, in this process --------------------------------------------------------------
class HostileServer:
    """Answers each ModelInfer call with the next of ``schedule``: a status to abort with, ``garbage``
    (bytes that are no ModelInferResponse), ``good``, or ``slow`` (a good answer after 0.5 s)."""

    def __init__(self, schedule: list[str] | None = None, ready: bool = True) -> None:
        self.schedule = list(schedule or [])
        answer = pb.ServerReadyResponse(ready=ready).SerializeToString()
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        method = grpc.unary_unary_rpc_method_handler(self._infer)  # bytes in, bytes out
        ready_method = grpc.unary_unary_rpc_method_handler(lambda body, context: answer)
        methods = {"ModelInfer": method, "ServerReady": ready_method}
        handler = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", methods)
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.url = f"grpc://127.0.0.1:{self.port}"

    def _infer(self, body: bytes, context: grpc.ServicerContext) -> bytes:
        with self.lock:
            what = self.schedule.pop(0) if self.schedule else "slow"
        if what == "garbage":
            return b"\x0a\x05hello\x2a\x03\xff\xff\xff"
        if what == "slow":
            time.sleep(0.5)
        if what in ("good", "slow"):
            return _answer()
        context.abort(grpc.StatusCode[what], f"injected {what}")
        raise AssertionError("abort raises")

    def __enter__(self) -> HostileServer:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(0).wait(5)


class Closer:
    """A TCP server that reads the start of each connection and closes it: no HTTP/2 ever answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.url = f"grpc://127.0.0.1:{self.sock.getsockname()[1]}"
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(64)

    def __enter__(self) -> Closer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(5)
        self.sock.close()


def _send_all(url: str, n: int) -> list[RequestRecord]:
    client = OpenAIClient(url, "dlrm", TOK, timeouts=Timeouts(read=5.0))
    try:
        return [client.send(_req(f"h-{i}"), 0, 0.0) for i in range(n)]
    finally:
        client.close()


def test_hostile_servers_give_endpoint_outcomes() -> None:
    schedule = ["UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT", "INTERNAL"]
    schedule += ["garbage", "CANCELLED", "good"]
    want = ["http_5xx", "http_429", "timeout", "http_4xx", "http_5xx", "protocol_error", "stream_error", "ok"]
    with HostileServer(schedule, ready=False) as srv:
        recs = _send_all(srv.url, len(schedule))
        assert server_ready(Endpoint.parse(srv.url), 5.0) == "ServerReady answered ready: false"
    assert [r.outcome for r in recs] == want, [(r.outcome, r.error) for r in recs]
    assert "gRPC RESOURCE_EXHAUSTED: injected" in recs[1].error
    assert all(r.done_ns >= r.sent_ns > 0 for r in recs)
    with Closer() as closer:
        closed = _send_all(closer.url, 2)
    assert all(r.outcome == "connect_error" and "UNAVAILABLE" in r.error for r in closed), closed
    with HostileServer(["slow"]) as srv:  # the server goes away while the call waits for its answer
        stopper = threading.Timer(0.2, lambda: srv.server.stop(0))
        stopper.start()
        cut = _send_all(srv.url, 1)[0]
        stopper.join()
    assert cut.outcome == "http_5xx" and "gRPC UNAVAILABLE" in cut.error, cut.error
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    refused = _send_all(f"grpc://127.0.0.1:{port}", 1)[0]
    assert refused.outcome == "connect_error", refused.error


def _grpc_profile(tmp_path: Path, **overrides: Any) -> Path:
    prof = write_profile(tmp_path / "g.yaml", api="kserve_v2_grpc", **overrides)
    data = json.loads(prof.read_text())
    del data["output_tokens"]
    prof.write_text(json.dumps(data))
    return prof


def test_calls_from_several_users_overlap_in_the_gevent_loop(tmp_path: Path) -> None:
    """Four users against a server that answers each call after 0.5 s: their calls are in flight together."""
    prof = _grpc_profile(tmp_path, input_tokens={"dist": "fixed", "value": 2}, inputs_per_request=3)
    out = tmp_path / "run"
    with HostileServer() as srv:
        args = ["run", "--profile", str(prof), "--duration", "3", "--host", srv.url, "--model", "m"]
        res = run_cli([*args, "--out", str(out), "--no-telemetry"], timeout=180)
    run = json.loads((out / "run.json").read_text())
    assert res.returncode == run["verdict"]["exit_code"] == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = list(read_lines(sorted(out.glob("records*.jsonl"))))
    assert lines and all(ln["outcome"] == "ok" and ln["e2e_us"] >= 450_000 for ln in lines)
    # sequential calls would make 3 s hold 6 of them; 4 users overlapping hold about 24
    assert run["metrics"]["requests"]["ok"] >= 12


# ---- against the embedded engine's gRPC service ---------------------------------------------------------
@pytest.fixture(scope="module")
def engine() -> Iterator[SimProcess]:
    with SimProcess(speedup=1, seed=3, extra_args=["--grpc-port", "0"]) as sim:
        yield sim


def _truth(sim: SimProcess) -> dict[str, dict[str, Any]]:
    return {t["request_id"]: t for t in sim.truth()}


def test_a_run_matches_the_engines_truth(engine: SimProcess, tmp_path: Path) -> None:
    prof = _grpc_profile(
        tmp_path,
        inputs_per_request=40,
        input_tokens={"dist": "fixed", "value": 16},
        load={"rate": 40, "arrival": "poisson"},
    )
    out = tmp_path / "run"
    res = run_cli(
        ["run", "--profile", str(prof), "--duration", "3", "--host", engine.grpc_url, "--out", str(out)]
    )
    run = json.loads((out / "run.json").read_text())
    assert res.returncode == run["verdict"]["exit_code"] == 0, res.stdout[-2000:] + res.stderr[-2000:]
    s = run["metrics"]["samples"]
    assert s["requests"] == s["requests_ok"] == run["metrics"]["requests"]["ok"] > 40
    assert s["samples_total"] == 40 * s["requests_ok"]
    truth = _truth(engine)
    lines = list(read_lines(sorted(out.glob("records*.jsonl"))))
    ours = [t for t in truth.values() if t["path"] == INFER_PATH]
    assert len(lines) == len(ours) == run["metrics"]["requests"]["completed"]  # every call, once
    pass_ms = (FIXED_S + 40 * PER_SAMPLE_S) * 1000
    for ln in lines:
        t = truth[ln["wire_id"]]
        assert t["outcome"] == "ok" and ln["outcome"] == "ok" and ln["inputs"] == 40
        assert (t["done_ns"] - t["first_token_ns"]) / 1e6 >= pass_ms * 0.95  # the cost model's pass
        assert ln["e2e_us"] / 1000 >= pass_ms * 0.95
        assert (t["done_ns"] - t["arrival_ns"]) / 1e6 <= ln["e2e_us"] / 1000 + 100  # inside the round trip


def _call(url: str, method: str, req: Any, resp_type: Any, md: tuple[tuple[str, str], ...] = ()) -> Any:
    ep = Endpoint.parse(url)
    with grpc.insecure_channel(f"{ep.host}:{ep.port}") as ch:
        fn: Callable[..., Any] = ch.unary_unary(
            f"/inference.GRPCInferenceService/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=resp_type.FromString,
        )
        return fn(req, timeout=10, metadata=md)


def test_the_engine_serves_health_metadata_and_its_faults(engine: SimProcess) -> None:
    url = engine.grpc_url
    assert _call(url, "ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse).live is True
    assert _call(url, "ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse).ready is True
    model = engine.stats()["model"]
    meta = _call(url, "ModelMetadata", pb.ModelMetadataRequest(name=model), pb.ModelMetadataResponse)
    assert [t.name for t in meta.inputs] == ["features"] and list(meta.outputs[0].shape) == [-1, 1]
    ready = _call(url, "ModelReady", pb.ModelReadyRequest(name="no-such-model"), pb.ModelReadyResponse)
    assert ready.ready is False
    with pytest.raises(grpc.RpcError) as missing:
        _call(url, "ModelMetadata", pb.ModelMetadataRequest(name="no-such-model"), pb.ModelMetadataResponse)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert server_ready(Endpoint.parse(url), 5.0) is None
    client = OpenAIClient(url, None, TOK)
    want = {"http_503": "http_5xx", "http_429": "http_429", "http_500": "http_5xx", "none": "ok"}
    got = {}
    try:
        for fault in want:
            req = _req(f"f-{fault}")
            req.extra_headers = {"X-Loadtest-Fault": fault}
            rec = client.send(req, 0, 0.0)
            got[fault] = rec.outcome
            assert _truth(engine)[rec.wire_id or ""]["outcome"] == ("ok" if fault == "none" else fault)
        malformed = client.send(_req("b", {**TENSOR, "data": [1.0]}), 0, 0.0)
    finally:
        client.close()
    assert got == want
    assert malformed.outcome == "http_4xx" and "1 value(s) for shape [3, 2]" in malformed.error
    other = OpenAIClient(url, "no-such-model", TOK)
    try:
        rec = other.send(_req("m"), 0, 0.0)
    finally:
        other.close()
    assert rec.outcome == "http_4xx" and "gRPC NOT_FOUND" in rec.error and "does not exist" in rec.error
