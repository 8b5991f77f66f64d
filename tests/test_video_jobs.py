"""Video generation: the reference client's ``videogen`` shape (``api: videogen``): whatever a server
answers is one endpoint outcome, runs against the embedded engine match its truth and its cost model,
and the shipped Wan 2.2 profiles run with a valid verdict (docs/api-surface.md, "Video generation")."""

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
from loadtest.sim.routes.videogen import fake_mp4, generation_s
from loadtest.tokens.tokenizer import get_tokenizer
from tests.fault_servers import FaultServer

CLIENT = OpenAIClient("http://127.0.0.1:9", "wan22", get_tokenizer("llama3"))  # never connects: reads only
SPEEDUP = 200


def _classify(body: bytes, status: int = 200, ctype: str = "application/json") -> RequestRecord:
    resp = Response(status, {"content-type": ctype}, 1, [body], [5], complete=True)
    req = PreparedRequest("r", "videogen", {"prompt": "a cat"}, 3, None, stream=False)
    rec = RequestRecord("r", stream=False)
    if not classify_http(rec, resp):
        adapter_for("videogen").classify(CLIENT, rec, req, resp)
    return rec


def test_the_request_carries_the_prompt_and_the_profiles_fields_without_a_model() -> None:
    client = OpenAIClient("http://127.0.0.1:9", "wan22", get_tokenizer("llama3"))
    client.extra_body = {"num_frames": 81, "response_format": "video_path"}
    raw = client.encode(PreparedRequest("q", "videogen", {"prompt": "a cat"}, 3, None, stream=False)).decode()
    assert raw.startswith("POST /v1/videos/generations HTTP/1.1\r\n")
    body = json.loads(raw.split("\r\n\r\n", 1)[1])
    assert body == {"prompt": "a cat", "num_frames": 81, "response_format": "video_path"}


def test_a_video_answer_is_a_path_base64_bytes_or_the_mp4_itself() -> None:
    assert _classify(b'{"video_id": "v1", "video_path": "/videos/v1.mp4"}').outcome == "ok"
    b64 = base64.b64encode(fake_mp4("v1")).decode()
    rec = _classify(json.dumps({"video_id": "v1", "video_bytes": b64}).encode())
    assert rec.outcome == "ok" and rec.inputs == 1 and rec.done_ns == 5
    assert _classify(fake_mp4("v1"), ctype="video/mp4").outcome == "ok"
    for body, says in [
        (b'{"video_id": "v1"}', "no video_id with a video_path"),
        (b'{"video_path": "/v.mp4"}', "no video_id with a video_path"),
        (b'{"video_id": "v1", "video_bytes": "***"}', "not base64"),
        (b"\x00\x00\x00\x10moov", "not JSON"),
    ]:
        rec = _classify(body)
        assert rec.outcome == "protocol_error" and says in rec.error, (body, rec.error)
    assert _classify(b'{"error": {"message": "out of memory"}}').outcome == "stream_error"
    assert _classify(b'{"detail": "busy"}', status=503).outcome == "http_5xx"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.dictionaries(
            st.sampled_from(["video_id", "video_path", "video_bytes", "error"]),
            st.none() | st.text(max_size=8) | st.integers() | st.lists(st.integers(), max_size=2),
            max_size=4,
        ).map(lambda d: json.dumps(d).encode()),
        st.binary(max_size=40),
        st.binary(max_size=20).map(lambda b: b"\0\0\0\x10ftyp"[: len(b) % 9] + b),
    )
)
def test_no_answer_makes_the_reader_raise(body: bytes) -> None:
    rec = _classify(body)
    assert rec.outcome in OUTCOMES and rec.outcome != "cancelled"
    assert (rec.outcome == "ok") == (not rec.error)


def test_hostile_servers_give_endpoint_outcomes() -> None:
    schedule = ["html_502", "json_not_sse", "redirect_307", "never_answer"]
    want = ["http_5xx", "protocol_error", "protocol_error", "timeout"]
    with FaultServer(schedule) as srv:
        # the fault server answers POSTs to a completions path: a host URL that fixes the path
        client = OpenAIClient(srv.base_url + "/v1/completions", None, get_tokenizer("llama3"))
        client.timeouts.read = 0.5
        try:
            got = []
            for i in range(len(schedule)):
                req = PreparedRequest(f"h-{i}", "videogen", {"prompt": "x"}, 1, None, stream=False)
                got.append(client.send(req, 0, 0.0).outcome)
        finally:
            client.close()
    assert got == want


