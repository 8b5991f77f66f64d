"""Responses API, embeddings and raw replay against the embedded engine; auth scheme, headers, extra body."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path

import pytest
from conftest import read_lines, run_cli, write_profile

from loadtest.profile.loader import ProfileError, load_profile
from loadtest.sim import SimProcess


@pytest.fixture(scope="module")
def engine():
    sim = SimProcess(speedup=20, seed=5)
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()


def _sent(sim: SimProcess) -> list[dict]:
    with urllib.request.urlopen(sim.base_url + "/sim/requests", timeout=10) as r:
        return json.loads(r.read())


def _run(prof: Path, out: Path, host: str | None, *extra: str) -> dict:
    args = ["run", "--profile", str(prof), "--out", str(out), "--no-telemetry", "--duration", "2", *extra]
    if host:
        args += ["--host", host]
    else:
        args += ["--engine-speedup", "20"]
    res = run_cli(args, timeout=120)
    run = json.loads((out / "run.json").read_text())
    assert res.returncode == run["verdict"]["exit_code"], res.stderr
    return run


def test_responses_api_streams_with_reasoning_and_a_verdict(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "r.yaml", api="responses", reasoning=True, output_tokens={"dist": "fixed", "value": 16}
    )
    run = _run(prof, tmp_path / "run", None, "--slo", "ttft_p50=30s,error_rate=1%")
    m = run["metrics"]
    assert run["verdict"]["status"] == "pass" and run["config"]["api"] == "responses"
    assert m["requests"]["ok"] > 5 and m["requests"]["failed"] == 0
    assert m["latency_ms"]["ttft"]["count"] == m["requests"]["ok"] and m["latency_ms"]["tpot"]["count"] > 0
    assert m["tokens"]["reasoning_total"] > 0 and m["tokens"]["usage_reports"] == m["requests"]["ok"]
    assert m["tokens"]["mismatched_requests"] == 0
    lines = read_lines(sorted((tmp_path / "run").glob("records*.jsonl")))
    ok = [ln for ln in lines if ln["outcome"] == "ok"]
    assert all(ln["api"] == "responses" and ln["output_tokens"] == 16 for ln in ok)
    # reasoning items come first: the first answer token never arrives before the first (reasoning)
    # token; both can land in one socket read (one kernel timestamp) when the stream is this short
    assert all(ln["first_answer_us"] >= ln["ttft_us"] for ln in ok)
    assert any(ln["first_answer_us"] > ln["ttft_us"] for ln in ok)
    assert all(
        ln["usage_reasoning_tokens"] and ln["reasoning_tokens"] == ln["usage_reasoning_tokens"] for ln in ok
    )


def test_responses_non_streamed_and_request_options_reach_the_server(
    engine: SimProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789")
    request = {
        "auth": "api-key-header",
        "headers": {"X-Tenant": "team-a"},
        "extra_body": {"priority": 5, "chat_template_kwargs": {"enable_thinking": False}},
    }
    prof = write_profile(tmp_path / "r.yaml", api="responses", stream=False, request=request)
    run = _run(prof, tmp_path / "run", engine.base_url, "--slo", "e2e_p50=30s")
    assert run["verdict"]["status"] == "pass" and run["metrics"]["requests"]["ok"] > 3
    sent = [r for r in _sent(engine) if r["path"] == "/v1/responses"]
    assert sent
    for r in sent:
        assert r["headers"]["api-key"] == "<18 chars>" and "authorization" not in r["headers"]
        assert r["headers"]["x-tenant"] == "team-a"
        assert r["body"]["priority"] == 5 and r["body"]["chat_template_kwargs"] == {"enable_thinking": False}
        assert r["body"]["stream"] is False and "max_output_tokens" in r["body"]
    # the default scheme is a Bearer token, and chat requests carry the extra body fields too
    prof = write_profile(tmp_path / "c.yaml", request={"extra_body": {"priority": 1}})
    _run(prof, tmp_path / "chat", engine.base_url)
    chat = [r for r in _sent(engine) if r["path"] == "/v1/chat/completions"]
    assert chat and all(r["headers"]["authorization"] == "Bearer <18 chars>" for r in chat)
    assert all(r["body"]["priority"] == 1 for r in chat)


def test_embeddings_inputs_per_second_and_a_verdict(engine: SimProcess, tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "e.yaml",
        api="embeddings",
        inputs_per_request=4,
        output_tokens=None,
        input_tokens={"dist": "fixed", "value": 32},
    )
    raw = json.loads(prof.read_text())
    del raw["output_tokens"]
    prof.write_text(json.dumps(raw))
    run = _run(prof, tmp_path / "run", engine.base_url, "--slo", "e2e_p50=30s,error_rate=1%")
    m = run["metrics"]
    assert run["verdict"]["status"] == "pass" and m["requests"]["ok"] > 5
    assert m["latency_ms"]["ttft"]["count"] == 0 and m["latency_ms"]["tpot"]["count"] == 0
    emb = m["embeddings"]
    assert emb["inputs_total"] == 4 * m["requests"]["ok"] and emb["inputs_per_s"] > 0
    assert emb["latency_ms"]["p50"] > 0 and emb["input_tokens_total"] == m["tokens"]["input_total"]
    lines = read_lines(sorted((tmp_path / "run").glob("records*.jsonl")))
    assert all(ln["inputs"] == 4 and ln["usage_prompt_tokens"] for ln in lines if ln["outcome"] == "ok")


def test_embeddings_faults_are_classified_like_chat(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "e.yaml", api="embeddings", input_tokens={"dist": "fixed", "value": 16})
    raw = json.loads(prof.read_text())
    del raw["output_tokens"]
    prof.write_text(json.dumps(raw))
    run = _run(prof, tmp_path / "run", None, "--engine-faults", "http_503=100%", "--slo", "error_rate=1%")
    assert run["verdict"]["status"] == "error_rate" and run["verdict"]["exit_code"] == 12
    assert run["metrics"]["requests"]["by_outcome"]["http_5xx"] == run["metrics"]["requests"]["completed"]


@pytest.mark.parametrize("processes", [[], ["--processes", "2"]], ids=["one-process", "two-workers"])
def test_raw_replay_sends_recorded_bodies_unchanged(
    engine: SimProcess, tmp_path: Path, processes: list[str]
) -> None:
    """Byte for byte as recorded; with --processes the workers' profile copies (in other folders) find
    the bodies file the profile names relative to itself."""
    bodies = [
        {
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 6,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "min_tokens": 6,
        },
        {
            "messages": [{"role": "user", "content": "a second one"}],
            "max_tokens": 4,
            "ignore_eos": True,
            "min_tokens": 4,
            "x_custom": {"keep": [1, 2]},
        },
    ]
    lines = [json.dumps(b, indent=None) for b in bodies]
    (tmp_path / "bodies.jsonl").write_text("\n".join(lines) + "\n")
    prof = write_profile(
        tmp_path / "raw.yaml", api="raw", raw={"file": "bodies.jsonl", "path": "/v1/chat/completions"}
    )
    raw = json.loads(prof.read_text())
    del raw["input_tokens"], raw["output_tokens"]
    prof.write_text(json.dumps(raw))
    run = _run(prof, tmp_path / "run", engine.base_url, "--slo", "e2e_p50=30s", *processes)
    assert run["verdict"]["status"] == "pass" and run["metrics"]["requests"]["failed"] == 0
    want = {hashlib.sha256(ln.encode()).hexdigest() for ln in lines}
    assert want <= {r["sha256"] for r in _sent(engine)}  # byte for byte as recorded: no model/stream added
    recs = read_lines(sorted((tmp_path / "run").glob("records*.jsonl")))
    assert {r["stream"] for r in recs} == {True, False} and all(r["api"] == "raw" for r in recs)


def test_profile_errors_name_the_key(tmp_path: Path) -> None:
    p = write_profile(tmp_path / "a.yaml", api="raw")
    with pytest.raises(ProfileError, match="raw"):
        load_profile(str(p))
    p = write_profile(tmp_path / "b.yaml", request={"extra_body": {"model": "x"}})
    with pytest.raises(ProfileError, match=r"request\.extra_body.*model"):
        load_profile(str(p))
    p = write_profile(tmp_path / "c.yaml", request={"auth": "basic"})
    with pytest.raises(ProfileError, match=r"request\.auth"):
        load_profile(str(p))


def test_an_endpoint_that_wants_an_api_key_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preflight and every request carry the key the profile's way; the wrong way is one clear line."""
    key = "sk-header-only-0123456789"
    monkeypatch.setenv("SIM_KEY", key)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    sim = SimProcess(
        speedup=20, seed=6, extra_args=["--api-key-env", "SIM_KEY", "--api-key-header", "api-key"]
    )
    sim.start()
    try:
        prof = write_profile(
            tmp_path / "h.yaml", request={"auth": "api-key-header", "auth_header": "api-key"}
        )
        run = _run(prof, tmp_path / "ok", sim.base_url, "--slo", "e2e_p50=30s")
        assert run["metrics"]["requests"]["ok"] > 3 and run["metrics"]["requests"]["failed"] == 0
        bearer = write_profile(tmp_path / "b.yaml")  # the default scheme: Bearer, which this server refuses
        res = run_cli(
            ["run", "--profile", str(bearer), "--host", sim.base_url, "--out", str(tmp_path / "no")]
        )
    finally:
        sim.stop()
    assert res.returncode == 1 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "HTTP 401" in res.stderr and "request.auth" in res.stderr and key not in res.stderr


def test_the_installed_locust_is_inside_the_tested_range_and_its_dispatcher_is_where_compat_reads_it() -> (
    None
):
    """locust/compat.py is the one place that uses Locust's internals; pyproject bounds Locust to its range."""
    from locust.env import Environment
    from locust.user import User

    from loadtest.locust.compat import TESTED_LOCUST, check_locust_version, users_dispatcher

    assert check_locust_version() == ""
    low, high = TESTED_LOCUST
    pins = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert f'"locust>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}"' in pins
    runner = Environment(user_classes=[User]).create_master_runner("127.0.0.1", 0)
    try:
        assert hasattr(runner, "_users_dispatcher") and users_dispatcher(runner) is None  # before a start
    finally:
        runner.quit()
