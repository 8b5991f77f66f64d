"""The quality gate (model-free answer checks, quality_min, exit 13) and capture.jsonl, through the CLI."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import read_lines, run_cli, write_profile
from fault_servers import FaultServer

from loadtest.client.openai import PreparedRequest
from loadtest.client.quality import failed_checks
from loadtest.client.record import RequestRecord
from loadtest.metrics.slo import QualitySlo, parse_slos
from loadtest.metrics.verdict import (
    EXIT_CODES,
    Check,
    ExtraCheck,
    ValidityRules,
    judge,
    junit_xml,
    quality_reason,
)
from loadtest.profile.loader import ProfileError, load_profile
from loadtest.profile.quality import QualitySpec
from loadtest.results.capture import capture_line

KEY = "sk-quality-test-0123456789abcdef"
FIXED4 = {"dist": "fixed", "value": 4}  # the fault server's answers carry 4 output tokens
JSON_MODE = {"extra_body": {"response_format": {"type": "json_object"}}}


def _run(tmp_path: Path, host: str | None, *extra: str, **profile: object) -> tuple[int, str, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    overrides: dict[str, object] = {"load": {"concurrency": 2}, "output_tokens": FIXED4, **profile}
    prof = write_profile(tmp_path / "p.yaml", **overrides)
    out = tmp_path / "out"
    where = ["--host", host] if host else ["--engine-speedup", "5"]
    res = run_cli(["run", "--profile", str(prof), *where, "--duration", "2", "--out", str(out), *extra])
    return res.returncode, res.stdout + res.stderr, out


def _run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def _ok_lines(out: Path) -> list[dict]:
    return [r for r in read_lines(sorted(out.glob("records*.jsonl"))) if r["outcome"] == "ok"]


def test_empty_content_fails_the_quality_gate_with_its_exit_code(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    with FaultServer(["empty_content"]) as srv:
        code, log, out = _run(tmp_path, srv.base_url, "--junit", str(junit))
    assert code == EXIT_CODES["quality_failed"] == 13, log[-2000:]
    run = _run_json(out)
    verdict, quality = run["verdict"], run["quality"]
    assert verdict["status"] == "quality_failed"
    first = verdict["reasons"][0]
    assert first.startswith("quality gate failed: 0% of") and "failed empty (empty output)" in first
    assert "default floor" in first
    ok = _ok_lines(out)
    # The server's usage claims tokens, so these are ok requests (not the `empty` outcome): the gate sees them.
    assert ok and all(r["quality_failed"] == ["empty"] for r in ok)
    assert quality["checked"] == len(ok) and quality["passed"] == 0 and quality["pass_rate"] == 0.0
    assert quality["checks"]["empty"]["failed"] == len(ok) and quality["checks"]["json"]["failed"] == 0
    assert quality["min"] == 0.99 and quality["min_source"] == "default"
    gate = next(c for c in verdict["checks"] if c["name"] == "quality_min")
    assert gate["kind"] == "quality" and gate["blocking"] and not gate["passed"]
    case = ET.parse(junit).getroot().find(".//testcase[@name='quality_min']")
    assert case is not None and case.get("classname", "").endswith(".quality")
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "quality_failed"
    line = next(ln for ln in log.splitlines() if ln.startswith("verdict:"))
    assert line.startswith("verdict: QUALITY FAILED (") and "exit 13): quality gate failed" in line
    assert "Quality" in log and "failed: empty" in log  # the console summary's line
    report = (out / "report.html").read_text()
    assert 'id="quality"' in report and "Answer quality" in report


def test_malformed_json_for_json_mode_and_tool_calls_fails_the_gate(tmp_path: Path) -> None:
    with FaultServer(["bad_json", "bad_tool_call"]) as srv:
        code, log, out = _run(tmp_path / "a", srv.base_url, request=JSON_MODE)
    assert code == 13, log[-2000:]
    ok = _ok_lines(out)
    assert {r["finish_reason"] for r in ok} == {"stop", "tool_calls"}
    assert ok and all(r["quality_failed"] == ["json"] for r in ok)
    first = _run_json(out)["verdict"]["reasons"][0]
    assert first.startswith("quality gate failed") and "failed json (malformed JSON" in first
    # The same text without JSON mode is a fine answer; a tool call's arguments are always JSON.
    with FaultServer(["bad_json"]) as srv:
        code, log, out = _run(tmp_path / "b", srv.base_url)
    assert code == 0, log[-2000:]
    assert _run_json(out)["quality"]["pass_rate"] == 1.0 and not any(
        "quality_failed" in r for r in _ok_lines(out)
    )
    with FaultServer(["bad_tool_call"]) as srv:
        code, log, out = _run(tmp_path / "c", srv.base_url)
    assert code == 13 and all(r["quality_failed"] == ["json"] for r in _ok_lines(out)), log[-2000:]


AGENT = {
    "name": "agent",
    "kind": "agent",
    "input_tokens": {"dist": "fixed", "value": 40},
    "output_tokens": {"dist": "fixed", "value": 24},
    "agent": {
        "prefix_tokens": 200,
        "tools": 2,
        "turns": {"dist": "fixed", "value": 1},
        "calls_per_turn": {"dist": "fixed", "value": 3},
        "tool_result_tokens": {"dist": "fixed", "value": 20},
        "think_time_s": {"dist": "fixed", "value": 0},
    },
}


@pytest.mark.parametrize("stream", [True, False])
def test_tool_calls_and_reasoning_are_checked_and_captured_streamed_or_whole(
    tmp_path: Path, stream: bool
) -> None:
    """The embedded engine answers agent calls with tool calls (whole answers too) and reasoning: both
    reach the JSON check and capture.jsonl, whichever way the answer came."""
    prof = tmp_path / "p.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "agent-quality",
                "stream": stream,
                "seed": 2,
                "load": {"concurrency": 2},
                "judging": {"generator_health": "warn"},
                "scenarios": [{**AGENT, "reasoning": True}],
            }
        )
    )
    out = tmp_path / "out"
    res = run_cli(
        ["run", "--profile", str(prof), "--engine-speedup", "5", "--duration", "2", "--out", str(out)]
        + ["--capture", "200"]
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    run = _run_json(out)
    assert run["quality"]["checked"] == run["metrics"]["requests"]["ok"] > 0
    assert run["quality"]["pass_rate"] == 1.0, run["quality"]
    lines = [json.loads(x) for x in (out / "capture.jsonl").read_text().splitlines()]
    calls = [c for c in lines if c["finish_reason"] == "tool_calls"]
    assert calls and all(json.loads(c["tool_calls"]) for c in calls)  # the arguments, as JSON
    assert all(c["reasoning"] for c in lines), [c["id"] for c in lines if not c["reasoning"]]
    assert all(not c["answer"] for c in calls)  # the call is not mistaken for answer text
    res = run_cli(["export", str(out), "--format", "csv", "--out", str(tmp_path / "x")])
    assert res.returncode == 0, res.stderr
    with open(tmp_path / "x" / "samples.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["tool_calls"], r["reasoning"]) for r in rows] == [
        (c["tool_calls"], c["reasoning"]) for c in lines
    ]


def test_an_explicit_quality_min_replaces_the_default_floor(tmp_path: Path) -> None:
    with FaultServer(["empty_content"]) as srv:
        code, log, out = _run(tmp_path, srv.base_url, "--slo", "quality_min=0%")
    assert code == 0, log[-2000:]
    quality = _run_json(out)["quality"]
    assert quality["min"] == 0.0 and quality["min_source"] == "slo" and quality["pass_rate"] == 0.0
    assert _run_json(out)["config"]["slos"] == {"quality_min": 0.0}


def test_a_healthy_run_on_the_embedded_engine_passes_with_every_answer_checked(tmp_path: Path) -> None:
    code, log, out = _run(tmp_path, None, output_tokens={"dist": "uniform", "min": 8, "max": 24})
    assert code == 0, log[-2000:]
    run = _run_json(out)
    quality = run["quality"]
    assert quality["checked"] == run["metrics"]["requests"]["ok"] > 0
    assert quality["pass_rate"] == 1.0 and all(c["failed"] == 0 for c in quality["checks"].values())
    gate = next(c for c in run["verdict"]["checks"] if c["name"] == "quality_min")
    assert gate["passed"] and gate["value"] == 1.0 and gate["limit"] == 0.99
    assert not any("quality_failed" in r for r in _ok_lines(out))
    assert not (out / "capture.jsonl").exists()  # capture is off unless asked for


def test_capture_writes_the_bounded_entries_with_the_exact_bodies_and_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUALITY_TEST_KEY", KEY)
    with FaultServer(["ok", "key_in_answer"]) as srv:
        code, log, out = _run(tmp_path, srv.base_url, "--capture", "3", "--api-key-env", "QUALITY_TEST_KEY")
        bodies = dict(srv.bodies)
        auth = set(srv.authorization)
    assert code == 0, log[-2000:]
    assert auth == {f"Bearer {KEY}"}  # the key was sent ...
    assert len(bodies) > 3
    text = (out / "capture.jsonl").read_text()
    assert KEY not in text  # ... and is nowhere in the capture, though the server echoed it back
    entries = [json.loads(line) for line in text.splitlines()]
    assert len(entries) == 3
    records = {r["id"]: r for r in read_lines(sorted(out.glob("records*.jsonl")))}
    for e in entries:
        assert e["request"] == bodies[e["wire_id"]].decode()  # the exact bytes the server received
        assert e["request_chars"] == len(e["request"]) and e["cut"] == []
        assert records[e["id"]]["wire_id"] == e["wire_id"] and records[e["id"]]["outcome"] == e["outcome"]
        assert e["finish_reason"] == "stop" and e["answer"]
    echoed = [e for e in entries if " key " in e["answer"]]
    assert echoed and all("***" in e["answer"] for e in echoed)
    for path in out.iterdir():  # no file the run wrote holds the key
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path.name
    report = (out / "report.html").read_text()
    assert 'id="samples"' in report and entries[0]["id"] in report
    res = run_cli(["export", str(out), "--format", "csv", "--out", str(tmp_path / "x")])
    assert res.returncode == 0, res.stderr
    with open(tmp_path / "x" / "samples.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["id"] for r in rows] == [e["id"] for e in entries]
    assert [r["request"] for r in rows] == [e["request"] for e in entries]


def test_capture_with_processes_splits_the_bound_over_the_workers(tmp_path: Path) -> None:
    code, log, out = _run(tmp_path, None, "--processes", "2", "--capture", "5")
    assert code == 0, log[-2000:]
    files = sorted(out.glob("capture*.jsonl"))
    assert [p.name for p in files] == ["capture-w0.jsonl", "capture-w1.jsonl"]
    per = [[json.loads(line) for line in p.read_text().splitlines()] for p in files]
    assert [len(e) for e in per] == [3, 2]
    ids = {r["id"]: r["wire_id"] for r in read_lines(sorted(out.glob("records*.jsonl")))}
    assert all(ids[e["id"]] == e["wire_id"] for entries in per for e in entries)
    assert all(json.loads(e["request"])["messages"] for entries in per for e in entries)
    run = _run_json(out)  # the workers' record lines carry the checks to the master's quality section
    assert (
        run["quality"]["checked"] == run["metrics"]["requests"]["ok"] > 0
        and run["quality"]["pass_rate"] == 1.0
    )


def test_capture_cuts_long_texts_and_redacts_a_key_in_the_body() -> None:
    rec = RequestRecord(request_id="r-1", outcome="ok")
    rec.body_sent = json.dumps(
        {"messages": [{"role": "user", "content": f"my key {KEY} " + "x" * 500}]}
    ).encode()
    rec.answer_text = "y" * 100
    line = capture_line(rec, 64, (KEY,))
    assert KEY not in line.request and line.request.startswith(
        '{"messages": [{"role": "user", "content": "my key ***'
    )
    assert len(line.request) == 64 and line.request_chars > 500 and line.cut == ["request", "answer"]
    assert line.answer == "y" * 64 and line.answer_chars == 100


def _rec(
    text: str, finish: str = "stop", tokens: int = 10, asked: int = 10, tools: str = ""
) -> RequestRecord:
    rec = RequestRecord(request_id="r", outcome="ok", finish_reason=finish, requested_output_tokens=asked)
    rec.answer_text, rec.tool_calls_text, rec.completion_tokens_server = text, tools, tokens
    return rec


def _req(reference: str | None = None, **body: object) -> PreparedRequest:
    return PreparedRequest("r", "chat", dict(body), 5, 10, reference=reference)


def test_the_per_request_checks() -> None:
    spec = QualitySpec()
    assert failed_checks(_rec(" an answer"), _req(), {}, spec) == []
    assert failed_checks(_rec("  \n"), _req(), {}, spec) == ["empty"]
    # length: the finish reason and the count against max_tokens (ignore_eos asks for exactly max_tokens)
    assert failed_checks(_rec("a", "length"), _req(ignore_eos=True), {}, spec) == []
    assert failed_checks(_rec("a", "length"), _req(), {}, spec) == ["finish_reason"]
    assert failed_checks(_rec("a", tokens=5), _req(ignore_eos=True), {}, spec) == ["length"]
    assert failed_checks(_rec("a", tokens=5), _req(), {}, spec) == []
    assert failed_checks(_rec("a", tokens=12), _req(), {}, spec) == ["length"]
    assert failed_checks(_rec("a", "content_filter"), _req(), {}, spec) == ["finish_reason"]
    # JSON: JSON mode from the body or the profile's extra body; tool-call arguments (several calls)
    assert failed_checks(_rec('{"a": 1'), _req(), JSON_MODE["extra_body"], spec) == ["json"]
    assert failed_checks(_rec('{"a": 1}'), _req(response_format={"type": "json_object"}), {}, spec) == []
    assert failed_checks(_rec("", "tool_calls", tools='{"a": "}{"}{"b": [1]}'), _req(), {}, spec) == []
    assert failed_checks(_rec("", "tool_calls", tools='{"a": 1}{"b": '), _req(), {}, spec) == ["json"]
    assert failed_checks(_rec("a", "tool_calls"), _req(), {}, spec) == ["finish_reason"]
    # a tool finish with no call and no text: nothing came back
    assert failed_checks(_rec("", "tool_calls"), _req(), {}, spec) == ["empty", "finish_reason"]
    # the reference match
    exact, contains = QualitySpec(match="exact", ignore_case=True), QualitySpec(match="contains")
    assert failed_checks(_rec(" Paris "), _req("paris"), {}, exact) == []
    assert failed_checks(_rec("Paris, France"), _req("Paris"), {}, exact) == ["match"]
    assert failed_checks(_rec("Paris, France"), _req("Paris"), {}, contains) == []
    assert failed_checks(_rec("Paris, France"), _req(), {}, contains) == []  # no reference: not matched
    regex = QualitySpec(match="regex", pattern=r"^\d+$")
    assert failed_checks(_rec("42"), _req(), {}, regex) == [] and failed_checks(
        _rec("x"), _req(), {}, regex
    ) == ["match"]
    by_reference = QualitySpec(
        match="regex"
    )  # the reference is the pattern; one that does not compile is literal
    assert failed_checks(_rec("it is 42."), _req(r"\b42\b"), {}, by_reference) == []
    assert failed_checks(_rec("f(x"), _req("f(x"), {}, by_reference) == []
    assert failed_checks(_rec("g(x"), _req("f(x"), {}, by_reference) == ["match"]
    # only ok answers of text APIs are checked
    failed = _rec("")
    failed.outcome = "http_5xx"
    assert failed_checks(failed, _req(), {}, spec) == []


def test_quality_options_and_slo_errors_name_the_field(tmp_path: Path) -> None:
    assert parse_slos("quality_min=99.5%") == [QualitySlo(0.995)]
    with pytest.raises(ValueError, match="quality_min"):
        parse_slos("quality_min=high")
    prof = write_profile(tmp_path / "bad.yaml", quality={"match": "regex", "pattern": "("})
    with pytest.raises(ProfileError) as e:
        load_profile(str(prof))
    assert (
        "bad.yaml" in str(e.value)
        and "quality.pattern" in str(e.value)
        and "not a regular expression" in str(e.value)
    )
    prof = write_profile(tmp_path / "both.yaml", capture={"first": 3, "sample": 0.1})
    with pytest.raises(ProfileError, match="exactly one of first"):
        load_profile(str(prof))
    ok = write_profile(tmp_path / "ok.yaml", slos={"quality_min": "95%"}, capture={"sample": 0.5})
    assert load_profile(str(ok))[0].slos == {"quality_min": "95%"}
    res = run_cli(["run", "--profile", str(ok), "--capture", "0", "--duration", "1"])
    assert res.returncode == 2 and "--capture 0" in res.stderr


def _quality_check(passed: bool) -> ExtraCheck:
    check = Check("quality_min", passed, "50% of 10 ok answers passed", "quality", 0.5, 0.99)
    return ExtraCheck(check, quality_reason(check.detail))


def test_the_quality_gate_ranks_after_a_failing_endpoint_and_before_an_invalid_run() -> None:
    def metrics(failed: int) -> dict:
        n = 10 + failed
        return {
            "requests": {"ok": 10, "failed": failed, "completed": n, "error_rate": failed / n},
            "window": {"duration_s": 5.0},
        }

    invalid = ValidityRules(min_duration_s=100)
    v = judge(metrics(0), None, None, invalid, extra_checks=[_quality_check(False)])
    assert v.status == "quality_failed" and v.exit_code == 13
    assert v.reasons[0] == "quality gate failed: 50% of 10 ok answers passed"
    assert v.reasons[1].startswith("invalid: min_duration")
    v = judge(metrics(5), None, None, invalid, extra_checks=[_quality_check(False)])
    assert v.status == "error_rate"
    assert v.reasons[0].startswith("error rate over limit") and v.reasons[1].startswith("quality gate failed")
    v = judge(metrics(0), None, None, None, extra_checks=[_quality_check(True)])
    assert v.status == "pass" and not v.reasons
    xml = ET.fromstring(junit_xml(judge(metrics(0), None, None, None, extra_checks=[_quality_check(False)])))
    failure = xml.find(".//testcase[@name='quality_min']/failure")
    assert failure is not None and failure.get("type") == "quality_failed"
    assert failure.get("message", "").startswith("quality gate failed")
