"""Tests for the embedded simulated engine: real server processes over real loopback sockets."""

from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest.sim import EngineConfig, SimProcess
from loadtest.sim.clock import decode_step_time_s, prefill_time_s, step_time_s
from loadtest.sim.presets import H100_SXM, LLAMA_3_1_8B, LLAMA_3_1_70B, get_gpu, get_model
from loadtest.sim.request import SimRequest
from loadtest.sim.scheduler import Scheduler
from loadtest.tokens.tokenizer import get_tokenizer
from loadtest.workload.text import synth_text
from tests.conftest import engine_ttft_best_of_three

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
CFG = EngineConfig(gpu=H100_SXM, model=LLAMA_3_1_8B)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(gpu="H100", model="llama-3.1-8b", speedup=1.0, seed=0) as s:
        yield s


def _conn(base_url: str, timeout: float = 30.0) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(base_url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def request(
    base_url: str,
    method: str,
    path: str,
    body: Any = None,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = _conn(base_url)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def sse_events(payload: bytes) -> list[str]:
    """The data fields of an SSE body, in order (each event is `data: ...` then a blank line)."""
    text = payload.decode()
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    out = []
    for ev in events:
        assert ev.startswith("data: "), ev
        out.append(ev[len("data: ") :])
    return out


def chat_body(n_words: int = 12, seed: str | int | None = None, **kw: Any) -> dict[str, Any]:
    content = synth_text(n_words, random.Random(n_words if seed is None else seed))
    return {"model": "Llama-3.1-8B", "messages": [{"role": "user", "content": content}], **kw}


def truth_by_id(sim: SimProcess, request_id: str) -> dict[str, Any]:
    for rec in sim.truth():
        if rec["request_id"] == request_id:
            return rec
    raise AssertionError(f"no truth record for {request_id}")


# ---- pure units ------------------------------------------------------------------------------
def test_step_time_matches_hand_computation() -> None:
    # Llama-3.1-8B on H100: L=32, d_attn=32*128=4096, kv_B=2*32*8*128*2=131072, W=8.03e9*2.
    t_fixed = 32e-6 * 32 + 126e-6
    F, BW = 989e12, 3.35e12
    # One decode: n=1 over c=1000 cached tokens.
    flops = 2 * 8.03e9 * 1 + 4 * 32 * 4096 * 1 * (1000 + 1)
    nbytes = 8.03e9 * 2 + 131072 * 1001
    want = t_fixed + 4e-6 * 1 + max(flops / (0.55 * F), nbytes / (0.8 * BW))
    assert step_time_s(CFG, [(1, 1000)]) == pytest.approx(want, rel=1e-12)
    assert decode_step_time_s(CFG, 1, 1000) == pytest.approx(want, rel=1e-12)
    # One 2000-token prefill (compute-bound) batched with 3 decodes at context 500.
    items = [(2000, 0), (1, 500), (1, 500), (1, 500)]
    flops = 2 * 8.03e9 * 2003 + 4 * 32 * 4096 * (2000 * (0 + 2001 / 2) + 3 * (500 + 1))
    nbytes = 8.03e9 * 2 + 131072 * (2000 + 3 * 501)
    want = t_fixed + 4e-6 * 4 + max(flops / (0.55 * F), nbytes / (0.8 * BW))
    assert flops / (0.55 * F) > nbytes / (0.8 * BW)
    assert step_time_s(CFG, items) == pytest.approx(want, rel=1e-12)
    assert step_time_s(CFG, []) == 0.0


def test_prefill_time_chunks_long_prompts() -> None:
    cfg = EngineConfig(max_num_batched_tokens=1000)
    assert prefill_time_s(cfg, 500) == pytest.approx(step_time_s(cfg, [(500, 0)]))
    assert prefill_time_s(cfg, 2500) == pytest.approx(
        step_time_s(cfg, [(1000, 0)]) + step_time_s(cfg, [(1000, 1000)]) + step_time_s(cfg, [(500, 2000)])
    )


def test_decode_cost_grows_with_batch_and_model() -> None:
    assert decode_step_time_s(CFG, 64, 500) > decode_step_time_s(CFG, 1, 500)
    big = EngineConfig(model=LLAMA_3_1_70B)
    assert decode_step_time_s(big, 1, 100) > 5 * decode_step_time_s(CFG, 1, 100)


def test_presets_lookup() -> None:
    assert get_gpu("h100") is H100_SXM
    assert get_gpu("H200-SXM").hbm_bw_tbs == 4.8
    assert get_model("LLAMA-3.1-70b") is LLAMA_3_1_70B
    assert get_model("meta-llama/Llama-3.1-8B") is LLAMA_3_1_8B
    with pytest.raises(ValueError, match="H100-SXM"):
        get_gpu("tpu-v9")
    with pytest.raises(ValueError, match="Llama-3.1-8B"):
        get_model("gpt-5")


def _req(i: int, prompt: int, target: int) -> SimRequest:
    return SimRequest(request_id=str(i), prompt_tokens=prompt, target_tokens=target, arrival_s=0.0)


def test_scheduler_chunked_prefill_and_limits() -> None:
    s = Scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    a, b, c = _req(0, 150, 3), _req(1, 30, 2), _req(2, 10, 1)
    for r in (a, b, c):
        s.add(r)
    batch = s.schedule()  # a gets the whole budget (chunk of 100)
    assert [(x.req, x.n_new, x.n_cached) for x in batch] == [(a, 100, 0)]
    assert s.complete_step(batch) == []
    batch = s.schedule()  # a finishes prefill (50), b admitted (30); c waits: max_num_seqs=2
    assert [(x.req, x.n_new, x.n_cached) for x in batch] == [(a, 50, 100), (b, 30, 0)]
    assert s.complete_step(batch) == [a, b]
    batch = s.schedule()  # both decode one token over their contexts
    assert [(x.req, x.n_new, x.n_cached) for x in batch] == [(a, 1, 150), (b, 1, 30)]
    assert s.complete_step(batch) == [a, b]
    assert b.done and a.num_output == 2
    batch = s.schedule()  # b left; c admitted
    assert [(x.req, x.n_new) for x in batch] == [(a, 1), (c, 10)]
    s.abort(a)
    assert s.complete_step(batch) == [c]
    assert not s.has_work()


# ---- protocol over real sockets --------------------------------------------------------------
def test_health_and_models(sim: SimProcess) -> None:
    status, _, _ = request(sim.base_url, "GET", "/health")
    assert status == 200
    status, _, body = request(sim.base_url, "GET", "/v1/models")
    assert status == 200
    assert json.loads(body) == {
        "object": "list",
        "data": [{"id": "Llama-3.1-8B", "object": "model", "created": 0, "owned_by": "loadtest-sim"}],
    }


def test_errors(sim: SimProcess) -> None:
    status, _, body = request(sim.base_url, "POST", CHAT, chat_body(model="no-such-model"))
    assert status == 404
    assert json.loads(body)["error"]["code"] == "model_not_found"
    status, _, body = request(sim.base_url, "POST", CHAT, raw=b"{not json")
    assert status == 400
    err = json.loads(body)["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["code"]
    status, _, body = request(sim.base_url, "POST", CHAT, {"model": "Llama-3.1-8B"})
    assert status == 400 and json.loads(body)["error"]["param"] == "messages"
    status, _, body = request(sim.base_url, "POST", COMPLETIONS, {"max_tokens": 3})
    assert status == 400 and json.loads(body)["error"]["param"] == "prompt"
    # Case-insensitive model name and an omitted model are accepted.
    status, _, _ = request(sim.base_url, "POST", CHAT, chat_body(model="llama-3.1-8b", max_tokens=1))
    assert status == 200
    body = chat_body(max_tokens=1)
    del body["model"]
    assert request(sim.base_url, "POST", CHAT, body)[0] == 200


def test_chat_stream_events(sim: SimProcess) -> None:
    n = 25
    body = chat_body(40, max_tokens=n, ignore_eos=True, stream=True, stream_options={"include_usage": True})
    status, headers, payload = request(sim.base_url, "POST", CHAT, body, headers={"X-Request-Id": "evt-1"})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert headers["X-Request-Id"] == "evt-1"
    events = sse_events(payload)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 1 + n + 2
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "Llama-3.1-8B" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c["choices"][0]["delta"]["content"] for c in chunks[1 : 1 + n]]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[: 1 + n])
    assert all(content)
    finish = chunks[1 + n]["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == "length"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    tok = get_tokenizer()
    usage = usage_chunk["usage"]
    assert usage == {
        "prompt_tokens": tok.count_chat(body["messages"]),
        "completion_tokens": n,
        "total_tokens": tok.count_chat(body["messages"]) + n,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert tok.count("".join(content)) == n


def test_no_usage_chunk_without_include_usage(sim: SimProcess) -> None:
    body = chat_body(max_tokens=4, ignore_eos=True, stream=True)
    _, _, payload = request(sim.base_url, "POST", CHAT, body)
    events = sse_events(payload)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and len(chunks) == 1 + 4 + 1
    assert all("usage" not in c and c["choices"] for c in chunks)


def test_completions_stream(sim: SimProcess) -> None:
    body = {
        "model": "Llama-3.1-8B",
        "prompt": "Once upon a time",
        "max_tokens": 6,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    _, _, payload = request(sim.base_url, "POST", COMPLETIONS, body)
    events = sse_events(payload)
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len(chunks) == 6 + 2
    text = "".join(c["choices"][0]["text"] for c in chunks[:6])
    assert get_tokenizer().count(text) == 6
    assert chunks[6]["choices"][0]["finish_reason"] == "length"
    assert chunks[7]["usage"]["prompt_tokens"] == get_tokenizer().count("Once upon a time")


def test_non_streaming_bodies(sim: SimProcess) -> None:
    tok = get_tokenizer()
    body = chat_body(max_tokens=7, ignore_eos=True)
    status, headers, payload = request(sim.base_url, "POST", CHAT, body)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    resp = json.loads(payload)
    assert resp["object"] == "chat.completion"
    choice = resp["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert tok.count(choice["message"]["content"]) == 7
    assert resp["usage"]["completion_tokens"] == 7
    assert resp["usage"]["prompt_tokens"] == tok.count_chat(body["messages"])
    assert resp["usage"]["total_tokens"] == resp["usage"]["prompt_tokens"] + 7

    prompts = ["alpha beta", "gamma"]
    status, _, payload = request(sim.base_url, "POST", COMPLETIONS, {"prompt": prompts, "max_tokens": 3})
    resp = json.loads(payload)
    assert status == 200 and resp["object"] == "text_completion"
    assert resp["usage"]["prompt_tokens"] == sum(tok.count(p) for p in prompts)
    assert 1 <= resp["usage"]["completion_tokens"] <= 3
    assert tok.count(resp["choices"][0]["text"]) == resp["usage"]["completion_tokens"]


def test_sampled_output_lengths_respect_bounds(sim: SimProcess) -> None:
    lengths = []
    for i in range(6):
        body = {"prompt": f"p{i}", "max_tokens": 30, "min_tokens": 5}
        resp = json.loads(request(sim.base_url, "POST", COMPLETIONS, body)[2])
        n = resp["usage"]["completion_tokens"]
        assert 5 <= n <= 30
        assert resp["choices"][0]["finish_reason"] == ("length" if n == 30 else "stop")
        lengths.append(n)


# ---- timing ----------------------------------------------------------------------------------
def test_single_request_timing_matches_clock(sim: SimProcess) -> None:
    """TTFT is never under the model's prefill, and within its tolerance (plus the engine's step
    lateness) in the best of three tries, each with new words (no cached prefix): a busy machine's
    delays only add. The token gaps of the passing try follow the clock's decode steps."""
    prompts: dict[str, int] = {}

    def send(k: int) -> str:
        body = chat_body(400, seed=f"timing-{k}", max_tokens=30, ignore_eos=True, stream=True)
        prompts[f"timing-{k}"] = get_tokenizer().count_chat(body["messages"])
        status, _, _ = request(sim.base_url, "POST", CHAT, body, headers={"X-Request-Id": f"timing-{k}"})
        assert status == 200
        return f"timing-{k}"

    def want(rec: dict[str, Any]) -> float:
        prompt = prompts[rec["request_id"]]
        assert rec["prompt_tokens"] == prompt and rec["completion_tokens"] == 30 and rec["outcome"] == "ok"
        return prefill_time_s(CFG, prompt)

    rec = engine_ttft_best_of_three(sim, send, want, lambda w: 0.002 + 0.1 * w)
    prompt = rec["prompt_tokens"]
    gaps = [(b - a) / 1e9 for a, b in zip(rec["token_ns"], rec["token_ns"][1:], strict=False)]
    assert len(gaps) == 29
    wants = [decode_step_time_s(CFG, 1, prompt + k) for k in range(len(gaps))]
    off = [
        (k, g, w) for k, (g, w) in enumerate(zip(gaps, wants, strict=True)) if abs(g - w) > 0.001 + 0.1 * w
    ]
    # Deadlines are absolute, so one late wake-up (the OS preempting the server) skews at most two
    # gaps, one long and one short: a busy machine makes a few such pairs. Most gaps keep the clock's
    # step, and the cadence itself matches it (a wrong step time puts every gap off).
    assert len(off) <= len(gaps) // 2, off
    assert abs(statistics.fmean(gaps) - statistics.fmean(wants)) <= 0.0005 + 0.05 * statistics.fmean(wants)
    assert rec["done_ns"] >= rec["token_ns"][-1]


def _mean_gap(rec: dict[str, Any]) -> float:
    ns = rec["token_ns"]
    return (ns[-1] - ns[0]) / (len(ns) - 1) / 1e9


def test_decode_slows_down_under_load(sim: SimProcess) -> None:
    n_out = 40
    single_body = chat_body(300, max_tokens=n_out, ignore_eos=True, stream=True)
    request(sim.base_url, "POST", CHAT, single_body, headers={"X-Request-Id": "load-single"})
    single = _mean_gap(truth_by_id(sim, "load-single"))

    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            body = chat_body(300 + i, max_tokens=n_out, ignore_eos=True, stream=True)
            status, _, payload = request(
                sim.base_url, "POST", CHAT, body, headers={"X-Request-Id": f"load-{i}"}
            )
            assert status == 200 and payload.endswith(b"data: [DONE]\n\n")
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    recs = {r["request_id"]: r for r in sim.truth()}
    loaded = [recs[f"load-{i}"] for i in range(64)]
    assert all(r["completion_tokens"] == n_out and r["outcome"] == "ok" for r in loaded)
    mean_loaded = statistics.fmean(_mean_gap(r) for r in loaded)
    assert mean_loaded > 1.1 * single, (mean_loaded, single)
    # Steps after every request got its first token are pure decode steps of up to 64 requests.
    all_in = max(r["first_token_ns"] for r in loaded)
    decode_gaps = [
        (b - a) / 1e9
        for r in loaded
        for a, b in zip(r["token_ns"], r["token_ns"][1:], strict=False)
        if a >= all_in
    ]
    assert decode_gaps
    assert statistics.fmean(decode_gaps) > decode_step_time_s(CFG, 1, 320) * 1.05
    assert statistics.fmean(decode_gaps) < decode_step_time_s(CFG, 64, 360) * 1.3 + 0.002


# ---- accounting, disconnects, truth log, process control -------------------------------------
def test_stats_disconnect_and_truth_log(tmp_path: Path) -> None:
    log_path = tmp_path / "truth.jsonl"
    with SimProcess(speedup=5.0, truth_log=log_path) as s:
        for i in range(3):
            assert request(s.base_url, "POST", CHAT, chat_body(max_tokens=3, stream=bool(i % 2)))[0] == 200
        assert request(s.base_url, "POST", COMPLETIONS, {"prompt": "x", "max_tokens": 2})[0] == 200
        assert request(s.base_url, "POST", CHAT, raw=b"nope")[0] == 400

        # A client that reads two events of a long stream and hangs up.
        conn = _conn(s.base_url)
        body = chat_body(max_tokens=2000, ignore_eos=True, stream=True)
        conn.request("POST", CHAT, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        seen = 0
        while seen < 3:
            if r.readline().startswith(b"data: "):
                seen += 1
        r.close()
        conn.close()

        deadline = time.monotonic() + 10
        while True:
            stats = s.stats()
            if stats["requests_by_outcome"].get("client_disconnected") == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert stats["requests_by_outcome"] == {"ok": 4, "client_disconnected": 1}
        assert stats["engine"]["num_requests_running"] == 0
        # The server keeps serving.
        assert request(s.base_url, "POST", CHAT, chat_body(max_tokens=2, ignore_eos=True))[0] == 200
        stats = s.stats()
        assert stats["requests_received"] == 6
        assert stats["requests_completed"] == 6
        assert stats["requests_rejected"] == 1
        assert stats["requests_by_path"] == {CHAT: 5, COMPLETIONS: 1}
        assert stats["requests_by_outcome"] == {"ok": 5, "client_disconnected": 1}
        assert stats["config"]["gpu"] == "H100-SXM" and stats["config"]["speedup"] == 5.0
        truth = s.truth()
        assert len(truth) == 6
        assert stats["completion_tokens_total"] == sum(t["completion_tokens"] for t in truth)
        assert stats["prompt_tokens_total"] == sum(t["prompt_tokens"] for t in truth)
        dropped = [t for t in truth if t["outcome"] == "client_disconnected"]
        assert len(dropped) == 1 and 2 <= dropped[0]["completion_tokens"] < 2000
        pid = s.pid
        # Stopping with a stream in flight: exits 0 promptly; the stream ends truncated (no [DONE]).
        conn = _conn(s.base_url)
        conn.request("POST", CHAT, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.readline().startswith(b"data: ")
        t0 = time.monotonic()
    assert s.returncode == 0 and pid is not None
    assert time.monotonic() - t0 < 5
    with pytest.raises(http.client.IncompleteRead):
        rest = r.read()
        assert b"[DONE]" not in rest
    conn.close()
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert [t["response_id"] for t in lines[:-1]] == [t["response_id"] for t in truth]
    assert lines[-1]["outcome"] == "server_shutdown"
    assert s.stop() == 0  # idempotent


def test_sim_process_reports_startup_failure(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="unknown GPU"):
        SimProcess(gpu="tpu-v9", stderr_path=tmp_path / "sim.log").start()
