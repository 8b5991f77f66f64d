"""The MLPerf Endpoints agentic inline accuracy (accuracy/scorers/agentic.py): the scorer on hand-made
answers, the reader's expected answers, the engine's recorded-answer mode, and whole runs of the shipped
MLPerf agentic sample scored from their own answers (docs/traces.md, docs/sources.md §20)."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loadtest.accuracy.scorers import scorer_for
from loadtest.accuracy.scorers.agentic import AgenticScore, answer_intent, bash_actions, turn_score
from loadtest.client.adapters.base import keep_agentic
from loadtest.contracts.record_line import AgenticTurn
from loadtest.sim import SimProcess
from loadtest.traces.agent_formats import read_agent_trace
from tests.conftest import read_lines, run_cli, write_profile

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "traffic_profiles" / "traces" / "mlperf-agentic-sample.jsonl"


def _bash(cmd: str, name: str = "bash", key: str = "cmd") -> list[str]:
    return [name, json.dumps({key: cmd})]


def _iou(want: list[str], got: list[str]) -> float:
    """Multiset intersection over union, computed here from the executables written out by hand."""
    a, b = Counter(want), Counter(got)
    inter = sum(min(a[k], b[k]) for k in a)
    union = sum(max(a[k], b[k]) for k in set(a) | set(b))
    return inter / union


EXPECTED = [_bash("cat calc.py"), _bash("python -m pytest -q tests/test_calc.py")]  # cat, python


@pytest.mark.parametrize(
    ("answer", "got"),
    [
        (EXPECTED, ["cat", "python"]),  # exact
        ([_bash("cat calc.py", name="shell"), _bash("python -m pytest", name="edit")], []),  # wrong tool
        ([_bash("grep -n divide calc.py"), _bash("python3 -m pytest")], ["grep", "python"]),  # wrong args
        ([], []),  # no tool call
        ([_bash("cat calc.py"), _bash("cat calc.py"), _bash("python -m pytest")], ["cat", "cat", "python"]),
    ],
    ids=["exact", "wrong-tool", "wrong-args", "no-tool-call", "extra-call"],
)
def test_a_coding_call_scores_the_multiset_iou_of_bash_executables(
    answer: list[list[str]], got: list[str]
) -> None:
    turn = AgenticTurn("fix-divide", 1, expected_calls=EXPECTED, calls=answer)
    want = _iou(["cat", "python"], got)
    assert turn_score(turn, answered=True) == pytest.approx(want)
    assert turn_score(turn, answered=False) == 0.0  # a call without an ok answer counts 0


def test_commands_are_normalized_as_the_reference_does() -> None:
    cmd = (
        "CUDA_VISIBLE_DEVICES=0 /usr/bin/python3.11 -m pytest 'a | b' | tail -5 && sudo rg foo; wget x; vim y"
    )
    assert bash_actions([_bash(cmd)]) == ["python", "tail", "grep", "curl"]  # vim is no scored action
    assert bash_actions([_bash("ls -la", key="command")]) == ["ls"]
    assert bash_actions([["bash", "not json"], ["bash", '{"cmd": 3}']]) == []


def test_a_workflow_call_scores_its_intent_code_and_an_empty_expectation_is_excluded() -> None:
    def turn(reasoning: str, content: str) -> AgenticTurn:
        return AgenticTurn("sim_12", 3, expected_intents=["i042"], reasoning=reasoning, content=content)

    assert turn_score(turn("", "final intent: I042"), True) == 1.0
    assert turn_score(turn("intent: I041", "intent: I042"), True) == 0.0  # the reasoning's comes first
    assert turn_score(turn("maybe I042, then I007", ""), True) == 0.0  # the last bare code
    assert turn_score(turn("maybe I007, then I042", ""), True) == 1.0
    assert answer_intent("", "nothing") is None
    assert turn_score(AgenticTurn("sim_1", 1), True) is None  # no intent codes recorded
    assert turn_score(AgenticTurn("fix", 1, expected_calls=[["edit", "{}"]]), True) is None  # no bash action


def test_a_record_keeps_only_what_the_check_reads_of_an_answer() -> None:
    calls = [{"name": "bash", "arguments": '{"cmd": "ls"}'}, {"name": "edit", "arguments": "x" * 5000}]
    coding = AgenticTurn("fix", 1, expected_calls=EXPECTED)
    keep_agentic(coding, "some text", "some reasoning", calls)
    assert (coding.calls, coding.content, coding.reasoning) == (
        [["bash", '{"cmd": "ls"}'], ["edit", ""]],
        "",
        "",
    )
    workflow = AgenticTurn("sim_1", 1, expected_intents=["I001"])
    keep_agentic(workflow, "intent: I001", "thinking", calls)
    assert (workflow.calls, workflow.content, workflow.reasoning) == ([], "intent: I001", "thinking")
    plain = AgenticTurn("fix", 5)  # a recorded final answer: nothing to score, nothing kept
    keep_agentic(plain, "done", "r", calls)
    assert (plain.calls, plain.content, plain.reasoning) == ([], "", "")


def test_the_overall_score_is_the_mean_over_every_scored_call() -> None:
    tally = AgenticScore()
    tally.add(AgenticTurn("c", 1, expected_calls=EXPECTED, calls=EXPECTED), True)  # 1
    tally.add(AgenticTurn("c", 3, expected_calls=EXPECTED, calls=[_bash("cat x")]), True)  # 1/2
    tally.add(AgenticTurn("c", 5), True)  # excluded
    tally.add(AgenticTurn("sim_1", 1, expected_intents=["I001"], content="intent: I001"), False)  # 0
    tally.add(AgenticTurn("sim_1", 3, expected_intents=["I001"], content="intent: I001"), True)  # 1
    s = tally.section()
    assert s["score"] == round((1 + 0.5 + 0 + 1) / 4, 4)
    assert s["calls"] == {"issued": 5, "answered": 4, "scored": 4, "excluded": 1}
    assert s["domains"] == {"coding": {"score": 0.75, "scored": 2}, "workflow": {"score": 0.5, "scored": 2}}


def test_the_registered_scorer_reads_answer_messages_and_recorded_rows() -> None:
    scorer = scorer_for("agentic_inference_inline")
    call = {"id": "x", "type": "function", "function": {"name": "bash", "arguments": EXPECTED[0][1]}}
    ref = json.dumps({"conversation_id": "fix", "turn": 2, "role": "assistant", "tool_calls": [call]})
    wrong = {**call, "function": {"name": "bash", "arguments": _bash("ls")[1]}}
    answers = [json.dumps({"content": None, "tool_calls": [call]}), json.dumps({"tool_calls": [wrong]}), ""]
    got = scorer.score(answers, [ref, ref, ref])
    assert got == {"scored": 3.0, "excluded": 0.0, "agentic_score": round(1 / 3, 4)}


def test_the_reader_keeps_each_client_row_s_recorded_answer_as_expected() -> None:
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    convs = read_agent_trace(SAMPLE, "mlperf_agentic", lambda s: len(s.split()))
    for conv in convs:
        mine = [r for r in rows if r["conversation_id"] == conv.id]
        for call in conv.parent_calls:
            assert call.recorded is not None and call.recorded.expected is not None
            client = mine[call.recorded.turn - 1]
            answer = mine[call.recorded.turn]  # the row after the client row
            assert client["role"] in ("user", "tool") and answer["role"] == "assistant"
            assert call.recorded.expected.get("tool_calls") == answer.get("tool_calls")
            assert call.recorded.expected.get("content") == answer.get("content")


# ---- the engine's recorded-answer mode ----

RECORDED = {
    "role": "assistant",
    "reasoning_content": "Look at the code first.",
    "content": "Reading it.",
    "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "cat calc.py"}'}},
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls -la src"}'}},
    ],
}
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the divide bug."},
]


def _post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return bytes(r.read())


def _streamed(raw: bytes) -> tuple[str, str, list[dict[str, str]], str | None]:
    """The stream's reasoning, text, tool calls (reassembled from their deltas) and finish reason."""
    reasoning, text, calls, finish = "", "", {}, None
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for ch in json.loads(line[6:]).get("choices") or ():
            d = ch.get("delta") or {}
            reasoning += d.get("reasoning_content") or ""
            text += d.get("content") or ""
            for tc in d.get("tool_calls") or ():
                c = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                c["id"] += tc.get("id") or ""
                c["name"] += (tc.get("function") or {}).get("name") or ""
                c["arguments"] += (tc.get("function") or {}).get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    return reasoning, text, [calls[i] for i in sorted(calls)], finish


