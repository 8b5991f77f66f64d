"""Trace replays end to end: every record sent, the format's block size, a burst at t = 0 on time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest.profile.schema import Profile
from loadtest.sim import SimProcess
from loadtest.traces import TraceRecord, read_trace, rescale, window
from loadtest.workload.builder import Workload
from tests.conftest import read_lines, run_cli

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
AZURE_CODE = TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
MOONCAKE_CONV = TRACES / "mooncake-fast25" / "conversation_trace.jsonl"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"public traces not found at {TRACES}")

# No public BurstGPT or Bailian sample is in ../shared/traces: these are written in their formats.
BURSTGPT_ROWS = [(0.0, 300, 20), (0.4, 120, 8), (0.9, 64, 0), (1.3, 200, 12), (2.0, 90, 6)]
BAILIAN_ROWS = [(0.0, 40, 9), (0.5, 80, 4), (1.1, 90, 2), (1.6, 60, 3), (2.2, 30, 5)]
NATIVE_ROWS = [(0.25, 100, 10), (0.75, 80, 6), (1.5, 120, 9), (2.0, 40, 4), (2.75, 64, 8)]


@pytest.fixture(scope="module")
def engine() -> Iterator[SimProcess]:
    """One embedded engine (fast) for every replay of this module."""
    with SimProcess(gpu="H200", speedup=20, extra_args=["--kv-blocks", "400000"]) as sim:
        yield sim


def _burstgpt(path: Path) -> Path:
    head = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    rows = "".join(f"{t},ChatGPT,{i},{o},{i + o},Conversation log\n" for t, i, o in BURSTGPT_ROWS)
    path.write_text(head + rows)
    return path


def _bailian(path: Path) -> Path:
    lines = [
        {"chat_id": k, "parent_chat_id": -1, "timestamp": t, "input_length": i, "output_length": o,
         "type": "text", "turn": 1, "hash_ids": list(range(100 * k, 100 * k + i // 16))}
        for k, (t, i, o) in enumerate(BAILIAN_ROWS)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _native(path: Path) -> Path:
    lines = [{"t": t, "input_tokens": i, "output_tokens": o} for t, i, o in NATIVE_ROWS]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _replay(
    tmp_path: Path, sim: SimProcess, trace: dict[str, Any], name: str = "replay", *extra: str
) -> Path:
    """Run a trace-replay profile against ``sim`` (``extra``: more options); the run folder."""
    prof = tmp_path / f"{name}.yaml"
    prof.write_text(
        json.dumps({"name": name, "load": {"trace": trace}, "scenarios": [{"name": name, "kind": "trace"}]})
    )
    out = tmp_path / f"out-{name}"
    argv = ["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(out), *extra]
    res = run_cli(argv, timeout=180)
    assert res.returncode in (0, 1), res.stderr
    assert (out / "run.json").is_file(), res.stderr
    return out


def _expected(path: Path, fmt: str, trace: dict[str, Any]) -> list[TraceRecord]:
    """The records a replay of ``trace`` must send (its window, speed-up and cut applied)."""
    records = read_trace(path, fmt)
    if "window_s" in trace:
        records = window(records, *trace["window_s"])
    if "speedup" in trace:
        records = rescale(records, speedup=trace["speedup"])
    return records[: trace.get("max_requests", len(records))]


CASES = {
    "azure": lambda tmp: (AZURE_CODE, {"window_s": [0, 6]}),
    "mooncake": lambda tmp: (MOONCAKE_CONV, {"window_s": [0, 5]}),
    "burstgpt": lambda tmp: (_burstgpt(tmp / "b.csv"), {}),
    "bailian": lambda tmp: (_bailian(tmp / "q.jsonl"), {}),
    "loadtest": lambda tmp: (_native(tmp / "l.jsonl"), {}),
    "cc-traces": lambda tmp: (REPO / "traffic_profiles" / "traces" / "cc-traces-sample.jsonl", {}),
}


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_every_record_of_a_trace_is_sent(tmp_path: Path, engine: SimProcess, fmt: str) -> None:
    """The run's issuing window covers the trace's last arrival: as many requests as records, none lost."""
    path, extra = CASES[fmt](tmp_path)
    if not path.is_file():
        pytest.skip(f"public trace {path} not found")
    trace = {"path": str(path), "format": fmt, **extra}
    want = _expected(path, fmt, trace)
    assert len(want) >= 5 and want[-1].timestamp_s > 0  # the last record comes after the first
    out = _replay(tmp_path, engine, trace)
    recs = read_lines(sorted(out.glob("records*.jsonl")))
    assert len(recs) == len(want), (fmt, len(recs), len(want))
    assert all(r["outcome"] == "ok" for r in recs)  # none cut off by the run's end
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["duration_s"] > want[-1].timestamp_s


def test_workers_replay_a_trace_the_profile_names_relative_to_itself(
    tmp_path: Path, engine: SimProcess
) -> None:
    """--processes 2: the workers' profile copies lie in other folders; every record is still sent."""
    path = _native(tmp_path / "l.jsonl")
    out = _replay(tmp_path, engine, {"path": "l.jsonl", "format": "loadtest"}, "rel", "--processes", "2")
    recs = read_lines(sorted(out.glob("records*.jsonl")))
    assert len(recs) == len(read_trace(path, "loadtest")) and {r["worker"] for r in recs} == {0, 1}


