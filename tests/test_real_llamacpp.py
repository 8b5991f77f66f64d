"""Against llama.cpp's server (llama-cpp-python, SmolLM2-135M-Instruct): UUID request ids, no usage, interrupted requests.

That server rejects any X-Request-Id that is not a UUID, sends no usage chunk, has no /metrics, and by
default abandons a running request when a new one arrives (`interrupt_requests`), ending it with a bare
`[DONE]`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from real_engines import (
    LlamaCppServer,
    agent_trace_profile,
    print_figures,
    run_load,
    subagent_spans,
)

from loadtest.tokens.tokenizer import get_tokenizer

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]


def _profile(path: Path, concurrency: int) -> Path:
    path.write_text(
        json.dumps(
            {
                "name": "llamacpp-chat",
                "input_tokens": {"dist": "uniform", "min": 32, "max": 96},
                "output_tokens": {"dist": "uniform", "min": 16, "max": 48},
                "ignore_eos": True,
                "load": {"concurrency": concurrency},
                "duration_s": 10,
            }
        )
    )
    return path


def test_llamacpp_serves_every_request_and_the_run_says_what_it_could_not_know(tmp_path: Path) -> None:
    with LlamaCppServer(tmp_path / "server.log", interrupt_requests=False) as srv:
        res, run, records = run_load(
            ["--profile", str(_profile(tmp_path / "p.yaml", 2)), "--host", srv.url], tmp_path / "o"
        )
        server_log = srv.tail()
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:] + server_log
    assert records and all(r["outcome"] == "ok" for r in records), [r["error"] for r in records][:3]
    assert all(r["usage_completion_tokens"] is None for r in records)  # that server sends no usage
    assert all(r["output_tokens"] > 0 for r in records)  # so the client's count is the one used
    notes = " ".join(run["notes"])
    assert "without server usage" in notes and "tokenizer" in notes, run["notes"]  # loudly, in run.json too
    assert "tokenizer" in log
    assert not (run.get("telemetry") or {}).get("series")  # no /metrics there: nothing made up
    print_figures("llama.cpp", run, records)


def test_interrupted_requests_are_empty_and_fail_the_run(tmp_path: Path) -> None:
    with LlamaCppServer(tmp_path / "server.log", interrupt_requests=True) as srv:
        res, run, records = run_load(
            ["--profile", str(_profile(tmp_path / "p.yaml", 3)), "--host", srv.url], tmp_path / "o"
        )
    assert res.returncode != 0
    empty = [r for r in records if r["outcome"] == "empty"]
    assert empty, [(r["outcome"], r["error"]) for r in records][:5]
    assert run["metrics"]["latency_ms"]["e2e"]["count"] == run["metrics"]["requests"]["ok"]
    assert "empty" in run["verdict"]["reasons"][0], run["verdict"]["reasons"]


def test_a_sharegpt_dataset_runs_with_its_sessions_on_llamacpp(tmp_path: Path) -> None:
    """Real prompts on a real server: the sample conversations' system turns, histories and later turns
    are accepted by llama.cpp's chat template, and each answer is capped at the reference's length."""
    data = Path(__file__).resolve().parents[1] / "traffic_profiles" / "datasets" / "sharegpt.json"
    prof = tmp_path / "p.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "llamacpp-dataset",
                "dataset": {"path": str(data), "output_tokens": "reference"},
                "load": {"concurrency": 1},
                "duration_s": 10,
            }
        )
    )
    with LlamaCppServer(tmp_path / "server.log", interrupt_requests=False) as srv:
        res, run, records = run_load(["--profile", str(prof), "--host", srv.url], tmp_path / "o")
        server_log = srv.tail()
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:] + server_log
    assert records and all(r["outcome"] == "ok" for r in records), [r["error"] for r in records][:3]
    assert all(r["finish_reason"] in ("stop", "length") for r in records)
    later = [r for r in records if "." in r["id"] and not r["id"].endswith(".1")]
    assert later, [r["id"] for r in records]  # a conversation's later turns went out, with their history
    tokenizer = run["tokens"]["tokenizer"]["name"]  # the client's count (a guess here: no SmolLM2 tokenizer)
    tok = get_tokenizer(tokenizer)
    answers = [
        t["value"] for c in json.loads(data.read_text()) for t in c["conversations"] if t["from"] == "gpt"
    ]
    assert {r["requested_output_tokens"] for r in records} <= {
        tok.count(a) for a in answers
    }  # reference lengths
    print_figures("llama.cpp dataset", run, records)


def test_a_parquet_prompt_file_runs_on_llamacpp_with_the_dataset_text(tmp_path: Path) -> None:
    """Plain prompts from Parquet through the completions API: every prompt sent is a dataset row's text,
    and llama.cpp answers each one."""
    import pyarrow.parquet as pq

    data = Path(__file__).resolve().parents[1] / "traffic_profiles" / "datasets" / "prompts.parquet"
    prompts = {row["prompt"] for row in pq.read_table(data).to_pylist()}
    prof = tmp_path / "p.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "llamacpp-parquet",
                "api": "completions",
                "dataset": {"path": str(data), "output_tokens": "dataset"},
                "load": {"concurrency": 1},
                "duration_s": 8,
            }
        )
    )
    with LlamaCppServer(tmp_path / "server.log", interrupt_requests=False) as srv:
        res, run, records = run_load(
            ["--profile", str(prof), "--host", srv.url, "--capture", "1000"], tmp_path / "o"
        )
        server_log = srv.tail()
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:] + server_log
    assert records and all(r["outcome"] == "ok" for r in records), [r["error"] for r in records][:3]
    captured = [json.loads(x) for x in (tmp_path / "o" / "capture.jsonl").read_text().splitlines() if x]
    assert len(captured) == len(records)
    assert {json.loads(c["request"])["prompt"] for c in captured} <= prompts
    assert all(c["answer"] for c in captured)
    print_figures("llama.cpp parquet", run, records)


def test_recorded_agent_sessions_fan_out_and_reuse_llamacpp_s_prompt_cache(tmp_path: Path) -> None:
    """The shipped cc-traces sample on llama.cpp, one conversation at a time: the recorded subagents are
    sent side by side (its one slot serves them in turn), and its log shows each call reusing the
    context the call before left (`prefix-match hit`): the recorded prefix reuse reached the server."""
    with LlamaCppServer(tmp_path / "server.log", interrupt_requests=False) as srv:
        res, run, records = run_load(
            ["--profile", str(agent_trace_profile(tmp_path / "p.json", 25, 1)), "--host", srv.url],
            tmp_path / "o",
        )
        server_log = srv.log.read_text(errors="replace")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:] + server_log[-3000:]
    assert records and all(r["outcome"] == "ok" for r in records), [r["error"] for r in records][:3]
    # one slot on one core answers the first session's first calls in about 12-20 s: its fan-out is among them
    (a_start, a_end), (b_start, b_end) = subagent_spans(records, "cc-0")
    assert a_start < b_end and b_start < a_end  # both subagents sent before either was answered
    hits = [(int(h), int(m)) for h, m in PREFIX_HIT.findall(server_log)]
    reused = sum(h for h, _ in hits) / max(1, sum(h + m for h, m in hits))
    # every call but the first found a prefix of its prompt in the one context the slot keeps (the
    # subagents, served in turn, share the recorded system and tools prefix): measured 5 of 6, 0.50
    assert len(hits) >= len(records) - 1 and reused > 0.35, (hits, len(records), reused)
    line = f"llama.cpp agent trace: {len(hits)} of {len(records)} calls reused a cached prefix ({reused:.2f} of their tokens)"
    print("\n" + line)
    print_figures("llama.cpp agent trace", run, records)


PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")
