"""The agent-trace format registry: the OpenTelemetry GenAI and MLPerf Endpoints agentic readers on their
shipped samples (graph shape, delays, lengths, prefix ceiling), sniffing, one-line errors for malformed
input (fuzzed), and real replays of each sample against the embedded engine."""

from __future__ import annotations

import hashlib
import json
import random
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from loadtest.profile.loader import load_profile
from loadtest.sim import SimProcess
from loadtest.tokens.tokenizer import get_tokenizer
from loadtest.traces.agent_formats import AGENT_FORMATS, read_agent_trace, sniff_agent_format
from loadtest.traces.agent_graph import AgentCall, Conversation, FanOut, prefix_ceiling
from loadtest.traces.cctraces import read_cc_conversations
from loadtest.traces.errors import TraceFormatError
from loadtest.workload.agent_replay import salted
from loadtest.workload.builder import Workload
from tests.conftest import read_lines, run_cli

TRACES = Path(__file__).resolve().parents[1] / "traffic_profiles" / "traces"
OTEL = TRACES / "otel-genai-sample.json"
MLPERF = TRACES / "mlperf-agentic-sample.jsonl"
CC = TRACES / "cc-traces-sample.jsonl"
SAMPLES = {"cctraces": CC, "otel": OTEL, "mlperf_agentic": MLPERF}


def words(text: str) -> int:
    return len(text.split())


def _otel_spans() -> list[dict[str, Any]]:
    doc = json.loads(OTEL.read_text())
    return [s for r in doc["resourceSpans"] for sc in r["scopeSpans"] for s in sc["spans"]]


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for a in span["attributes"]:
        v = a["value"]
        out[a["key"]] = int(v["intValue"]) if "intValue" in v else v["stringValue"]
    return out