# ---- against the embedded engine ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine():
    with SimProcess(speedup=SPEEDUP, seed=5) as sim:
        yield sim


def _truth(sim: SimProcess) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(sim.base_url + "/sim/truth", timeout=10) as r:
        return {t["request_id"]: t for t in map(json.loads, r.read().decode().splitlines())}


def _run(args: list[str], out: Path) -> dict[str, Any]:
    res = run_cli(["run", *args, "--out", str(out), "--no-telemetry"], timeout=180)
    run = json.loads((out / "run.json").read_text())
    assert res.returncode == run["verdict"]["exit_code"] == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return run


def test_a_videogen_run_matches_the_engines_truth_and_cost_model(engine: SimProcess, tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "v.yaml",
        api="videogen",
        input_tokens={"dist": "fixed", "value": 30},
        load={"concurrency": 2},
        request={"extra_body": {"num_frames": 41, "num_inference_steps": 10, "size": "480x832"}},
    )
    data = json.loads(prof.read_text())
    del data["output_tokens"]
    prof.write_text(json.dumps(data))
    run = _run(["--profile", str(prof), "--duration", "3", "--host", engine.base_url], tmp_path / "run")
    s = run["metrics"]["samples"]
    assert s["requests"] == s["requests_ok"] == s["samples_total"] == run["metrics"]["requests"]["ok"] > 5
    pass_ms = generation_s(41, 10, 480, 832) / SPEEDUP * 1000
    truth = _truth(engine)
    for ln in read_lines(sorted((tmp_path / "run").glob("records*.jsonl"))):
        t = truth[ln["wire_id"]]
        assert t["path"] == "/v1/videos/generations" and t["outcome"] == "ok" and ln["outcome"] == "ok"
        assert (t["done_ns"] - t["first_token_ns"]) / 1e6 >= pass_ms * 0.95  # the modelled generation
        assert ln["e2e_us"] / 1000 >= pass_ms * 0.95
    # two streams on one device: a video waits for the other's pass
    waits = [
        (t["first_token_ns"] - t["arrival_ns"]) / 1e6
        for t in truth.values()
        if t["path"].endswith("generations")
    ]
    assert max(waits) >= pass_ms * 0.5


@pytest.mark.parametrize("scenario", ["singlestream", "offline"])
def test_the_shipped_wan_profiles_run_with_a_valid_verdict(
    engine: SimProcess, tmp_path: Path, scenario: str
) -> None:
    args = ["--profile", f"mlperf-wan2.2-{scenario}", "--duration", "3", "--smoke", "--host", engine.base_url]
    run = _run(args, tmp_path / "run")
    s = run["metrics"]["samples"]
    assert s["samples_total"] == s["requests_ok"] > 0 and run["verdict"]["status"] != "invalid"
    p50 = s["latency_ms"]["p50"]
    alone_ms = generation_s(81, 20, 720, 1280) / SPEEDUP * 1000  # 21 s over the speedup
    assert p50 >= alone_ms * 0.95 and (scenario == "offline" or p50 < alone_ms * 3)


# ---- the job API: create, poll, download ---------------------------------------------------------------
POLL_S = 0.02


