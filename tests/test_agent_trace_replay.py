"""Recorded agent sessions (the shipped cc-traces sample) replayed closed loop by conversations against the
embedded engine: the engine sees the recorded fan-out, the recorded delays and the recorded prefix reuse."""

from __future__ import annotations

import json
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadtest.sim import SimProcess
from loadtest.traces.agent_graph import AgentCall, FanOut, prefix_ceiling
from loadtest.traces.cctraces import read_cc_conversations
from tests.conftest import read_lines, run_cli

SAMPLE = Path(__file__).resolve().parents[1] / "traffic_profiles" / "traces" / "cc-traces-sample.jsonl"
SPEEDUP = 4.0
UNITS = ("cc-0", "cc-1")  # conversation i of the recording


def _profile(path: Path, **spec: Any) -> Path:
    path.write_text(
        json.dumps(
            {
                "name": "agentx",
                "api": "chat",
                "duration_s": 10,
                "load": {"concurrency": 2},
                "judging": {"generator_health": "warn"},
                "scenarios": [
                    {"name": "cc", "kind": "agent_trace", "agent_trace": {"path": str(SAMPLE), **spec}}
                ],
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A replay with two conversations in flight: units 0 and 1 are the two recorded sessions (later units
    replay them again until the run ends, the last ones cut short); the records and the engine's truth of
    units 0 and 1."""
    tmp = tmp_path_factory.mktemp("agent-trace")
    prof = _profile(tmp / "p.yaml", speedup=SPEEDUP)
    out = tmp / "run"
    with SimProcess(gpu="H200", speedup=20, extra_args=["--kv-blocks", "400000"]) as sim:
        res = run_cli(
            ["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(out)],
            timeout=180,
        )
        truth = sim.truth()
        with urllib.request.urlopen(sim.base_url + "/sim/requests", timeout=10) as r:
            headers = {h["headers"].get("x-request-id"): h["headers"] for h in json.load(r)}
    assert res.returncode in (0, 10), res.stderr[-3000:]
    every = read_lines(sorted(out.glob("records*.jsonl")))
    records = [r for r in every if r["id"].split(".")[0] in UNITS]
    by_wire = {t["request_id"]: t for t in truth}
    return {
        "records": records,
        "truth": {r["id"]: by_wire[r["wire_id"]] for r in records},
        "headers": {r["id"]: headers.get(r["wire_id"], {}) for r in records},
        "every": every,
        "run": json.loads((out / "run.json").read_text()),
        "html": (out / "report.html").read_text() if (out / "report.html").is_file() else "",
    }


def test_every_recorded_call_is_sent_once_with_its_lengths(replay: dict[str, Any]) -> None:
    convs = read_cc_conversations(SAMPLE)
    records = replay["records"]
    assert all(r["outcome"] == "ok" for r in records)
    by_unit: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_unit[r["id"].split(".", 1)[0]].append(r)
    assert [len(by_unit[u]) for u in UNITS] == [len(c.calls()) for c in convs]
    # The engine got each call's recorded prompt length (the chat template's tokens included) and
    # produced its recorded output length.
    for conv, unit in zip(convs, UNITS, strict=True):
        sent = sorted(replay["truth"][r["id"]]["prompt_tokens"] for r in by_unit[unit])
        assert sent == sorted(c.input_tokens for c in conv.calls())
        got = sorted(replay["truth"][r["id"]]["completion_tokens"] for r in by_unit[unit])
        assert got == sorted(c.output_tokens for c in conv.calls())


def _span(truth: dict[str, dict[str, Any]], ids: list[str]) -> tuple[int, int]:
    return min(truth[i]["arrival_ns"] for i in ids), max(truth[i]["done_ns"] for i in ids)


def test_the_engine_sees_the_fan_out_side_by_side_and_the_join(replay: dict[str, Any]) -> None:
    truth = replay["truth"]
    conv = read_cc_conversations(SAMPLE)[0]
    unit = UNITS[0]
    streams: dict[str, list[str]] = defaultdict(list)
    for rid in truth:
        if rid.startswith(unit + ".a"):
            streams[rid.split(".")[1]].append(rid)
    fan = next(s for s in conv.steps if isinstance(s, FanOut))
    assert len(streams) == sum(len(a.streams) for a in fan.subagents) == 2
    (a_start, a_end), (b_start, b_end) = (_span(truth, ids) for ids in streams.values())
    assert a_start < b_end and b_start < a_end  # both subagents in flight at once
    # The join: the parent's next call reached the engine after both subagents had finished, at least its
    # recorded delay (sped up) later; its previous call had finished before the subagents started.
    after = conv.steps[conv.steps.index(fan) + 1]
    assert isinstance(after, AgentCall)
    k = conv.parent_calls.index(after)
    joined = truth[f"{unit}.{k}"]["arrival_ns"]
    assert joined - max(a_end, b_end) >= 0.9 * after.delay_before_s / SPEEDUP * 1e9
    assert truth[f"{unit}.{k - 1}"]["done_ns"] <= min(a_start, b_start)


def test_the_recorded_tool_delays_are_waited(replay: dict[str, Any]) -> None:
    truth = replay["truth"]
    for conv, unit in zip(read_cc_conversations(SAMPLE), UNITS, strict=True):
        calls = conv.parent_calls
        for k in range(1, len(calls)):
            if isinstance(conv.steps[conv.steps.index(calls[k]) - 1], FanOut):
                continue  # waited from the join (the test above)
            gap = truth[f"{unit}.{k}"]["arrival_ns"] - truth[f"{unit}.{k - 1}"]["done_ns"]
            assert gap >= 0.9 * calls[k].delay_before_s / SPEEDUP * 1e9


def test_the_prefix_cache_hit_rate_is_the_recording_s_ceiling(replay: dict[str, Any]) -> None:
    truth = list(replay["truth"].values())
    measured = sum(t["cached_tokens"] for t in truth) / sum(t["prompt_tokens"] for t in truth)
    ceiling = prefix_ceiling(read_cc_conversations(SAMPLE)).hit_rate
    print(f"prefix-cache hit rate {measured:.4f}, the recording's ceiling {ceiling:.4f}")
    assert abs(measured - ceiling) <= 0.05, (measured, ceiling)


def test_every_call_of_a_conversation_subagents_too_carries_its_session_id(replay: dict[str, Any]) -> None:
    seen = {rid: h.get("x-session-id") for rid, h in replay["headers"].items() if h}
    assert any(".a" in rid for rid in seen)  # subagent calls among those the engine's log still holds
    assert all(sid == rid.split(".", 1)[0] for rid, sid in seen.items())


def test_the_conversation_figures_are_the_record_log_s(replay: dict[str, Any]) -> None:
    """run.json ``conversations`` recomputed here from the record lines alone."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in replay["every"]:
        groups[r["session"]].append(r)  # every call of this run is a conversation's
    done = [
        v
        for v in groups.values()
        if all(r["outcome"] == "ok" for r in v) and any(r.get("session_last") for r in v)
    ]
    assert {"cc-0", "cc-1"} <= {v[0]["session"] for v in done}
    assert all(len(v) == (9 if int(v[0]["session"][3:]) % 2 == 0 else 3) for v in done)
    latency = [
        max(r["t"] + r["e2e_us"] / 1e6 for r in v) - min(r["t"] + r["sent_us"] / 1e6 for r in v) for v in done
    ]
    busy = [
        sum(r["output_tokens"] for r in v) / sum((r["e2e_us"] - r["sent_us"]) / 1e6 for r in v) for v in done
    ]
    whole = [sum(r["output_tokens"] for r in v) / lat for v, lat in zip(done, latency, strict=True)]
    conv = replay["run"]["conversations"]
    assert (conv["started"], conv["completed"]) == (len(groups), len(done))
    duration = replay["run"]["metrics"]["window"]["duration_s"]
    assert conv["per_s"] == pytest.approx(len(done) / duration, abs=1e-3)
    assert conv["latency_s"]["p50"] == pytest.approx(float(np.percentile(latency, 50)), abs=1e-3)
    assert conv["latency_s"]["p99"] == pytest.approx(float(np.percentile(latency, 99)), abs=1e-3)
    calls = [len(v) for v in done]
    assert conv["calls_per_conversation"]["mean"] == pytest.approx(sum(calls) / len(calls), abs=1e-3)
    assert conv["e2e_interactivity"] == pytest.approx(sum(busy) / len(busy), rel=1e-3)
    assert conv["e2e_interactivity_with_tool_time"] == pytest.approx(sum(whole) / len(whole), rel=1e-3)
    assert conv["e2e_interactivity"] > conv["e2e_interactivity_with_tool_time"]  # tool time only adds
    assert conv["slo_attainment"] == 1.0  # no per-request SLO: every call of a completed one is good
    assert (
        'id="conversations"' in replay["html"] and f"{len(done)} of {len(groups)} completed" in replay["html"]
    )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "scenarios[0].agent_trace.path: cannot read"),
        (
            '{"id": "a", "block_size": 16, "requests": [{"type": "n", "t": 0, "in": -3, "out": 1}]}\n',
            "$.requests[0].in",
        ),
    ],
)
def test_a_missing_or_malformed_recording_is_a_one_line_usage_error(
    tmp_path: Path, content: str | None, says: str
) -> None:
    trace = tmp_path / "rec.jsonl"
    if content is not None:
        trace.write_text(content)
    prof = tmp_path / "p.yaml"
    prof.write_text(json.dumps({"name": "x", "load": {"concurrency": 1}, "scenarios": [
        {"name": "cc", "kind": "agent_trace", "agent_trace": {"path": "rec.jsonl"}}]}))  # fmt: skip
    res = run_cli(["run", "--profile", str(prof), "--out", str(tmp_path / "run"), "-d", "1"])
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0] and str(trace) in lines[0], res.stderr
