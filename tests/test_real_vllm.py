"""Against a real vLLM (its CPU build, a tiny local model), started by `loadtest serve vllm`: counts, failures, cache.

One vLLM serves the whole module (it takes about a minute to start). Every request's prompt and output
token counts must equal vLLM's own usage; the model's tokenizer is found from `/v1/models` without
being named; endpoint failures come first in the verdict; every sweep point sees a cold prefix cache.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_engines import (
    AGENT_SAMPLE,
    CLI,
    PIN_GENERATOR,
    ROOT,
    ServedVllm,
    agent_trace_profile,
    pid_alive,
    print_figures,
    run_load,
    subagent_spans,
)

from loadtest.traces.agent_graph import prefix_ceiling
from loadtest.traces.cctraces import read_cc_conversations

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-llama") / "tiny-llama"
    subprocess.run([*CLI[:1], str(ROOT / "servers" / "tiny_llama.py"), str(out)], check=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedVllm]:
    served = ServedVllm(tiny_model, tmp_path_factory.mktemp("vllm"))
    try:
        served.wait_ready()
        yield served
    finally:
        served.stop()
    pids = [p["pid"] for p in served.server.get("processes", [])]
    assert pids and not any(pid_alive(p) for p in pids), "vLLM outlived its launcher"


def test_the_launcher_starts_and_records_the_real_vllm(vllm: ServedVllm, tiny_model: Path) -> None:
    doc = vllm.server
    assert doc["engine"] == "vllm" and doc["version"].startswith("0.")  # vLLM's own /version
    assert doc["preset"] == "tiny-llama-cpu" and doc["model"] == str(tiny_model)
    (proc,) = doc["processes"]
    assert "vllm.entrypoints.openai.api_server" in proc["argv"]
    assert proc["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and pid_alive(proc["pid"])
    models = json.loads(
        subprocess.run(["curl", "-s", vllm.url + "/v1/models"], capture_output=True, text=True).stdout
    )
    assert models["data"][0]["id"] == "tiny-llama" and models["data"][0]["max_model_len"] == 8192


def test_every_request_counts_like_the_server(vllm: ServedVllm, tmp_path: Path) -> None:
    """The default profile names llama3; the served model's own tokenizer (its folder, from /v1/models
    `root`, with chat_template.jinja) is found and used, and then every count equals vLLM's usage."""
    env_state = {"LOADTEST_STATE_DIR": str(vllm.state_dir)}
    res, run, records = run_load(
        ["--host", vllm.url, "--duration", "12", "--concurrency", "4"], tmp_path / "o", env=env_state
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ok = [r for r in records if r["outcome"] == "ok"]
    assert len(ok) >= 8 and len(ok) == len(records)
    one_token_chunks = 0
    for r in ok:
        assert r["prompt_tokens"] == r["usage_prompt_tokens"], r["id"]
        assert r["output_tokens"] == r["usage_completion_tokens"] == r["requested_output_tokens"], r["id"]
        # the MLPerf Endpoints counts (plain text, as its reference client counts it): the whole answer,
        # and what followed its first chunk. vLLM streams one token a chunk, except where it holds a token
        # back (an incomplete UTF-8 character from a random model) and sends it with the next one.
        usage = r["usage_completion_tokens"]
        assert r["endpoints_output_tokens"] == usage, r["id"]
        merged = usage - len(r["chunk_chars"])
        assert merged >= 0, r["id"]
        assert usage - 1 - merged <= r["endpoints_tpot_tokens"] <= usage - 1, r["id"]
        if merged == 0:
            one_token_chunks += 1
            assert r["endpoints_tpot_tokens"] == usage - 1, r["id"]
    assert one_token_chunks >= len(ok) // 2
    assert "tiny-llama" in run["config"]["tokenizer"]  # the model's folder, not the profile's llama3
    assert run["endpoint"]["server"]["engine"] == "vllm"  # what `loadtest serve` started, recorded
    tel = run["telemetry"]
    assert tel["engine"] == "vllm"
    for series in ("requests_running", "kv_cache_usage"):
        assert any(v is not None for v in tel["series"][series]), series
    server = tel["server_latency"]["metrics"]
    assert server["ttft"]["count"] >= len(ok) - 4  # requests vLLM finished inside the polled window
    lat = run["metrics"]["latency_ms"]
    for name in ("ttft", "e2e"):  # the client's median is the server's plus what network and client add
        bucket = server[name]["p50_bucket_ms"]
        assert lat[name]["p50"] >= 0.5 * bucket[0], (name, lat[name]["p50"], bucket)
    print_figures("vllm", run, records)


def test_an_endpoint_that_rejects_everything_fails_with_its_own_error_first(
    vllm: ServedVllm, tmp_path: Path
) -> None:
    prof = tmp_path / "bad.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "bad-params",
                "input_tokens": {"dist": "fixed", "value": 32},
                "output_tokens": {"dist": "fixed", "value": 8},
                "request": {"extra_body": {"temperature": -1}},  # vLLM: HTTP 400 for every request
                "load": {"concurrency": 2},
                "duration_s": 6,
            }
        )
    )
    res, run, records = run_load(["--profile", str(prof), "--host", vllm.url], tmp_path / "o")
    assert res.returncode != 0
    assert records and all(r["outcome"] == "http_4xx" for r in records)
    first = run["verdict"]["reasons"][0]
    assert "http_4xx" in first and "temperature" in first, run["verdict"]["reasons"]
    assert "load generator" not in first