def _branch_ceiling(inputs: list[int], block: int) -> int:
    """Reusable tokens of a branch whose every call repeats the previous call's whole input."""
    return sum(min(a, b) // block * block for a, b in zip(inputs, inputs[1:], strict=False))


# ---- OpenTelemetry GenAI spans ----


def test_the_otel_sample_reads_into_a_graph_with_a_subagent_fan_out_and_its_join() -> None:
    convs = {c.id: c for c in read_agent_trace(OTEL, "otel")}
    assert set(convs) == {"coder-1", "chat-2"}
    coder = convs["coder-1"]
    assert [type(s).__name__ for s in coder.steps] == [
        "AgentCall",
        "AgentCall",
        "FanOut",
        "AgentCall",
        "AgentCall",
    ]
    fan = coder.steps[2]
    assert isinstance(fan, FanOut)
    assert [(a.agent_id, a.kind) for a in fan.subagents] == [
        ("explore-1", "explore"),
        ("explore-2", "explore"),
    ]
    spans = _otel_spans()
    chats = [s for s in spans if _attrs(s)["gen_ai.operation.name"] == "chat"]
    by_parent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in chats:
        by_parent[s["parentSpanId"]].append(s)
    # Each subagent holds the model calls below its invoke_agent span, with their recorded lengths.
    for agent, sid in zip(fan.subagents, ("a000000000000002", "a000000000000003"), strict=True):
        want = [
            (_attrs(s)["gen_ai.usage.input_tokens"], _attrs(s)["gen_ai.usage.output_tokens"])
            for s in by_parent[sid]
        ]
        assert [(c.input_tokens, c.output_tokens) for c in agent.calls] == want
    assert coder.max_concurrency == 2 and convs["chat-2"].max_concurrency == 1
    assert len(coder.calls()) == sum(1 for s in chats if _attrs(s)["gen_ai.conversation.id"] == "coder-1")
    # Delays: the gap after the previous call (the execute_tool span's time inside it); after the fan-out,
    # the gap after the join (the later subagent's invoke_agent end).
    t0 = min(int(s["startTimeUnixNano"]) for s in spans)

    def t(sid: str, key: str) -> float:
        return (int(next(s for s in spans if s["spanId"] == sid)[key]) - t0) / 1e9

    parent = coder.parent_calls
    assert parent[1].delay_before_s == pytest.approx(
        t("c000000000000002", "startTimeUnixNano") - t("c000000000000001", "endTimeUnixNano")
    )
    join = max(t("a000000000000002", "endTimeUnixNano"), t("a000000000000003", "endTimeUnixNano"))
    assert fan.end_s == pytest.approx(join)
    assert parent[2].delay_before_s == pytest.approx(t("c000000000000007", "startTimeUnixNano") - join)
    assert all(c.api_time_s > 0 for c in coder.calls())


def test_the_otel_prefix_ceiling_is_each_branch_repeating_its_previous_context() -> None:
    convs = read_agent_trace(OTEL)
    expected = total = 0
    for conv in convs:
        branches = [[c.input_tokens for c in conv.parent_calls]]
        branches += [[c.input_tokens for c in s] for a in conv.subagents for s in a.streams]
        expected += sum(_branch_ceiling(b, conv.block_tokens) for b in branches)
        total += sum(c.input_tokens for c in conv.calls())
    ceiling = prefix_ceiling(convs)
    assert (ceiling.input_tokens, ceiling.reusable_tokens) == (total, expected)
    assert 0.5 < ceiling.hit_rate < 1


def _flat(span: dict[str, Any]) -> dict[str, Any]:
    def iso(ns: str) -> str:
        return datetime.fromtimestamp(int(ns) / 1e9, UTC).isoformat()

    return {
        "trace_id": span["traceId"],
        "span_id": span["spanId"],
        "parent_span_id": span["parentSpanId"] or None,
        "name": span["name"],
        "start_time": iso(span["startTimeUnixNano"]),
        "end_time": iso(span["endTimeUnixNano"]),
        "attributes": _attrs(span),
    }


def _shape(convs: list[Conversation]) -> list[Any]:
    return [
        (
            c.id,
            [type(s).__name__ for s in c.steps],
            [(x.input_tokens, x.output_tokens, round(x.delay_before_s, 3)) for x in c.calls()],
        )
        for c in convs
    ]


@pytest.mark.parametrize("shape", ["spans-object", "span-lines", "otlp-lines"])
def test_the_other_otel_json_shapes_read_into_the_same_graph(tmp_path: Path, shape: str) -> None:
    spans = _otel_spans()
    path = tmp_path / "spans.json"
    if shape == "spans-object":  # inference-perf's trace file
        path.write_text(json.dumps({"trace_id": "x", "spans": [_flat(s) for s in spans]}, indent=2))
    elif shape == "span-lines":
        path.write_text("".join(json.dumps(_flat(s)) + "\n" for s in spans))
    else:  # the collector's file exporter: one export a line
        path.write_text(
            "".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) + "\n" for s in spans)
        )
    assert sniff_agent_format(path) == "otel"
    assert _shape(read_agent_trace(path)) == _shape(read_agent_trace(OTEL))


# ---- MLPerf Endpoints agentic rows ----


def _rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in MLPERF.read_text().splitlines() if line.strip()]


