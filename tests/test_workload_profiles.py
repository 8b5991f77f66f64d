"""Profiles turned into traffic: trace-derived shapes, exact prompt lengths, sessions, shared prefixes, replay."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from loadtest.client.record import RequestRecord
from loadtest.profile.loader import load_profile
from loadtest.profile.schema import Profile
from loadtest.run.inputs import SCHEDULE_TAIL_S
from loadtest.sim import SimProcess
from loadtest.traces import read_trace, trace_stats
from loadtest.workload.builder import Workload
from loadtest.workload.lengths import sample_length
from loadtest.workload.salt import SALT_TOKENS
from tests.conftest import read_lines, run_cli

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
# Sampled quantiles of a 20k-request workload against the trace's own: within 3 % (or 2 tokens).
QUANTILE_TOLERANCE = 0.03
CV_TOLERANCE = 0.10


def derived(name: str) -> dict:
    return yaml.safe_load((ROOT / "traffic_profiles" / "derived" / f"{name}.yaml").read_text())


def close(a: float, b: float, rel: float, abs_: float = 2.0) -> bool:
    return abs(a - b) <= max(abs_, rel * abs(b))


@pytest.mark.parametrize(
    ("profile", "trace"), [("azure-conversation", "azure-conv"), ("azure-code", "azure-code")]
)
def test_trace_derived_profile_reproduces_lengths_and_burstiness(profile: str, trace: str) -> None:
    prof, _ = load_profile(profile)
    stats = derived(trace)["stats"]
    w = Workload(prof)
    n = 20_000
    reqs = [w.request(i) for i in range(n)]
    prompt = np.array([r.prompt_tokens for r in reqs])
    output = np.array([r.requested_output_tokens for r in reqs])
    for q in (10, 50, 90, 99):
        got_in, want_in = np.percentile(prompt, q), stats["input_tokens"][f"p{q}"]
        got_out, want_out = np.percentile(output, q), stats["output_tokens"][f"p{q}"]
        # p10 and p99 sit on steep parts of these distributions (p99 rests on 200 of 20k draws): a wider
        # tolerance there covers sampling error, not a worse fit.
        tol = {50: QUANTILE_TOLERANCE, 90: QUANTILE_TOLERANCE, 10: 0.08, 99: 0.15}[q]
        assert close(got_in, want_in, tol), (q, got_in, want_in)
        assert close(got_out, want_out, tol), (q, got_out, want_out)
    # The sample mean of gamma gaps with CV c has a relative error of c/√n: 1M arrivals for CV 13.
    n_arrivals = max(50_000, int((3.5 * stats["interarrival_cv"] / 0.05) ** 2))
    offsets = np.fromiter((t for _, t in zip(range(n_arrivals), w.arrival_offsets(), strict=False)), float)
    gaps = np.diff(offsets)
    assert close(1 / gaps.mean(), stats["mean_rate_rps"], 0.05, 0)
    assert close(gaps.std() / gaps.mean(), stats["interarrival_cv"], CV_TOLERANCE, 0)


@pytest.mark.parametrize("tokenizer", ["llama3", "o200k"])
def test_prompts_hit_their_length_within_one_percent(tmp_path: Path, tokenizer: str) -> None:
    prof, _ = load_profile("interactive-chat")
    prof = prof.model_copy(update={"tokenizer": tokenizer})
    w = Workload(prof)
    sc = prof.scenarios[0]
    # The system prompt, the chat template and the run salt (run_salt: per_run) are in every request:
    # no prompt is shorter than they are plus one token of its own.
    overhead = w.request(0).prompt_tokens - w.tokenizer.count(w.request(0).body["messages"][-1]["content"])
    floor = overhead + SALT_TOKENS + 1
    checked = 0
    for i in range(300):
        target = sample_length(sc.input_tokens, random.Random(f"{prof.seed}:{i}"))
        got = w.request(i).prompt_tokens
        if target < floor:
            assert got <= floor + 1
            continue
        assert abs(got - target) <= max(1, 0.01 * target), (i, got, target)
        checked += 1
    assert checked > 250


def test_a_session_resends_the_servers_actual_answers() -> None:
    prof = Profile.model_validate(
        {
            "name": "mt",
            "load": {"concurrency": 1},
            "scenarios": [
                {
                    "name": "mt",
                    "kind": "multi_turn",
                    "input_tokens": {"dist": "fixed", "value": 40},
                    "output_tokens": {"dist": "fixed", "value": 8},
                    "session": {
                        "turns": {"dist": "fixed", "value": 3},
                        "think_time_s": {"dist": "fixed", "value": 0},
                    },
                }
            ],
        }
    )
    unit = Workload(prof).unit(0)
    first = unit.next(None)
    assert first is not None
    answer = " the real answer that the server streamed"
    rec = RequestRecord(request_id="r", outcome="ok", answer_text=answer)
    second = unit.next(rec)
    assert second is not None
    msgs = second.request.body["messages"]
    assert msgs[: len(first.request.body["messages"])] == first.request.body["messages"]
    assert {"role": "assistant", "content": answer} in msgs
    assert second.request.prompt_tokens > first.request.prompt_tokens
    failed = RequestRecord(request_id="r2", outcome="http_5xx")
    assert unit.next(failed) is None  # a failed turn ends the session


def test_multi_turn_run_carries_history_to_the_engine(tmp_path: Path) -> None:
    prof = tmp_path / "mt.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "mt",
                "duration_s": 3,
                "load": {"concurrency": 2},
                "scenarios": [
                    {
                        "name": "mt",
                        "kind": "multi_turn",
                        "input_tokens": {"dist": "fixed", "value": 60},
                        "output_tokens": {"dist": "fixed", "value": 20},
                        "session": {
                            "turns": {"dist": "fixed", "value": 3},
                            "think_time_s": {"dist": "fixed", "value": 0.05},
                        },
                    }
                ],
            }
        )
    )
    with SimProcess(speedup=8) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / "o")])
    assert res.returncode == 0, res.stderr
    recs = [r for r in read_lines([tmp_path / "o" / "records.jsonl"]) if r["outcome"] == "ok"]
    by_session: dict[str, list[dict]] = {}
    for r in recs:
        session, _, call = r["id"].rpartition(".")
        by_session.setdefault(session, []).append(r)
    complete = [sorted(v, key=lambda r: r["t"]) for v in by_session.values() if len(v) == 3]
    assert complete
    for turns in complete:
        for prev, nxt in zip(turns, turns[1:], strict=False):
            # The engine counted what it received: the whole history, the previous answer included.
            assert nxt["usage_prompt_tokens"] == nxt["prompt_tokens"]
            assert nxt["prompt_tokens"] >= prev["prompt_tokens"] + prev["output_tokens"] + 60


def test_shared_prefix_groups_make_the_engine_report_cached_tokens(tmp_path: Path) -> None:
    prof = tmp_path / "px.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "px",
                "duration_s": 3,
                "load": {"concurrency": 4},
                "scenarios": [
                    {
                        "name": "px",
                        "input_tokens": {"dist": "fixed", "value": 3000},
                        "output_tokens": {"dist": "fixed", "value": 8},
                        "prefix": {"groups": 2, "tokens": 2048},
                    }
                ],
            }
        )
    )
    with SimProcess(speedup=4) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / "o")])
    assert res.returncode == 0, res.stderr
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    tokens = run["metrics"]["tokens"]
    assert tokens["usage_cached_total"] > 0.5 * tokens["input_total"]  # ~2/3 of every prompt is shared


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"public traces not found at {TRACES}")
def test_mooncake_replay_turns_hash_ids_into_real_shared_prefixes(tmp_path: Path) -> None:
    trace = TRACES / "mooncake-fast25" / "conversation_trace.jsonl"
    prof = tmp_path / "replay.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "replay",
                "load": {
                    "trace": {"path": str(trace), "format": "mooncake", "max_requests": 400, "speedup": 20}
                },
                "scenarios": [{"name": "replay", "kind": "trace"}],
            }
        )
    )
    # A KV cache large enough to keep every block: the hits then measure the replayed reuse alone
    # (with a real cache size, LRU eviction lowers them, as it does on a real server).
    with SimProcess(gpu="H200", speedup=20, extra_args=["--kv-blocks", "400000"]) as sim:
        res = run_cli(
            ["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / "o")], timeout=240
        )
    assert res.returncode == 0, res.stderr
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    recs = read_lines([tmp_path / "o" / "records.jsonl"])
    assert len(recs) == 400 and all(r["outcome"] == "ok" for r in recs)
    tokens = run["metrics"]["tokens"]
    # The engine's prefix cache sees the reuse the trace had (14 % of these requests' tokens, counted
    # with an infinite cache); it caches only full 16-token blocks, hence the lower bound.
    expected = trace_stats(read_trace(trace, "mooncake")[:400])["prefix_reuse_token_share"]
    share = tokens["usage_cached_total"] / tokens["input_total"]
    assert 0.75 * expected <= share <= 1.05 * expected, (share, expected)


def _stage_profile(tmp_path: Path, stages: list[dict]) -> Path:
    path = tmp_path / "stages.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "stages",
                "load": {"stages": stages},
                "input_tokens": {"dist": "fixed", "value": 32},
                "output_tokens": {"dist": "fixed", "value": 16},
            }
        )
    )
    return path


def test_rate_stages_follow_their_rates_and_end_by_themselves(tmp_path: Path) -> None:
    prof = _stage_profile(tmp_path, [{"duration_s": 2, "rate": 5}, {"duration_s": 2, "rate": 20}])
    with SimProcess(speedup=8) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / "o")])
    assert res.returncode == 0, res.stderr
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    # The schedule's own length, and the tail that lets its last arrival be sent.
    assert abs(run["config"]["duration_s"] - (4.0 + SCHEDULE_TAIL_S)) < 0.01
    recs = read_lines([tmp_path / "o" / "records.jsonl"])
    t0 = min(r["t"] for r in recs)
    first = sum(1 for r in recs if r["t"] - t0 < 2)
    second = len(recs) - first
    assert 4 <= first <= 18 and 25 <= second <= 60, (first, second)  # 10 and 40 expected


def test_concurrency_stages_change_the_number_of_streams(tmp_path: Path) -> None:
    prof = _stage_profile(
        tmp_path, [{"duration_s": 2, "concurrency": 1}, {"duration_s": 2, "concurrency": 6}]
    )
    with SimProcess(speedup=2) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / "o")])
    assert res.returncode == 0, res.stderr
    recs = [r for r in read_lines([tmp_path / "o" / "records.jsonl"]) if r["outcome"] == "ok"]
    t0 = min(r["t"] for r in recs)
    first = sum(1 for r in recs if r["t"] - t0 < 1.9)
    second = sum(1 for r in recs if r["t"] - t0 >= 2.1)
    assert second > 3 * first > 0, (first, second)