def test_the_engine_answers_a_recorded_call_as_recorded_its_tool_calls_as_deltas(tmp_path: Path) -> None:
    answers = tmp_path / "recorded.jsonl"
    answers.write_text(json.dumps({"messages": MESSAGES, "answer": RECORDED}) + "\n")
    salted = [
        {**MESSAGES[0], "content": f"[salt: 1f2e]\n\n{MESSAGES[0]['content']}\n\n[salt: a0b1]"},
        MESSAGES[1],
    ]
    want_calls = [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in RECORDED["tool_calls"]
    ]
    with SimProcess(gpu="H200", speedup=20, extra_args=["--recorded-answers", str(answers)]) as sim:
        body = {"messages": salted, "max_tokens": 400, "stream": True}
        reasoning, text, calls, finish = _streamed(_post(sim.base_url, body))
        assert (reasoning, text, calls, finish) == (
            RECORDED["reasoning_content"],
            RECORDED["content"],
            want_calls,
            "tool_calls",
        )
        # Fewer tokens asked than 4-character pieces: longer pieces, the same answer.
        reasoning, text, calls, finish = _streamed(_post(sim.base_url, {**body, "max_tokens": 12}))
        assert (text, calls, finish) == (RECORDED["content"], want_calls, "tool_calls")
        whole = json.loads(_post(sim.base_url, {**body, "stream": False}))["choices"][0]
        assert whole["message"]["tool_calls"] == RECORDED["tool_calls"]
        assert whole["finish_reason"] == "tool_calls"
        # Other messages: the engine's own answer.
        other = [MESSAGES[0], {"role": "user", "content": "Something else."}]
        _, text, calls, _ = _streamed(_post(sim.base_url, {**body, "messages": other}))
        assert calls == [] and text and text != RECORDED["content"]