def test_the_mlperf_sample_reads_one_call_per_client_turn_with_the_recorded_history() -> None:
    rows = _rows()
    convs = read_agent_trace(MLPERF, "mlperf_agentic", words)
    assert [c.id for c in convs] == ["fix-divide", "explain-sort"]
    for conv in convs:
        mine = [r for r in rows if r["conversation_id"] == conv.id]
        client = [r for r in mine if r["role"] in ("user", "tool")]
        calls = conv.parent_calls
        assert len(calls) == len(client) and not conv.subagents and conv.max_concurrency == 1
        assert [c.delay_before_s for c in calls] == [r.get("delay_seconds", 0.0) for r in client]
        for call, row in zip(calls, client, strict=True):
            assert call.recorded is not None
            msgs = call.recorded.messages
            # The system prompt first, then every earlier row as recorded (tool rows one message per
            # result), then this row's own messages: what the reference client sends.
            assert msgs[0] == {"role": "system", "content": mine[0]["system"]}
            upto = [r for r in mine if r["turn"] <= row["turn"]]
            assert len(msgs) == 1 + sum(len(r["tool_results"]) if r["role"] == "tool" else 1 for r in upto)
            assert msgs[-1]["content"] == (
                row["tool_results"][-1]["content"] if row["role"] == "tool" else row["content"]
            )
            assert list(call.recorded.tools) == row.get("tools", [])
            # The recorded answer's length: the assistant row after it (text, reasoning, tool calls).
            answer = next(r for r in mine if r["turn"] == row["turn"] + 1)
            text = [answer.get("content") or "", answer.get("reasoning_content") or ""]
            text += [c["function"]["name"] + c["function"]["arguments"] for c in answer.get("tool_calls", [])]
            assert call.output_tokens == max(1, sum(words(x) for x in text))
        assert [m["role"] for m in calls[-1].recorded.messages[1:]] == [
            r["role"] for r in mine[:-1] for _ in range(len(r.get("tool_results", [0])))
        ]  # type: ignore[union-attr]
    # Each turn's input repeats the one before: the ceiling is the previous input's whole blocks.
    ceiling = prefix_ceiling(convs)
    want = sum(
        _branch_ceiling([c.input_tokens for c in conv.parent_calls], conv.block_tokens) for conv in convs
    )
    assert ceiling.reusable_tokens == want


def test_the_salt_goes_before_and_after_the_system_prompt_as_the_reference_puts_it() -> None:
    call = read_agent_trace(MLPERF, "mlperf_agentic")[0].parent_calls[0]
    assert call.recorded is not None
    system = call.recorded.messages[0]["content"]
    a = salted(call.recorded, "fix-divide", 0).messages[0]["content"]
    first = hashlib.blake2b(b"0", digest_size=2).hexdigest()
    last = hashlib.blake2b(b"fix-divide", digest_size=2).hexdigest()
    assert a == f"[salt: {first}]\n\n{system}\n\n[salt: {last}]"
    assert salted(call.recorded, "fix-divide", 1).messages[0]["content"] != a  # another pass
    assert salted(call.recorded, "other", 0).messages[0]["content"] != a  # another conversation
    assert salted(call.recorded, "fix-divide", 0).messages[1:] == call.recorded.messages[1:]


# ---- the registry ----


def test_each_sample_is_sniffed_as_its_format_and_cctraces_reads_as_before() -> None:
    assert {n: sniff_agent_format(p) for n, p in SAMPLES.items()} == {n: n for n in SAMPLES}
    assert set(AGENT_FORMATS) == set(SAMPLES)
    assert read_agent_trace(CC) == read_cc_conversations(CC)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"hello": 1}\n', "not a known agent-trace format"),
        ("[1, 2]\n", "not a known agent-trace format"),
        ("", "empty"),
        ("{not json\n", "invalid JSON"),
    ],
)
def test_an_unknown_shape_names_the_file_and_the_fix(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as e:
        read_agent_trace(path)
    assert says in str(e.value) and str(path) in str(e.value)
    if "known" in says:
        assert "agent_trace.format" in str(e.value) and "mlperf_agentic" in str(e.value)


def _mlperf_line(lineno: int, **change: Any) -> str:
    rows = _rows()
    rows[lineno - 1].update(change)
    return "".join(json.dumps({k: v for k, v in r.items() if v is not ...}) + "\n" for r in rows)


@pytest.mark.parametrize(
    ("fmt", "text", "line", "field"),
    [
        ("mlperf_agentic", lambda: _mlperf_line(3, turn=5), 3, "'turn'"),
        ("mlperf_agentic", lambda: _mlperf_line(2, role="user"), 2, "'role'"),
        ("mlperf_agentic", lambda: _mlperf_line(3, tool_results=[{"content": "x"}]), 3, "tool_call_id"),
        ("mlperf_agentic", lambda: _mlperf_line(5, delay_seconds=-1), 5, "'delay_seconds'"),
        ("mlperf_agentic", lambda: _mlperf_line(2, tool_calls=[{"id": "x"}]), 2, "'tool_calls'"),
        ("mlperf_agentic", lambda: _mlperf_line(9, conversation_id="fix-divide"), 9, "'turn'"),
        ("mlperf_agentic", lambda: _mlperf_line(7, content=...), 7, "'content'"),
        (
            "otel",
            lambda: _otel_mutated(3, "gen_ai.usage.input_tokens", "many"),
            1,
            "gen_ai.usage.input_tokens",
        ),
        ("otel", lambda: _otel_mutated(3, "endTimeUnixNano", "0"), 1, "endTimeUnixNano"),
        ("otel", lambda: _otel_mutated(3, "startTimeUnixNano", "yesterday"), 1, "startTimeUnixNano"),
    ],
)
def test_malformed_input_is_one_error_naming_file_line_and_field(
    tmp_path: Path, fmt: str, text: Any, line: int, field: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text())
    with pytest.raises(TraceFormatError) as e:
        read_agent_trace(path, fmt)
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line}: ") and field in msg and "\n" not in msg, msg