def _shared_ids(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading hash ids two records share (their common prefix, in blocks)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _shared_tokens(a: list[int], b: list[int]) -> int:
    return _shared_ids(tuple(a), tuple(b))


def test_bailian_prompts_share_what_the_hash_ids_share_at_16_tokens_a_block(tmp_path: Path) -> None:
    """Requests sharing 160 / 32 / 32 tokens of Bailian hash ids share exactly that much prompt text
    (at Mooncake's 512 a block, they shared 990 of 1,000 tokens)."""
    heads = [
        list(range(63)),
        [*range(10), *range(100, 153)],
        [0, 1, *range(200, 261)],
        [0, 1, *range(300, 361)],
    ]
    lines = [
        {"chat_id": k, "parent_chat_id": -1, "timestamp": k * 0.5, "input_length": 1000, "output_length": 4,
         "type": "text", "turn": 1, "hash_ids": ids}
        for k, ids in enumerate(heads)
    ]  # fmt: skip
    path = tmp_path / "bailian.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    prof = Profile.model_validate(
        {
            "name": "bailian",
            "tokenizer": "llama3",
            "load": {"trace": {"path": str(path)}},  # format sniffed: the block size follows it
            "scenarios": [{"name": "b", "kind": "trace"}],
        }
    )
    work = Workload(prof, run_nonce=7)
    assert work.prefixes.block_tokens == 16
    records = read_trace(path, "bailian")
    tokens = [work.tokenizer.encode(work.request(i).body["messages"][-1]["content"]) for i in range(4)]
    assert len({len(t) for t in tokens}) == 1 and len(tokens[0]) >= 990  # 1,000 less the chat template
    for i in range(4):
        for j in range(i + 1, 4):
            want = 16 * _shared_ids(records[i].hash_ids, records[j].hash_ids)
            assert _shared_tokens(tokens[i], tokens[j]) == want, (i, j)
    assert {16 * _shared_ids(records[0].hash_ids, r.hash_ids) for r in records[1:]} == {160, 32}
    mooncake = Profile.model_validate({**prof.model_dump(), "load": {"trace": {"path": str(MOONCAKE_CONV)}}})
    if MOONCAKE_CONV.is_file():
        assert Workload(mooncake).prefixes.block_tokens == 512


def test_a_burst_at_t0_is_built_ahead_and_sent_on_time(tmp_path: Path, engine: SimProcess) -> None:
    """Mooncake-like: many arrivals at t = 0, then single ones, then another burst (Mooncake's 3 s
    ticks). Each burst's requests are built before its time, so the schedule lag measures sending
    alone and the run is VALID on generator health (built when its time came, the second burst lagged over 100 ms)."""
    burst = [(0.0, 6000, 4)] * 80
    rows = [*burst, *((k / 10, 2000, 4) for k in range(1, 15)), *((1.5, t[1], t[2]) for t in burst)]
    path = tmp_path / "burst.jsonl"
    path.write_text(
        "".join(json.dumps({"t": t, "input_tokens": i, "output_tokens": o}) + "\n" for t, i, o in rows)
    )
    prof = tmp_path / "burst.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "burst",
                "load": {"trace": {"path": str(path)}},
                "scenarios": [{"name": "burst", "kind": "trace"}],
                "judging": {"generator_health": "fail"},
            }
        )
    )
    out = tmp_path / "out"
    res = run_cli(
        ["run", "--profile", str(prof), "--host", engine.base_url, "--out", str(out)],
        timeout=180,
        generator_health=None,
    )
    run = json.loads((out / "run.json").read_text())
    lag = next(c for c in run["verdict"]["checks"] if c["name"] == "schedule_lag_p99")
    assert lag["passed"] is True, lag["detail"]
    assert res.returncode == 0, res.stderr
    recs = read_lines([out / "records.jsonl"])
    assert len(recs) == len(rows) and all(r["outcome"] == "ok" for r in recs)