def test_a_malformed_recorded_answers_file_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "recorded.jsonl"
    bad.write_text(json.dumps({"messages": MESSAGES, "answer": RECORDED}) + "\n" + '{"messages": []}\n')
    with (
        pytest.raises(RuntimeError, match="line 2 needs 'messages'"),
        SimProcess(gpu="H200", extra_args=["--recorded-answers", str(bad)]),
    ):
        pass


# ---- whole runs of the shipped sample, scored from their own answers ----


def _profile(path: Path, **spec: Any) -> Path:
    path.write_text(
        json.dumps(
            {
                "name": "agentic-acc",
                "api": "chat",
                "duration_s": 5,
                "load": {"concurrency": 2},
                "judging": {"generator_health": "warn"},
                "scenarios": [
                    {
                        "name": "ag",
                        "kind": "agent_trace",
                        "agent_trace": {"path": str(SAMPLE), "tool_delays": False, **spec},
                    }
                ],
            }
        )
    )
    return path


def _recomputed(records: list[dict[str, Any]]) -> float:
    """The score from the record log alone: each line's recorded and answered bash commands, their first
    words compared as multisets (the sample's commands are plain), averaged over the scorable calls."""
    scores = []
    for r in records:
        a = r.get("agentic")
        if a is None:
            continue
        want = [
            json.loads(args)["cmd"].split()[0] for name, args in a.get("expected_calls", []) if name == "bash"
        ]
        if not want:
            continue
        got = []
        if r["outcome"] == "ok":
            for name, args in a.get("calls", []):
                try:
                    cmd = json.loads(args).get("cmd") if name == "bash" else None
                except ValueError:
                    cmd = None
                if isinstance(cmd, str) and cmd.split():
                    got.append(cmd.split()[0])
        scores.append(_iou(want, got))
    return round(sum(scores) / len(scores), 4)


def _run(tmp: Path, name: str, *extra: str, **spec: Any) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    prof = _profile(tmp / f"{name}.json", **spec)
    out = tmp / name
    res = run_cli(
        ["run", "--profile", str(prof), "--engine-speedup", "20", "--out", str(out), *extra], timeout=240
    )
    doc = json.loads((out / "run.json").read_text())
    return res, doc, read_lines(sorted(out.glob("records*.jsonl")))


