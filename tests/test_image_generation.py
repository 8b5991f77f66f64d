"""Image generation (``api: images``, POST /v1/images/generations): base64 or URL answers of exactly the
images asked for, every other answer an endpoint outcome; runs against the embedded engine match its truth
and its cost model (docs/api-surface.md, "Image generation")."""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import read_lines, run_cli, write_profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.client.adapters import adapter_for
from loadtest.client.adapters.base import classify_http
from loadtest.client.http import Response
from loadtest.client.openai import OpenAIClient, PreparedRequest
from loadtest.client.record import OUTCOMES, RequestRecord
from loadtest.sim import SimProcess
from loadtest.sim.routes.images import IMAGE_S, PNG
from loadtest.tokens.tokenizer import get_tokenizer
from tests.fault_servers import FaultServer

CLIENT = OpenAIClient("http://127.0.0.1:9", "flux", get_tokenizer("llama3"))  # never connects: reads only
B64 = base64.b64encode(PNG).decode()
SPEEDUP = 20


def _classify(body: bytes, n: int = 2, status: int = 200) -> RequestRecord:
    resp = Response(status, {"content-type": "application/json"}, 1, [body], [5], complete=True)
    req = PreparedRequest("r", "images", {"prompt": "a cat", "n": n}, 3, None, stream=False)
    rec = RequestRecord("r", stream=False)
    if not classify_http(rec, resp):
        adapter_for("images").classify(CLIENT, rec, req, resp)
    return rec


def test_the_request_carries_the_prompt_the_model_and_the_profiles_fields() -> None:
    client = OpenAIClient("http://127.0.0.1:9", "flux", get_tokenizer("llama3"))
    client.extra_body = {"n": 2, "size": "512x512"}
    raw = client.encode(PreparedRequest("q", "images", {"prompt": "a cat"}, 3, None, stream=False)).decode()
    assert raw.startswith("POST /v1/images/generations HTTP/1.1\r\n")
    body = json.loads(raw.split("\r\n\r\n", 1)[1])
    assert body == {"prompt": "a cat", "model": "flux", "n": 2, "size": "512x512"}


def test_an_answer_must_carry_each_image_asked_for() -> None:
    rec = _classify(json.dumps({"data": [{"b64_json": B64}, {"url": "https://x/1.png"}]}).encode())
    assert rec.outcome == "ok" and rec.inputs == 2 and rec.done_ns == 5 and not rec.error
    for body, says in [
        ({"data": [{"b64_json": B64}]}, "1 image(s) for 2 asked"),
        ({"images": []}, "0 image(s) for 2 asked"),
        ({"data": [{"b64_json": B64}, {"revised_prompt": "x"}]}, "neither b64_json nor url"),
        ({"data": [{"b64_json": B64}, {"b64_json": "%%%"}]}, "not base64"),
    ]:
        rec = _classify(json.dumps(body).encode())
        assert rec.outcome == "protocol_error" and says in rec.error, (body, rec.error)
    safety = {"error": {"message": "Your request was rejected by the safety system"}}
    assert _classify(json.dumps(safety).encode()).outcome == "stream_error"
    rec = _classify(json.dumps(safety).encode(), status=400)
    assert rec.outcome == "http_4xx" and "safety system" in rec.error


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.dictionaries(
            st.sampled_from(["data", "error", "created"]),
            st.lists(
                st.dictionaries(
                    st.sampled_from(["b64_json", "url"]), st.none() | st.text(max_size=6) | st.integers()
                ),
                max_size=3,
            )
            | st.text(max_size=4),
            max_size=3,
        ).map(lambda d: json.dumps(d).encode()),
        st.binary(max_size=40),
    )
)
def test_no_answer_makes_the_reader_raise(body: bytes) -> None:
    rec = _classify(body)
    assert rec.outcome in OUTCOMES and rec.outcome != "cancelled"
    assert (rec.outcome == "ok") == (not rec.error)


def test_hostile_servers_give_endpoint_outcomes() -> None:
    schedule = ["html_502", "json_not_sse", "invalid_utf8", "redirect_301"]
    want = ["http_5xx", "protocol_error", "protocol_error", "protocol_error"]
    with FaultServer(schedule) as srv:
        # the fault server answers POSTs to a completions path: a host URL that fixes the path
        client = OpenAIClient(srv.base_url + "/v1/completions", None, get_tokenizer("llama3"))
        try:
            got = [
                client.send(
                    PreparedRequest(f"h{i}", "images", {"prompt": "x"}, 1, None, stream=False), 0, 0.0
                ).outcome
                for i in range(len(schedule))
            ]
        finally:
            client.close()
    assert got == want


@pytest.fixture(scope="module")
def engine():
    with SimProcess(speedup=SPEEDUP, seed=9) as sim:
        yield sim


def _truth(sim: SimProcess) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(sim.base_url + "/sim/truth", timeout=10) as r:
        return {t["request_id"]: t for t in map(json.loads, r.read().decode().splitlines())}


@pytest.mark.parametrize("fmt", ["b64_json", "url"])
def test_an_images_run_matches_the_engines_truth_and_cost_model(
    engine: SimProcess, tmp_path: Path, fmt: str
) -> None:
    prof = write_profile(
        tmp_path / "i.yaml",
        api="images",
        input_tokens={"dist": "fixed", "value": 25},
        load={"concurrency": 1},
        request={"extra_body": {"n": 2, "size": "512x512", "response_format": fmt}},
    )
    data = json.loads(prof.read_text())
    del data["output_tokens"]
    prof.write_text(json.dumps(data))
    out = tmp_path / "run"
    res = run_cli(
        ["run", "--profile", str(prof), "--out", str(out), "--no-telemetry", "--duration", "3"]
        + ["--host", engine.base_url],
        timeout=180,
    )
    run = json.loads((out / "run.json").read_text())
    assert res.returncode == run["verdict"]["exit_code"] == 0, res.stderr[-2000:]
    s = run["metrics"]["samples"]
    assert s["samples_total"] == 2 * s["requests_ok"] > 4 and s["requests"] == s["requests_ok"]
    pass_ms = IMAGE_S * 2 * 512 * 512 / (1024 * 1024) / SPEEDUP * 1000  # 2 images of a quarter megapixel
    truth = _truth(engine)
    for ln in read_lines(sorted(out.glob("records*.jsonl"))):
        t = truth[ln["wire_id"]]
        assert t["path"] == "/v1/images/generations" and t["outcome"] == "ok" and ln["inputs"] == 2
        assert (t["done_ns"] - t["first_token_ns"]) / 1e6 >= pass_ms * 0.95
        assert ln["e2e_us"] / 1000 >= pass_ms * 0.95
