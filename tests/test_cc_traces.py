"""The WEKA / SemiAnalysis cc-traces reader: the shipped sample's session graph (fan-out, join, tool
delays, prefix reuse), its flat records, and one-line errors for malformed sessions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadtest.traces import TRACE_FORMATS, TraceFormatError, read_trace, sniff_format, trace_block_tokens
from loadtest.traces.agent_graph import AgentCall, FanOut, max_overlap, prefix_ceiling
from loadtest.traces.cctraces import read_cc_conversations

SAMPLE = Path(__file__).resolve().parents[1] / "traffic_profiles" / "traces" / "cc-traces-sample.jsonl"


def _raw() -> list[dict[str, Any]]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]


def test_the_sample_reads_into_a_graph_with_a_fan_out_and_its_join() -> None:
    raw = _raw()
    convs = read_cc_conversations(SAMPLE)
    assert [c.id for c in convs] == [s["id"] for s in raw]
    first = convs[0]
    kinds = [type(s).__name__ for s in first.steps]
    assert kinds == ["AgentCall", "AgentCall", "FanOut", "AgentCall", "AgentCall"]
    fan = first.steps[2]
    assert isinstance(fan, FanOut)
    entries = [r for r in raw[0]["requests"] if r["type"] == "subagent"]
    assert [a.agent_id for a in fan.subagents] == [e["agent_id"] for e in entries]
    assert [a.kind for a in fan.subagents] == [e["subagent_type"] for e in entries]
    for agent, entry in zip(fan.subagents, entries, strict=True):
        assert [c.input_tokens for c in agent.calls] == [r["in"] for r in entry["requests"]]
        assert agent.end_s == pytest.approx(entry["t"] + entry["duration_ms"] / 1000)
    # The join: the parent's next call waited for the later subagent, its delay measured from there.
    after = first.steps[3]
    assert isinstance(after, AgentCall)
    assert after.delay_before_s == pytest.approx(after.start_s - max(a.end_s for a in fan.subagents))
    # Both subagents were in flight at once; the plain session never had two calls at a time.
    assert first.max_concurrency == 2 and convs[1].max_concurrency == 1
    assert len(first.calls()) == sum(
        1 + len(r.get("requests", [])) - ("requests" in r) for r in raw[0]["requests"]
    )


def test_tool_delays_are_the_gaps_the_recording_shows() -> None:
    raw = _raw()[1]["requests"]
    calls = read_cc_conversations(SAMPLE)[1].parent_calls
    assert calls[0].delay_before_s == 0
    for prev, call, rec in zip(raw, calls[1:], raw[1:], strict=False):
        assert call.delay_before_s == pytest.approx(rec["t"] - prev["t"] - prev["api_time"])
        assert call.delay_before_s > 0


def test_the_prefix_ceiling_counts_the_blocks_an_earlier_call_sent() -> None:
    """Recomputed here from the raw JSON: a call's leading blocks that any earlier call of its session sent."""
    total = reused = 0
    for session in _raw():
        flat = []
        for r in session["requests"]:
            if r["type"] == "subagent":
                flat += [(c["t"], c) for c in r["requests"]]
            else:
                flat.append((r["t"], r))
        known: list[list[int]] = []
        for _, call in sorted(flat, key=lambda x: x[0]):
            best = 0
            for earlier in known:
                n = 0
                while n < min(len(earlier), len(call["hash_ids"])) and earlier[n] == call["hash_ids"][n]:
                    n += 1
                best = max(best, n)
            total += call["in"]
            reused += min(best * session["block_size"], call["in"])
            known.append(call["hash_ids"])
    ceiling = prefix_ceiling(read_cc_conversations(SAMPLE))
    assert (ceiling.input_tokens, ceiling.reusable_tokens) == (total, reused)
    assert 0.3 < ceiling.hit_rate < 0.9


def test_the_registry_reads_it_flat_and_sniffs_it() -> None:
    assert sniff_format(SAMPLE) == "cc-traces" and trace_block_tokens(SAMPLE) == 64
    records = read_trace(SAMPLE)
    assert records == TRACE_FORMATS["cc-traces"](SAMPLE)
    convs = read_cc_conversations(SAMPLE)
    assert len(records) == sum(len(c.calls()) for c in convs)
    subagent = [r for r in records if r.parent_id is not None]
    assert {r.session_id for r in subagent} == {"sample-agent-1/a1", "sample-agent-1/a2"}
    assert {r.kind for r in subagent} == {"Explore", "general-purpose"}
    assert [r.timestamp_s for r in records] == sorted(r.timestamp_s for r in records)


def test_a_subagent_call_before_its_subagent_counts_from_the_subagent_start(tmp_path: Path) -> None:
    path = tmp_path / "rel.jsonl"
    sub = {
        "type": "subagent",
        "t": 5.0,
        "agent_id": "x",
        "requests": [{"type": "n", "t": 0.5, "in": 10, "out": 2}],
    }
    session = {"id": "r", "block_size": 16, "requests": [{"type": "n", "t": 0, "in": 10, "out": 2}, sub]}
    path.write_text(json.dumps(session) + "\n")
    (agent,) = read_cc_conversations(path)[0].subagents
    assert agent.calls[0].start_s == pytest.approx(5.5) and agent.calls[0].delay_before_s == pytest.approx(
        0.5
    )


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (
            '{"id": "a", "block_size": 16, "requests": [{"type": "n", "t": 0, "out": 2}]}',
            "missing required field `in`",
        ),
        (
            '{"id": "a", "block_size": 16, "requests": [{"type": "n", "t": 0, "in": -1, "out": 2}]}',
            "$.requests[0].in",
        ),
        ('{"id": "a", "block_size": 0, "requests": []}', "block_size"),
        ('{"id": "a", "block_size": 16, "requests": [{"type": "x", "t": 0}]}', "$.requests[0].type"),
        ('{"id": "a", "block_size": 16, "requests": []}', "requests"),
        ('{"id": "a", "block_size": 16, "requests": [', "invalid JSON"),
    ],
)
def test_a_malformed_session_names_the_file_the_line_and_the_field(
    tmp_path: Path, line: str, says: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"id": "ok", "block_size": 16, "requests": [{"type": "n", "t": 0, "in": 1, "out": 1}]}\n' + line
    )
    with pytest.raises(TraceFormatError) as err:
        read_cc_conversations(path)
    assert str(err.value).startswith(f"{path}:2: ") and says in str(err.value)
    assert "\n" not in str(err.value)


def test_a_repeated_session_id_is_refused(tmp_path: Path) -> None:
    line = '{"id": "a", "block_size": 16, "requests": [{"type": "n", "t": 0, "in": 1, "out": 1}]}\n'
    path = tmp_path / "dup.jsonl"
    path.write_text(line + line)
    with pytest.raises(TraceFormatError, match=r"dup.jsonl:2: field 'id': 'a' is also line 1"):
        read_cc_conversations(path)


def test_overlap_counts_spans_holding_one_instant() -> None:
    assert max_overlap([(0, 2), (1, 3), (2, 4)]) == 2
    assert max_overlap([(0, 1), (1, 2)]) == 1
    assert max_overlap([]) == 0
