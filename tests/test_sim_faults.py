"""Fault injection in the simulated engine, as a plain HTTP client sees each failure."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from loadtest.sim import SimProcess
from loadtest.sim.faults import FaultPlan, FaultSpecError, parse_header, parse_spec
from tests.test_sim import CHAT, chat_body, request

N = 12  # output tokens of the streamed requests below


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(speedup=20.0, seed=5) as s:
        yield s


def _stream_body(**kw: Any) -> dict[str, Any]:
    return chat_body(max_tokens=N, ignore_eos=True, stream=True, stream_options={"include_usage": True}, **kw)


def _raw(sim: SimProcess, body: dict[str, Any], fault: str | None, rid: str) -> bytes:
    """Send one request over a raw socket; everything received until the server closes."""
    u = urllib.parse.urlsplit(sim.base_url)
    data = json.dumps(body).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\nX-Request-Id: {rid}\r\n"
        + (f"X-Loadtest-Fault: {fault}\r\n" if fault else "")
        + "\r\n"
    )
    out = b""
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(head.encode() + data)
        while chunk := s.recv(65536):
            out += chunk
    return out


def _events(payload: str) -> list[str]:
    return [ev[len("data: ") :] for ev in payload.split("\n\n") if ev.startswith("data: ")]


def _timed_stream(sim: SimProcess, fault: str, rid: str) -> tuple[float, list[tuple[float, str]], bytes]:
    """(seconds to headers, [(arrival time, event data)], rest) read with http.client."""
    u = urllib.parse.urlsplit(sim.base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    t0 = time.perf_counter()
    conn.request(
        "POST",
        CHAT,
        body=json.dumps(_stream_body()),
        headers={"Content-Type": "application/json", "X-Loadtest-Fault": fault, "X-Request-Id": rid},
    )
    r = conn.getresponse()
    t_headers = time.perf_counter() - t0
    assert r.status == 200
    events = []
    while line := r.readline():
        if line.startswith(b"data: "):
            events.append((time.perf_counter(), line[6:].decode().rstrip("\n")))
    conn.close()
    return t_headers, events, b""


def _truth(sim: SimProcess, rid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while True:
        for rec in sim.truth():
            if rec["request_id"] == rid:
                return rec
        assert time.monotonic() < deadline, f"no truth record for {rid}"
        time.sleep(0.05)


def _content(events: list[str]) -> list[str]:
    out = []
    for e in events:
        obj = json.loads(e)
        for c in obj.get("choices", []):
            if c["delta"].get("content"):
                out.append(c["delta"]["content"])
    return out


# ---- spec grammar ----------------------------------------------------------------------------
def test_spec_grammar() -> None:
    rules = parse_spec("http_503=5%, stall_mid_stream=0.25@3,http_429=#2@7")
    assert [(r.kind, r.probability, r.remaining, r.param, r.counted) for r in rules] == [
        ("http_503", 0.05, 0, None, False),
        ("stall_mid_stream", 0.25, 0, 3.0, False),
        ("http_429", 0.0, 2, 7.0, True),
    ]
    assert parse_spec(None) == [] and parse_spec("") == []
    assert parse_header("slow_headers:0.5").param == 0.5 and parse_header("none") is None
    for bad in ("nope=1%", "http_500", "http_500=2", "http_500=x", "http_500=#1@-1"):
        with pytest.raises(FaultSpecError):
            parse_spec(bad)


def test_rates_are_seeded_and_counts_exact() -> None:
    def picks(spec: str, seed: int, n: int = 200) -> list[str | None]:
        plan = FaultPlan(spec, seed)
        return [f.kind if (f := plan.pick()) else None for _ in range(n)]

    a = picks("http_500=20%,no_usage=0.1", 7)
    assert a == picks("http_500=20%,no_usage=0.1", 7)
    assert a != picks("http_500=20%,no_usage=0.1", 8)
    assert 20 <= a.count("http_500") <= 60 and a.count("no_usage") >= 5
    c = picks("http_503=#3,http_500=50%", 1, 10)
    assert c[:3] == ["http_503"] * 3 and "http_503" not in c[3:]
    # A header decides its own request but shifts neither the seeded draws nor the exact counts.
    plan = FaultPlan("http_500=20%,http_503=#2", 7)
    got = [f.kind if (f := plan.pick("none" if i % 3 == 0 else None)) else None for i in range(200)]
    base = picks("http_500=20%", 7)
    assert all(g == b for i, (g, b) in enumerate(zip(got, base, strict=True)) if i % 3 and b)
    assert got.count("http_503") == 2


# ---- each kind over the wire -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("fault", "status"), [("http_500", 500), ("http_503", 503), ("http_429", 429), ("http_429:7", 429)]
)
def test_http_errors(sim: SimProcess, fault: str, status: int) -> None:
    code, headers, body = request(
        sim.base_url, "POST", CHAT, chat_body(max_tokens=3), headers={"X-Loadtest-Fault": fault}
    )
    assert code == status
    err = json.loads(body)["error"]
    assert err["message"] and err["code"] == status and err["type"]
    if status == 429:
        assert headers["Retry-After"] == ("7" if fault.endswith(":7") else "1")


def test_reset_before_headers(sim: SimProcess) -> None:
    with pytest.raises(ConnectionResetError):
        _raw(sim, chat_body(max_tokens=3), "reset_before_headers", "f-reset")
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        request(
            sim.base_url,
            "POST",
            CHAT,
            chat_body(max_tokens=3),
            headers={"X-Loadtest-Fault": "reset_before_headers"},
        )
    rec = _truth(sim, "f-reset")
    assert rec["fault"] == rec["outcome"] == "reset_before_headers" and rec["completion_tokens"] == 0


@pytest.mark.parametrize("fault", ["disconnect_mid_stream", "disconnect_mid_stream:3"])
def test_disconnect_mid_stream(sim: SimProcess, fault: str) -> None:
    rid = "f-" + fault.replace(":", "-")
    raw = _raw(sim, _stream_body(), fault, rid)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"200 OK" in head and b"chunked" in head.lower()
    assert not body.endswith(b"0\r\n\r\n")  # no terminating chunk
    assert b"[DONE]" not in body and b'finish_reason":"' not in body
    want = 3 if fault.endswith(":3") else N // 2
    assert body.count(b'"content":" ') == want
    with pytest.raises(http.client.IncompleteRead):
        request(sim.base_url, "POST", CHAT, _stream_body(), headers={"X-Loadtest-Fault": fault})
    rec = _truth(sim, rid)
    assert rec["fault"] == rec["outcome"] == "disconnect_mid_stream" and rec["completion_tokens"] == want


def test_stall_mid_stream(sim: SimProcess) -> None:
    _, events, _ = _timed_stream(sim, "stall_mid_stream:0.6", "f-stall")
    data = [e for _, e in events]
    assert data[-1] == "[DONE]" and len(_content(data[:-1])) == N
    gaps = [(b[0] - a[0], i) for i, (a, b) in enumerate(zip(events, events[1:], strict=False))]
    big = [(g, i) for g, i in gaps if g >= 0.6]
    assert len(big) == 1 and big[0][1] == N // 2  # after the role event and N/2 tokens
    rec = _truth(sim, "f-stall")
    assert (
        rec["outcome"] == "stall_mid_stream"
        and rec["completion_tokens"] == N
        and rec["finish_reason"] == "length"
    )


def test_malformed_chunk(sim: SimProcess) -> None:
    code, _, payload = request(
        sim.base_url, "POST", CHAT, _stream_body(), headers={"X-Loadtest-Fault": "malformed_chunk"}
    )
    assert code == 200
    events = _events(payload.decode())
    bad = []
    for i, e in enumerate(events[:-1]):
        try:
            json.loads(e)
        except ValueError:
            bad.append(i)
    assert len(bad) == 1 and 1 < bad[0] < len(events) - 3
    good = [e for i, e in enumerate(events[:-1]) if i not in bad]
    assert events[-1] == "[DONE]" and len(_content(good)) == N
    assert json.loads(good[-1])["usage"]["completion_tokens"] == N


def test_error_frame(sim: SimProcess) -> None:
    code, _, payload = request(
        sim.base_url, "POST", CHAT, _stream_body(), headers={"X-Loadtest-Fault": "error_frame"}
    )
    assert code == 200  # the chunked body ended cleanly (http.client read it all)
    events = _events(payload.decode())
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert last == {
        "error": {"message": last["error"]["message"], "type": "server_error", "param": None, "code": 500}
    }
    assert all(c["finish_reason"] is None for e in events[:-1] for c in json.loads(e)["choices"])
    assert len(_content(events[:-1])) == N // 2


def test_no_done(sim: SimProcess) -> None:
    code, _, payload = request(
        sim.base_url,
        "POST",
        CHAT,
        _stream_body(),
        headers={"X-Loadtest-Fault": "no_done", "X-Request-Id": "f-nodone"},
    )
    assert code == 200
    events = _events(payload.decode())
    assert "[DONE]" not in events and len(_content(events)) == N
    assert all(c["finish_reason"] is None for e in events for c in json.loads(e)["choices"])
    assert all("usage" not in json.loads(e) for e in events)
    rec = _truth(sim, "f-nodone")
    assert rec["outcome"] == "no_done" and rec["finish_reason"] is None and rec["completion_tokens"] == N


def test_slow_headers(sim: SimProcess) -> None:
    t_headers, events, _ = _timed_stream(sim, "slow_headers:0.5", "f-slow")
    assert t_headers >= 0.5 and events[-1][1] == "[DONE]"
    t0 = time.perf_counter()
    code, _, _ = request(
        sim.base_url, "POST", CHAT, chat_body(max_tokens=2), headers={"X-Loadtest-Fault": "slow_headers:0.3"}
    )
    assert code == 200 and time.perf_counter() - t0 >= 0.3


def test_no_usage(sim: SimProcess) -> None:
    _, _, payload = request(
        sim.base_url, "POST", CHAT, _stream_body(), headers={"X-Loadtest-Fault": "no_usage"}
    )
    events = _events(payload.decode())
    assert events[-1] == "[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in o for o in objs) and objs[-1]["choices"][0]["finish_reason"] == "length"
    resp = json.loads(
        request(
            sim.base_url, "POST", CHAT, chat_body(max_tokens=2), headers={"X-Loadtest-Fault": "no_usage"}
        )[2]
    )
    assert "usage" not in resp and resp["choices"][0]["message"]["content"]


def test_bad_fault_header_is_rejected(sim: SimProcess) -> None:
    code, _, body = request(
        sim.base_url, "POST", CHAT, chat_body(max_tokens=2), headers={"X-Loadtest-Fault": "explode"}
    )
    assert code == 400 and "unknown fault kind" in json.loads(body)["error"]["message"]


# ---- run-wide specs, truth and stats ---------------------------------------------------------
def _statuses(sim: SimProcess, n: int, headers: dict[str, str] | None = None, prefix: str = "r") -> list[int]:
    return [
        request(
            sim.base_url,
            "POST",
            CHAT,
            chat_body(max_tokens=2),
            headers={"X-Request-Id": f"{prefix}{i}", **(headers or {})},
        )[0]
        for i in range(n)
    ]


def test_run_spec_exact_count_truth_and_stats() -> None:
    with SimProcess(speedup=20.0, faults="http_503=#3,no_usage=#2") as s:
        statuses = _statuses(s, 8)
        assert statuses == [503, 503, 503] + [200] * 5
        # The header wins over the run spec.
        assert _statuses(s, 1, {"X-Loadtest-Fault": "http_429:2"}, prefix="h") == [429]
        truth = {t["request_id"]: t for t in s.truth()}
        assert [truth[f"r{i}"]["fault"] for i in range(8)] == ["http_503"] * 3 + ["no_usage"] * 2 + [None] * 3
        assert [truth[f"r{i}"]["outcome"] for i in range(8)] == ["http_503"] * 3 + ["no_usage"] * 2 + [
            "ok"
        ] * 3
        stats = s.stats()
        assert stats["faults_injected"] == {"http_503": 3, "no_usage": 2, "http_429": 1}
        assert stats["requests_by_outcome"] == {"http_503": 3, "no_usage": 2, "ok": 3, "http_429": 1}


def test_run_spec_rates_are_seeded() -> None:
    runs = []
    for seed in (11, 11):
        with SimProcess(speedup=20.0, seed=seed, faults="http_500=30%") as s:
            runs.append([i for i, c in enumerate(_statuses(s, 20)) if c == 500])
            assert s.stats()["faults_injected"].get("http_500", 0) == len(runs[-1])
    assert runs[0] == runs[1] and 0 < len(runs[0]) < 20
    # With the header "none" every request is served.
    with SimProcess(speedup=20.0, faults="http_500=100%") as s:
        assert _statuses(s, 3, {"X-Loadtest-Fault": "none"}) == [200] * 3
        assert _statuses(s, 1) == [500]


def test_non_streaming_variants(sim: SimProcess) -> None:
    body = chat_body(max_tokens=N, ignore_eos=True)

    def call(fault: str) -> tuple[int, bytes]:
        status, _, payload = request(sim.base_url, "POST", CHAT, body, headers={"X-Loadtest-Fault": fault})
        return status, payload

    with pytest.raises(http.client.RemoteDisconnected):
        call("disconnect_mid_stream")
    status, payload = call("error_frame")
    assert status == 500 and json.loads(payload)["error"]["type"] == "server_error"
    status, payload = call("malformed_chunk")
    assert status == 200
    with pytest.raises(ValueError):
        json.loads(payload)
    status, payload = call("no_done")
    assert status == 200 and json.loads(payload)["choices"][0]["finish_reason"] is None
    t0 = time.perf_counter()
    status, payload = call("stall_mid_stream:0.3")
    assert status == 200 and time.perf_counter() - t0 >= 0.3
    assert json.loads(payload)["usage"]["completion_tokens"] == N