def test_a_run_answered_as_recorded_scores_1_and_the_engine_s_own_answers_score_lower(tmp_path: Path) -> None:
    res, doc, records = _run(tmp_path, "recorded", "--engine-recorded", accuracy_target=0.9)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    acc = doc["agentic_accuracy"]
    assert acc["score"] == 1.0 and acc["target"] == 0.9
    assert acc["calls"]["scored"] >= 2 and acc["domains"]["coding"]["scored"] == acc["calls"]["scored"]
    tagged = [r for r in records if "agentic" in r]
    assert len(tagged) == acc["calls"]["issued"] == len(records)  # every call of the sample has an answer
    assert _recomputed(records) == acc["score"]
    assert any(
        r["agentic"].get("expected_calls") and r["agentic"].get("calls") == r["agentic"]["expected_calls"]
        for r in tagged
    )
    assert "Agentic accuracy (MLPerf inline): 1.0000" in res.stdout
    assert "Agentic accuracy (MLPerf inline): 1.0000" in (tmp_path / "recorded" / "report.html").read_text()

    res, doc, records = _run(tmp_path, "control", accuracy_target=0.9)
    acc = doc["agentic_accuracy"]
    assert acc["score"] is not None and acc["score"] < 1.0
    assert _recomputed(records) == acc["score"]
    assert res.returncode == 13, res.stdout[-3000:]  # quality failed: below the profile's target
    assert doc["verdict"]["status"] == "quality_failed"
    assert "agent_trace.accuracy_target" in doc["verdict"]["reasons"][0]
    assert "QUALITY FAILED" in res.stdout and "agentic accuracy below target" in res.stdout


def test_engine_recorded_needs_the_embedded_engine_and_a_recording_with_answers(tmp_path: Path) -> None:
    prof = _profile(tmp_path / "p.json")
    res = run_cli(["run", "--profile", str(prof), "--engine-recorded", "--host", "http://127.0.0.1:9"])
    assert res.returncode == 2 and "--engine-recorded is for the embedded engine" in res.stderr
    plain = write_profile(tmp_path / "plain.json", duration_s=1)
    res = run_cli(["run", "--profile", str(plain), "--engine-recorded", "--out", str(tmp_path / "r")])
    assert res.returncode == 2 and "replays no recorded call with an expected answer" in res.stderr
    otel = SAMPLE.parent / "otel-genai-sample.json"  # recorded lengths, no recorded answers
    prof.write_text(
        prof.read_text()
        .replace(str(SAMPLE), str(otel))
        .replace('"tool_delays"', '"accuracy_target": 0.5, "tool_delays"')
    )
    res = run_cli(["run", "--profile", str(prof), "--out", str(tmp_path / "o")])
    assert res.returncode == 2, res.stderr[-2000:]
    assert "scenarios[0].agent_trace.accuracy_target" in res.stderr and "remove accuracy_target" in res.stderr


def test_a_workflow_recording_is_scored_by_the_intent_code_of_the_streamed_answer(tmp_path: Path) -> None:
    system = "You route customer requests. End with intent: I<code>."
    rows = [
        {"conversation_id": "sim_1", "turn": 1, "role": "user", "system": system, "content": "Refund my order."},
        {"conversation_id": "sim_1", "turn": 2, "role": "assistant", "reasoning_content": "A refund request.",
         "content": "Routing it. intent: I042", "intent_codes": ["I042", "I043"]},
        {"conversation_id": "sim_1", "turn": 3, "role": "user", "content": "Thanks, that is all."},
        {"conversation_id": "sim_1", "turn": 4, "role": "assistant", "content": "Goodbye."},
    ]  # fmt: skip
    trace = tmp_path / "workflow.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prof = _profile(tmp_path / "w.json")
    prof.write_text(prof.read_text().replace(str(SAMPLE), str(trace)))
    out = tmp_path / "w"
    res = run_cli(
        ["run", "--profile", str(prof), "--engine-recorded", "--engine-speedup", "20", "--out", str(out)]
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    acc = json.loads((out / "run.json").read_text())["agentic_accuracy"]
    assert acc["score"] == 1.0 and set(acc["domains"]) == {"workflow"}
    assert acc["calls"]["excluded"] == acc["calls"]["issued"] - acc["calls"]["scored"] > 0  # turn 3: no codes
    lines = [r["agentic"] for r in read_lines(sorted(out.glob("records*.jsonl"))) if "agentic" in r]
    first = [a for a in lines if a["turn"] == 1]
    assert first and all(a["content"] == "Routing it. intent: I042" for a in first)
    assert all("content" not in a for a in lines if a["turn"] == 3)  # no intent codes: no text kept