def test_prompts_longer_than_the_context_are_flagged_then_classified(
    vllm: ServedVllm, tmp_path: Path
) -> None:
    prof = tmp_path / "long.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "long-prompts",
                "tokenizer": "llama3",
                "input_tokens": {"dist": "uniform", "min": 4000, "max": 12000},
                "output_tokens": {"dist": "fixed", "value": 4},
                "load": {"concurrency": 1},
                "duration_s": 8,
            }
        )
    )
    res, run, records = run_load(
        ["--profile", str(prof), "--host", vllm.url, "--slo", "error_rate=100%"], tmp_path / "o"
    )
    log = res.stdout + res.stderr
    assert "need more than the model's context of 8192 tokens" in log, log[-3000:]
    outcomes = {r["outcome"] for r in records}
    assert "context_length" in outcomes, [(r["outcome"], r["error"]) for r in records][:5]
    assert outcomes <= {"ok", "context_length"}
    refused = next(r for r in records if r["outcome"] == "context_length")
    assert "maximum context length" in refused["error"]  # vLLM's own words, kept


def test_a_sweep_with_the_default_profile_is_cold_at_every_point(vllm: ServedVllm, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    argv = [
        *PIN_GENERATOR,
        *CLI,
        "sweep",
        "--host",
        vllm.url,
        "--points",
        "1,4",
        "--no-offline",
        "--point-duration",
        "8",
    ]
    res = subprocess.run(
        [*argv, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert (out / "sweep.json").exists(), res.stdout[-3000:] + res.stderr[-3000:]
    sweep = json.loads((out / "sweep.json").read_text())
    points = sweep["points"]
    assert len(points) == 2
    for p in points:
        rate = p["prefix_cache_hit_rate"]
        assert rate is not None and rate < 0.2, (p["label"], rate)
        assert p["warm_cache"] is False, p["label"]


DATASETS = ROOT / "traffic_profiles" / "datasets"


def _captured(out: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for p in sorted(out.glob("capture*.jsonl")) for line in p.read_text().splitlines()
    ]


def _dataset_run(
    vllm: ServedVllm, tmp_path: Path, name: str, **profile: Any
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """An 8 s dataset run against ``vllm`` with every request captured; run.json, the records (all
    ok) and the capture lines."""
    prof = tmp_path / "p.yaml"
    prof.write_text(
        json.dumps({"name": name, "ignore_eos": True, "load": {"concurrency": 2}, "duration_s": 8, **profile})
    )
    env_state = {"LOADTEST_STATE_DIR": str(vllm.state_dir)}
    res, run, records = run_load(
        ["--profile", str(prof), "--host", vllm.url, "--capture", "1000"], tmp_path / "o", env=env_state
    )
    assert records and all(r["outcome"] == "ok" for r in records), (res.stderr[-2000:], records[:2])
    return run, records, _captured(tmp_path / "o")


def test_a_parquet_prompt_file_reaches_vllm_as_written(vllm: ServedVllm, tmp_path: Path) -> None:
    """Completions with `echo`: vLLM streams back the prompt it received, so the server itself shows
    that every prompt is the dataset's text, byte for byte; its prompt token count equals the client's."""
    import pyarrow.parquet as pq

    rows = pq.read_table(DATASETS / "prompts.parquet").to_pylist()
    run, records, captured = _dataset_run(
        vllm,
        tmp_path,
        "vllm-parquet",
        api="completions",
        dataset={"path": str(DATASETS / "prompts.parquet"), "output_tokens": "dataset"},
        request={"extra_body": {"echo": True}},
    )
    prompts = {row["prompt"] for row in rows}
    assert len(captured) == len(records)
    for c in captured:
        sent = json.loads(c["request"])["prompt"]
        assert sent in prompts, sent[:80]  # the dataset's text, not a length-fitted stand-in
        assert c["answer"].startswith(sent), (sent[:60], c["answer"][:120])  # what vLLM received
    assert {r["prompt_tokens"] for r in records} and all(
        r["prompt_tokens"] == r["usage_prompt_tokens"] for r in records
    )
    print_figures("vllm parquet", run, records)


def test_a_sharegpt_file_reaches_vllm_with_its_turns_and_counts(vllm: ServedVllm, tmp_path: Path) -> None:
    """Chat from ShareGPT conversations: every message sent is the dataset's, and vLLM's prompt token
    count (its chat template over those messages) equals the client's for every request."""
    convs = json.loads((DATASETS / "sharegpt.json").read_text())
    turns = {t["value"] for c in convs for t in c["conversations"] if t["from"] in ("human", "system")}
    run, records, captured = _dataset_run(
        vllm,
        tmp_path,
        "vllm-sharegpt",
        dataset={"path": str(DATASETS / "sharegpt.json"), "output_tokens": "reference"},
    )
    for c in captured:
        messages = json.loads(c["request"])["messages"]
        sent = {m["content"] for m in messages if m["role"] in ("user", "system")}
        assert sent <= turns, sorted(sent - turns)[:1]
    assert all(r["prompt_tokens"] == r["usage_prompt_tokens"] for r in records), [
        (r["prompt_tokens"], r["usage_prompt_tokens"]) for r in records
    ][:5]
    assert any("." in r["id"] and not r["id"].endswith(".1") for r in records)  # later turns went out
    print_figures("vllm sharegpt", run, records)


def test_accuracy_against_the_tiny_model_fails_and_says_so(vllm: ServedVllm, tmp_path: Path) -> None:
    """The tiny model's random words answer every sample, and the accuracy run fails on its scores
    (exit 14, the missed targets named), not on the endpoint."""
    sample = ROOT / "tests" / "data" / "accuracy" / "cnn_eval_sample.json"
    out = tmp_path / "acc"
    res = subprocess.run(
        [*CLI, "accuracy", f"llama3.1-8b:{sample}", "--host", vllm.url, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 14, res.stdout[-2000:] + res.stderr[-2000:]
    line = res.stdout.splitlines()[-2]
    assert "FAIL: rouge1" in line and "< 38.3914" in line, line
    result = json.loads((out / "accuracy.json").read_text())
    assert result["answered"] == result["samples"] == 4 and not result["passed"]
    assert result["scores"]["rouge1"] < 38.3914


def test_recorded_agent_sessions_fan_out_and_reuse_vllm_s_prefix_cache(
    vllm: ServedVllm, tmp_path: Path
) -> None:
    """The shipped cc-traces sample, one conversation at a time: the recorded subagents reach vLLM side
    by side, every call counts like vLLM's usage, and vLLM's own prefix-cache counters show the
    recorded reuse (each call resends the previous one's context)."""
    env_state = {"LOADTEST_STATE_DIR": str(vllm.state_dir)}
    res, run, records = run_load(
        ["--profile", str(agent_trace_profile(tmp_path / "p.json", 12, 1)), "--host", vllm.url],
        tmp_path / "o",
        env=env_state,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert records and all(r["outcome"] == "ok" for r in records), [r["error"] for r in records][:3]
    assert all(r["output_tokens"] == r["usage_completion_tokens"] for r in records)
    calls = read_cc_conversations(AGENT_SAMPLE)[0].calls()
    assert sum(r["session"] == "cc-0" for r in records) == len(calls)  # the whole first session went out
    (a_start, a_end), (b_start, b_end) = subagent_spans(records, "cc-0")
    assert a_start < b_end and b_start < a_end  # both subagents in flight at once, with one conversation
    cache = run["prefix_cache"]
    ceiling = prefix_ceiling(read_cc_conversations(AGENT_SAMPLE)).hit_rate
    # vLLM caches whole 16-token blocks of its own tokens: the recorded reuse, less the partial blocks
    # (measured 0.552 against 0.595)
    assert ceiling - 0.12 <= cache["hit_rate"] <= ceiling + 0.05, (cache, ceiling)
    assert "vllm:prefix_cache_hits_total" in cache["source"]
    assert not any("warm prefix cache" in n for n in run["notes"])
    line = f"vllm agent trace: prefix-cache hit rate {cache['hit_rate']:.3f} (the recording's ceiling {ceiling:.3f})"
    print("\n" + line)
    print_figures("vllm agent trace", run, records)