def test_a_job_run_records_its_parts_against_the_engines_truth(engine: SimProcess, tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "j.yaml",
        api="video_jobs",
        input_tokens={"dist": "fixed", "value": 30},
        load={"concurrency": 2},
        poll_interval_s=POLL_S,
        request={"extra_body": {"seconds": "4", "size": "480x832"}},
    )
    data = json.loads(prof.read_text())
    del data["output_tokens"]
    prof.write_text(json.dumps(data))
    run = _run(["--profile", str(prof), "--duration", "3", "--host", engine.base_url], tmp_path / "run")
    s = run["metrics"]["samples"]
    assert s["requests"] == s["requests_ok"] == s["samples_total"] > 5
    gen_ms = generation_s(4 * 16 + 1, 20, 480, 832) / SPEEDUP * 1000
    truth = _truth(engine)
    slack_ms = POLL_S * 1000 + 100  # a poll sees a change up to one interval late (plus its round trip)
    queued_seen = 0
    for ln in read_lines(sorted((tmp_path / "run").glob("records*.jsonl"))):
        t = truth[ln["wire_id"]]
        assert t["path"] == "/v1/videos" and t["outcome"] == "ok" and ln["outcome"] == "ok"
        submit, queued, generating, download = (us / 1000 for us in ln["job_us"])
        # the parts add up to the send-to-content time (E2E counts from the schedule: less sent_us)
        assert abs(submit + queued + generating + download - (ln["e2e_us"] - ln["sent_us"]) / 1000) < 1
        served_gen = (t["done_ns"] - t["first_token_ns"]) / 1e6
        served_wait = (t["first_token_ns"] - t["arrival_ns"]) / 1e6
        assert served_gen >= gen_ms * 0.95
        assert served_gen - slack_ms <= generating <= served_gen + slack_ms + served_wait
        assert queued <= served_wait + slack_ms and download > 0
        queued_seen += queued > 0
    assert queued_seen  # two streams, one device: some jobs waited, and the polls saw it


def _job_answer(client: OpenAIClient, body: dict[str, Any]) -> RequestRecord:
    """A create answer of ``body`` read by the job adapter of ``client`` (which then polls its server)."""
    resp = Response(
        200, {"content-type": "application/json"}, 1, [json.dumps(body).encode()], [5], complete=True
    )
    req = PreparedRequest("r", "video_jobs", {"prompt": "x"}, 1, None, stream=False, poll_s=POLL_S)
    rec = RequestRecord("r", stream=False)
    adapter_for("video_jobs").classify(client, rec, req, resp)
    return rec


def test_job_answers_that_are_not_jobs_or_jobs_that_fail_are_endpoint_outcomes(engine: SimProcess) -> None:
    client = OpenAIClient(engine.base_url, None, get_tokenizer("llama3"))
    try:
        failed = {"id": "video_1", "status": "failed", "error": {"message": "moderation blocked"}}
        rec = _job_answer(client, failed)
        assert rec.outcome == "stream_error" and "moderation blocked" in rec.error
        for body in (
            {"status": "queued"},
            {"id": "video_1", "status": "done"},
            {"id": "a/b", "status": "queued"},
        ):
            assert _job_answer(client, body).outcome == "protocol_error", body
        rec = _job_answer(client, {"id": "video_unknown", "status": "queued"})  # the engine never made it
        assert rec.outcome == "http_4xx" and "no such job" in rec.error
    finally:
        client.close()
    with FaultServer(["html_502", "json_not_sse"]) as srv:
        client = OpenAIClient(srv.base_url + "/v1/completions", None, get_tokenizer("llama3"))
        try:
            got = [
                client.send(
                    PreparedRequest(f"h{i}", "video_jobs", {"prompt": "x"}, 1, None, stream=False), 0, 0.0
                ).outcome
                for i in range(2)
            ]
        finally:
            client.close()
    assert got == ["http_5xx", "protocol_error"]


def test_a_job_past_the_total_timeout_is_a_timeout_and_a_refused_create_an_http_outcome(
    engine: SimProcess,
) -> None:
    client = OpenAIClient(engine.base_url, None, get_tokenizer("llama3"))
    client.timeouts.total = 0.4  # a 60 s video takes 21 s × 961 / 81 over the speedup: over a second
    client.extra_body = {"seconds": "60"}
    try:
        req = PreparedRequest("long", "video_jobs", {"prompt": "x"}, 1, None, stream=False, poll_s=POLL_S)
        rec = client.send(req, 0, 0.0)
        refused = PreparedRequest("busy", "video_jobs", {"prompt": "x"}, 1, None, stream=False)
        refused.extra_headers = {"X-Loadtest-Fault": "http_503"}
        busy = client.send(refused, 0, 0.0)
    finally:
        client.close()
    assert rec.outcome == "timeout" and "still" in rec.error and rec.job_us == []
    assert busy.outcome == "http_5xx" and _truth(engine)[busy.wire_id or ""]["outcome"] == "http_503"