def _otel_mutated(index: int, key: str, value: Any) -> str:
    spans = _otel_spans()
    span = spans[index]
    if key.startswith("gen_ai."):
        span["attributes"] = [
            a if a["key"] != key else {"key": key, "value": {"stringValue": value}}
            for a in span["attributes"]
        ]
    else:
        span[key] = value
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})


_ODD = [None, -1, 0, 1.5, 10**30, "", "x", "2026-13-01", [], [1], {}, {"a": 1}, True, "-5", float("1e300")]


def _mutate(value: Any, rng: random.Random) -> Any:
    """The JSON value with one random node replaced, deleted or duplicated."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        r = rng.random()
        out = dict(value)
        if r < 0.15:
            del out[key]
        elif r < 0.5:
            out[key] = rng.choice(_ODD)
        else:
            out[key] = _mutate(value[key], rng)
        return out
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        out = list(value)
        r = rng.random()
        if r < 0.15:
            del out[i]
        elif r < 0.3:
            out.insert(i, out[i])
        elif r < 0.5:
            out[i] = rng.choice(_ODD)
        else:
            out[i] = _mutate(value[i], rng)
        return out
    return rng.choice(_ODD)


@pytest.mark.parametrize("fmt", ["otel", "mlperf_agentic", "cctraces", "auto"])
def test_fuzzed_recordings_raise_nothing_but_the_format_error(tmp_path: Path, fmt: str) -> None:
    rng = random.Random(f"fuzz:{fmt}")
    errors = 0
    for i in range(400):
        path = tmp_path / f"m{i}.json"
        src = (SAMPLES[fmt] if fmt in SAMPLES else list(SAMPLES.values())[i % 3]).read_text()
        if rng.random() < 0.25:  # a text edit: a slice dropped or a stray character
            a = rng.randrange(len(src))
            src = src[:a] + rng.choice(["", "{", "]", ",", '"', "\n", "é"]) + src[a + rng.randrange(1, 40) :]
        elif src.lstrip().startswith("{\n"):
            src = json.dumps(_mutate(json.loads(src), rng))
        else:
            lines = src.splitlines()
            k = rng.randrange(len(lines))
            lines[k] = json.dumps(_mutate(json.loads(lines[k]), rng))
            src = "\n".join(lines) + "\n"
        path.write_text(src)
        try:
            convs = read_agent_trace(path, fmt, words)
        except TraceFormatError as e:
            errors += 1
            assert str(path) in str(e) and "\n" not in str(e)
            continue
        for conv in convs:  # what reads is a well-formed graph
            for call in conv.calls():
                assert call.input_tokens >= 0 and call.output_tokens >= 0 and call.delay_before_s >= 0
    assert errors > 40  # the mutations do break files


# ---- replays against the embedded engine ----


def _profile(path: Path, trace: Path, duration_s: float = 8, **spec: Any) -> Path:
    path.write_text(
        json.dumps(
            {
                "name": "agentfmt",
                "api": "chat",
                "duration_s": duration_s,
                "load": {"concurrency": 2},
                "judging": {"generator_health": "warn"},
                "scenarios": [
                    {"name": "ag", "kind": "agent_trace", "agent_trace": {"path": str(trace), **spec}}
                ],
            }
        )
    )
    return path


def _replay(tmp: Path, trace: Path, units: tuple[str, ...] = ("ag-0", "ag-1"), **spec: Any) -> dict[str, Any]:
    prof = _profile(tmp / "p.yaml", trace, **spec)
    out = tmp / "run"
    with SimProcess(gpu="H200", speedup=20, extra_args=["--kv-blocks", "400000"]) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(out)], timeout=180)
        truth = sim.truth()
        with urllib.request.urlopen(sim.base_url + "/sim/requests", timeout=10) as r:
            log = {h["headers"].get("x-request-id"): h for h in json.load(r)}
    assert res.returncode in (0, 10), res.stderr[-3000:]
    every = read_lines(sorted(out.glob("records*.jsonl")))
    records = [r for r in every if r["id"].split(".")[0] in units]
    by_wire = {t["request_id"]: t for t in truth}
    return {
        "records": records,
        "truth": {r["id"]: by_wire[r["wire_id"]] for r in records},
        "log": {r["id"]: log.get(r["wire_id"]) for r in records},
        "every": every,
    }


def _by_unit(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        out[r["id"].split(".", 1)[0]].append(r)
    return out


def test_the_otel_sample_replays_every_recorded_call_with_its_fan_out(tmp_path: Path) -> None:
    got = _replay(tmp_path, OTEL, speedup=4.0)
    convs = read_agent_trace(OTEL)
    units = _by_unit(got["records"])
    assert all(r["outcome"] == "ok" for r in got["records"])
    for conv, unit in zip(convs, ("ag-0", "ag-1"), strict=True):
        assert len(units[unit]) == len(conv.calls())
        sent = sorted(got["truth"][r["id"]]["prompt_tokens"] for r in units[unit])
        assert sent == sorted(c.input_tokens for c in conv.calls())
        done = sorted(got["truth"][r["id"]]["completion_tokens"] for r in units[unit])
        assert done == sorted(c.output_tokens for c in conv.calls())
    # The two subagents' streams were in flight at once and the parent's next call came after both.
    truth = got["truth"]
    streams: dict[str, list[str]] = defaultdict(list)
    for rid in truth:
        if rid.startswith("ag-0.a"):
            streams[rid.split(".")[1]].append(rid)
    assert len(streams) == 2
    spans = [
        (min(truth[i]["arrival_ns"] for i in ids), max(truth[i]["done_ns"] for i in ids))
        for ids in streams.values()
    ]
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1
    after = convs[0].parent_calls[2]
    assert isinstance(after, AgentCall)
    assert truth["ag-0.2"]["arrival_ns"] - max(a1, b1) >= 0.9 * after.delay_before_s / 4.0 * 1e9
    # The engine's prefix cache served what the recording's synthetic prefix chain says it can.
    measured = sum(t["cached_tokens"] for t in truth.values()) / sum(
        t["prompt_tokens"] for t in truth.values()
    )
    ceiling = prefix_ceiling(convs).hit_rate
    print(f"prefix-cache hit rate {measured:.4f}, the recording's ceiling {ceiling:.4f}")
    assert abs(measured - ceiling) <= 0.05, (measured, ceiling)


def test_the_mlperf_sample_sends_the_recorded_conversation_salted(tmp_path: Path) -> None:
    got = _replay(tmp_path, MLPERF, speedup=4.0)
    tok = get_tokenizer("llama3")  # the profile's tokenizer (the default)
    convs = read_agent_trace(MLPERF, "mlperf_agentic", tok.count)
    units = _by_unit(got["records"])
    assert all(r["outcome"] == "ok" for r in got["records"])
    seen = 0
    for index, (conv, unit) in enumerate(zip(convs, ("ag-0", "ag-1"), strict=True)):
        assert len(units[unit]) == len(conv.parent_calls)
        for r in units[unit]:
            k = int(r["id"].split(".")[1])
            call = conv.parent_calls[k]
            assert call.recorded is not None
            want = salted(call.recorded, conv.id, index // len(convs))
            # The engine prefilled exactly the recorded messages and tools (its prompt count is theirs).
            assert got["truth"][r["id"]]["prompt_tokens"] == tok.count_request(
                list(want.messages), list(want.tools) or None
            )
            assert got["truth"][r["id"]]["completion_tokens"] == call.output_tokens
            entry = got["log"][r["id"]]
            if entry is None:
                continue
            seen += 1
            # Each message's role and text reached the engine as recorded, the salt around the system prompt.
            digests = [
                {"role": m["role"], "sha256": hashlib.sha256((m.get("content") or "").encode()).hexdigest()}
                for m in want.messages
            ]
            assert entry["messages"] == digests
            assert want.messages[0]["content"].startswith("[salt: ")
    assert seen >= 4


def test_the_shipped_mlperf_agentic_profiles_build_their_recorded_turns() -> None:
    for name, timeout in (("agentic-kimi-k3", 86400), ("agentic-qwen3.6-35b-a3b", 14400)):
        profile, _ = load_profile(name)
        assert profile.load.concurrency == 8 and profile.client.total_timeout_s == timeout
        work = Workload(profile, seed=1)
        unit = work.unit(0)
        step = unit.next(None)
        assert step is not None
        body = step.request.body
        assert body["max_tokens"] == 8192 and body["tools"]
        assert body["messages"][0]["role"] == "system" and body["messages"][0]["content"].startswith(
            "[salt: "
        )
        assert body["messages"][1]["content"].startswith("The test tests/test_calc.py")


def test_trajectories_end_the_run_after_that_many_conversations_each_pass_salted_anew(tmp_path: Path) -> None:
    """``trajectories: 3`` over a recording of two: units 0, 1 and 2 (conversation 0's second pass) are
    issued and no other, well before the 120 s duration; once the last is issued the run stops starting
    calls (the --max-requests rule), so a conversation in flight then may end early."""
    units = ("ag-0", "ag-1", "ag-2")
    got = _replay(tmp_path, MLPERF, units, duration_s=120, trajectories=3, tool_delays=False)
    assert {r["session"] for r in got["every"]} == set(units)
    assert all(r["outcome"] == "ok" for r in got["every"])
    a, b = (got["log"][f"{u}.0"]["messages"] for u in ("ag-0", "ag-2"))
    assert a[1:] == b[1:] and a[0] != b[0]  # the same recorded text, the system prompt salted anew


def test_a_file_read_as_another_format_says_which_it_looks_like(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError) as e:
        read_agent_trace(MLPERF, "otel")
    assert str(e.value).startswith(f"{MLPERF}:1: ") and "looks like mlperf_agentic" in str(e.value)


@pytest.mark.parametrize(
    ("line", "change", "field"),
    [(3, {"tool_results": []}, "tool_results"), (1, {"turn": 0}, "'turn'")],
)
def test_a_malformed_recording_stops_the_run_with_one_usage_error_line(
    tmp_path: Path, line: int, change: dict[str, Any], field: str
) -> None:
    trace = tmp_path / "rec.jsonl"
    trace.write_text(_mlperf_line(line, **change))
    prof = tmp_path / "p.yaml"
    prof.write_text(json.dumps({"name": "x", "load": {"concurrency": 1}, "scenarios": [
        {"name": "ag", "kind": "agent_trace", "agent_trace": {"path": "rec.jsonl"}}]}))  # fmt: skip
    res = run_cli(["run", "--profile", str(prof), "--out", str(tmp_path / "run"), "-d", "1"])
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{trace}:{line}: " in lines[0] and field in lines[0], res.stderr
