"""The `endpoints` metric convention (MLPerf Endpoints v1.0) and the `loadgen` one, recomputed here from a
run's record log with this file's own numpy code (not loadtest's convention module) and checked against
what loadtest wrote: result_summary.json and mlperf_log_summary.txt."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

import loadtest
from loadtest.client.messages_sse import parse_messages_stream
from loadtest.client.openai import OpenAIClient, PreparedRequest
from loadtest.client.record import RequestRecord
from loadtest.client.sse import parse_stream
from loadtest.contracts.record_line import LINE_DECODER, LINE_ENCODER
from loadtest.metrics.endpoints import tpot_ns
from loadtest.tokens.tokenizer import Tokenizer
from tests.conftest import byte_level_tokenizer, run_cli, write_profile
from tests.fault_servers import FaultServer

try:
    import scipy.special as scipy_special
except ImportError:  # pragma: no cover - SciPy is optional
    scipy_special = None

MODEL_FILES = Path(__file__).parent / "data" / "endpoints-model"
GRID = (99.9, 99.0, 97.0, 95.0, 90.0, 80.0, 75.0, 50.0, 25.0, 10.0, 5.0, 1.0)


def model_folder(where: Path) -> Path:
    """The test model: the project's chat template and a byte-level tokenizer with no merges (one token
    per ASCII character), built here with the tokenizers library."""
    folder = where / "endpoints-model"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL_FILES / "chat_template.jinja", folder)
    byte_level_tokenizer(folder / "tokenizer.json")
    return folder


# ---- the first chunk carrying 4 tokens: v1.0 TPOT against (E2E − TTFT) / (n − 1) ----


def test_tpot_counts_the_tokens_after_the_first_chunk() -> None:
    base = 1_000_000_000
    rec = RequestRecord(
        request_id="r-1",
        scheduled_ns=base,
        sent_ns=base + 1_000_000,
        first_token_ns=base + 10_000_000,  # TTFT 10 ms
        done_ns=base + 110_000_000,  # E2E 110 ms
        chunk_ns=[base + 10_000_000 + i * 5_000_000 for i in range(21)],
        outcome="ok",
        completion_tokens_client=24,
        chunk_chars=[4] + [1] * 20,
        endpoints_output_tokens=24,
        endpoints_tpot_tokens=20,
    )
    line = LINE_DECODER.decode(LINE_ENCODER.encode(rec.to_log()))
    assert line.endpoints_tpot_tokens == 20 and line.endpoints_output_tokens == 24
    assert line.chunk_chars == [4] + [1] * 20
    # v1.0: (complete − first chunk) / the 20 tokens after it; loadtest's own: (E2E − TTFT) / 23
    assert tpot_ns(line) == pytest.approx(100_000_000 / 20)
    assert line.tpot_us == pytest.approx(100_000 / 23, abs=0.05)
    assert tpot_ns(line) != pytest.approx(line.tpot_us * 1000, rel=0.01)
    back = RequestRecord.from_log(line, base)
    assert (
        back.endpoints_tpot_tokens == 20
        and back.endpoints_output_tokens == 24
        and back.chunk_chars == rec.chunk_chars
    )


def test_an_older_line_still_decodes_and_writes_none_of_the_new_fields() -> None:
    old = b'{"id":"a","outcome":"ok","ttft_us":5,"e2e_us":50,"chunks_us":[5,50],"output_tokens":2}'
    line = LINE_DECODER.decode(old)
    assert line.first_tokens is None and line.templated_output_tokens is None and line.chunk_lengths == []
    fresh = json.loads(LINE_ENCODER.encode(RequestRecord(request_id="x").to_log()))
    assert not {
        "chunk_chars",
        "first_chunk_tokens",
        "endpoints_output_tokens",
        "endpoints_tpot_tokens",
    } & set(fresh)
    # without the tokens after the first chunk, TPOT takes 1 token for the first chunk (LoadGen's n − 1)
    assert tpot_ns(line) == pytest.approx(45_000 / 1)
    # a line of the version that kept the first chunk's tokens: the output count less them
    older = LINE_DECODER.decode(old[:-1] + b',"first_chunk_tokens":1,"endpoints_output_tokens":4}')
    assert tpot_ns(older) == pytest.approx(45_000 / 3)


def test_the_parser_keeps_each_chunks_characters_and_the_first_output_bearing_chunk() -> None:
    events = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},  # no fragment: not a chunk
        {"choices": [{"delta": {"reasoning_content": "Hmm."}}]},
        {"choices": [{"delta": {"content": "Yes, "}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"x":1}'}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    s = parse_stream([body], [7])
    assert s.chunk_chars == [4, 5, 0, 7] and len(s.chunk_ns) == 4
    assert s.first_text == "Hmm."
    assert s.tool_calls == [{"name": "f", "arguments": '{"x":1}'}]


# ---- the Endpoints output count through the chat template ----


def test_the_answer_is_counted_through_the_chat_template(tmp_path: Path) -> None:
    tok = Tokenizer(str(model_folder(tmp_path)))
    counter = tok.assistant
    assert counter.templated
    # the test template renders "<|user|><|end|>\n<|assistant|>{reasoning}{content}{calls}<|end|>\n";
    # one token per character, so each count is the length of what the answer adds
    assert counter.templated_count("hello") == len("hello")
    assert counter.templated_count("hi", "think") == len("<think>think</think>hi")
    # the arguments are parsed as JSON before rendering: tojson writes '{"x": 1}', not the raw '{"x":1}'
    call = {"name": "f", "arguments": '{"x":1}'}
    assert counter.templated_count("", "", [call]) == len('<tool>f {"x": 1}</tool>')
    # conversation + assistant − conversation + empty assistant, by hand
    full = tok.count_rendered(
        [{"role": "user", "content": ""}, {"role": "assistant", "content": "abc"}], False
    )
    empty = tok.count_rendered([{"role": "user", "content": ""}, {"role": "assistant", "content": ""}], False)
    assert counter.templated_count("abc") == full - empty == 3


def test_a_text_answer_is_counted_plainly_and_a_structured_one_through_the_template(tmp_path: Path) -> None:
    """The reference client's two paths (its OslTrigger and TpotTrigger): plain text is tokenized as it
    is, an answer with reasoning or tool calls is rendered; here a template that trims the content tells
    them apart."""
    folder = model_folder(tmp_path)
    template = (
        (folder / "chat_template.jinja")
        .read_text()
        .replace('{{ m.content or "" }}', '{{ (m.content or "") | trim }}')
    )
    (folder / "chat_template.jinja").write_text(template)
    counter = Tokenizer(str(folder)).assistant
    # text only: the plain count, spaces kept; the tokens after the first chunk likewise
    assert counter.endpoints_counts("  two words ", "", [], "  two") == (len("  two words "), len(" words "))
    # with reasoning: rendered (the content trimmed); the first chunk is the first reasoning fragment
    total, after = counter.endpoints_counts(" ok ", "let me think", [], "let ")
    assert total == len("<think>let me think</think>ok")
    assert after == len("<think>me think</think>ok")
    # not streamed: no first chunk, no TPOT count
    assert counter.endpoints_counts("x", "", [], None) == (1, None)


def test_without_a_template_a_structured_answer_is_counted_as_the_reference_falls_back(
    tmp_path: Path,
) -> None:
    folder = model_folder(tmp_path)
    (folder / "chat_template.jinja").unlink()
    tok = Tokenizer(str(folder))
    assert not tok.assistant.templated
    call = {"name": "f", "arguments": "{}"}
    # its parts joined by newlines, the calls as JSON
    total, _ = tok.assistant.endpoints_counts("hello", "hm", [call], None)
    assert total == len("hello\nhm\n" + json.dumps([call], separators=(",", ":")))


# ---- one run, its figures recomputed here ----


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("conv")
    model = model_folder(base)
    prof = write_profile(base / "p.yaml", duration_s=3)
    out = base / "run"
    r = run_cli(["run", "--profile", str(prof), "--tokenizer", str(model), "--out", str(out)], timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = run_cli(["report", str(out), "--convention", "endpoints"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("result_summary.json") and "TTFT P90" in r.stdout
    return out


def _lines(run: Path) -> list[dict[str, Any]]:
    return [
        json.loads(x) for f in sorted(run.glob("records*.jsonl")) for x in f.read_text().splitlines() if x
    ]


def _lower(values: list[float], p: float) -> float:
    """numpy's method="lower": the sorted sample at floor((n − 1)·p/100), in exact integer arithmetic."""
    s = sorted(values)
    return s[(len(s) - 1) * round(p * 10) // 1000]


def _es_estimate(values: list[float], p: float) -> float | None:
    """The early-stopping estimate by its definition, with SciPy's incomplete beta: the largest t ≥ 1
    with n ≥ h(t) + t, h(t) the smallest h with I_p(h, t + 1) < 1 − 0.99; the t-th largest sample."""
    s, n = sorted(values), len(values)
    hs = np.arange(1, n + 1)
    best = None
    for t in range(1, n):
        below = np.nonzero(scipy_special.betainc(hs, t + 1, p / 100) < 0.01)[0]
        if not below.size or hs[below[0]] + t > n:
            break
        best = s[n - t]
    return best


def test_endpoints_figures_equal_an_independent_recomputation(run_dir: Path) -> None:
    summary = json.loads((run_dir / "result_summary.json").read_text())
    assert summary["metric_convention"] == "endpoints"
    doc = json.loads((run_dir / "run.json").read_text())
    lines = _window_lines(run_dir)
    issued = [ln for ln in lines if ln.get("sent_us") is not None]
    ok = [ln for ln in issued if ln["outcome"] == "ok"]
    assert len(ok) > 20
    assert summary["n_samples_issued"] == len(issued) and summary["n_samples_completed"] == len(ok)
    # every answer counted the Endpoints way, with the tokens after its first chunk
    assert all("endpoints_output_tokens" in ln and "endpoints_tpot_tokens" in ln for ln in ok)
    assert all(len(ln["chunk_chars"]) == len(ln["chunks_us"]) for ln in ok)
    # one token per character: a text answer's count is its characters, the rest's its later chunks'
    assert all(ln["endpoints_output_tokens"] == sum(ln["chunk_chars"]) for ln in ok)
    assert all(ln["endpoints_tpot_tokens"] == sum(ln["chunk_chars"][1:]) for ln in ok)

    ttft = [ln["ttft_us"] * 1000 for ln in ok]
    latency = [ln["e2e_us"] * 1000 for ln in ok]
    tpot = [
        (ln["e2e_us"] - ln["ttft_us"]) * 1000 / sum(ln["chunk_chars"][1:])
        for ln in ok
        if sum(ln["chunk_chars"][1:])
    ]
    osl = [ln["endpoints_output_tokens"] for ln in ok]
    for name, values in (("ttft", ttft), ("latency", latency), ("tpot", tpot)):
        block = summary[name]
        assert list(block["percentiles"]) == [str(p) for p in GRID]
        for p in GRID:
            assert block["percentiles"][str(p)] == pytest.approx(_lower(values, p), rel=1e-12), (name, p)
        assert block["median"] == pytest.approx(_lower(values, 50.0))
        assert block["min"] == pytest.approx(min(values)) and block["max"] == pytest.approx(max(values))
        assert block["avg"] == pytest.approx(float(np.mean(values)))
        assert block["std_dev"] == pytest.approx(float(np.std(values, ddof=1)))
        assert sum(block["histogram"]["counts"]) == len(values) and len(block["histogram"]["buckets"]) == 30
        assert list(block["early_stopping_percentiles"]) == [str(p) for p in GRID if p >= 50]
    start = min(ln["t"] for ln in issued)
    end = max(ln["t"] + ln["e2e_us"] / 1e6 for ln in issued if ln.get("e2e_us") is not None)
    assert summary["duration_ns"] == pytest.approx((end - start) * 1e9, abs=2)
    assert summary["tps"] == summary["system_tps"] == pytest.approx(sum(osl) / (end - start), rel=1e-6)
    tpot_p90_ms = _lower(tpot, 90.0) / 1e6
    assert summary["tps_per_user"] == pytest.approx(1000 / tpot_p90_ms, rel=1e-12)
    assert summary["output_sequence_lengths"]["total"] == sum(osl)
    assert summary["input_sequence_lengths"]["total"] == sum(ln["prompt_tokens"] for ln in ok)
    reasons = summary["finish_reason_counts"]
    assert sum(reasons.values()) == len(ok) and reasons["length"] == sum(
        ln["finish_reason"] == "length" for ln in ok
    )
    # the server's usage stays beside: here the engine counts llama3 tokens, the template counts characters
    usage = doc["tokens"]["endpoints"]
    assert (
        usage["counted_by"] == "endpoints" and usage["endpoints_output_total"] > usage["usage_output_total"]
    )
    assert summary["loadtest"]["notes"] == []


@pytest.mark.skipif(
    scipy_special is None, reason="SciPy is not installed: scipy.special.betainc is the reference here"
)
def test_early_stopping_percentiles_equal_their_definition(run_dir: Path) -> None:
    summary = json.loads((run_dir / "result_summary.json").read_text())
    ok = _window_lines(run_dir)
    ok = [ln for ln in ok if ln["outcome"] == "ok" and ln.get("sent_us") is not None]
    for name, values in (
        ("ttft", [ln["ttft_us"] * 1000 for ln in ok]),
        ("latency", [ln["e2e_us"] * 1000 for ln in ok]),
    ):
        es = summary[name]["early_stopping_percentiles"]
        for p in GRID[:8]:
            assert es[str(p)] == _es_estimate(values, p), (name, p)
        # with some 80 samples: an estimate at the median, none at p99.9 (too few for t = 1)
        assert es["50.0"] is not None and es["99.9"] is None


def _window_lines(run: Path) -> list[dict[str, Any]]:
    """The record log's lines scheduled inside run.json's judged window (all of them without one)."""
    judged = json.loads((run / "run.json").read_text()).get("judged")
    lines = _lines(run)
    if judged:
        lo, hi = judged["window"]["start"], judged["window"]["end"]
        lines = [ln for ln in lines if lo <= ln["t"] < hi]
    return lines


def _summary_value(text: str, label: str) -> float:
    m = re.search(rf"^{re.escape(label)}\s*:\s*(\S+)$", text, re.MULTILINE)
    assert m, label
    return float(m.group(1))


def test_loadgen_figures_equal_an_independent_recomputation(run_dir: Path) -> None:
    r = run_cli(["report", str(run_dir), "--convention", "loadgen"])
    assert r.returncode == 0, r.stderr
    text = (run_dir / "mlperf_log_summary.txt").read_text()
    # each file states its convention: LoadGen's rule in the summary, loadtest's in run.json and the report
    assert "percentile_rule : sorted[floor(n * p)]" in text
    assert json.loads((run_dir / "run.json").read_text())["metric_convention"] == "loadtest"
    assert "Metric convention: loadtest" in (run_dir / "report.html").read_text()
    ok = [ln for ln in _lines(run_dir) if ln["outcome"] == "ok"]
    series = {
        "latency": [ln["e2e_us"] * 1000 for ln in ok],
        "first token latency": [ln["ttft_us"] * 1000 for ln in ok],
    }
    for name, values in series.items():
        s = sorted(values)
        for p in (50.0, 90.0, 95.0, 97.0, 99.0, 99.9):
            want = s[min(math.floor(len(s) * p / 100), len(s) - 1)]  # LoadGen: sorted[floor(n * p)]
            assert _summary_value(text, f"{p:.2f} percentile {name} (ns)") == want, (name, p)


def test_the_two_conventions_differ_where_their_rules_do(run_dir: Path) -> None:
    """The same TTFT series read by both rules: the index differs by one wherever ⌊n·p⌋ ≠ ⌊(n−1)·p⌋."""
    summary = json.loads((run_dir / "result_summary.json").read_text())
    lines = _window_lines(run_dir)
    s = sorted(
        ln["ttft_us"] * 1000 for ln in lines if ln["outcome"] == "ok" and ln.get("sent_us") is not None
    )
    n = len(s)
    p = next((q for q in GRID if math.floor(n * q / 100) != (n - 1) * round(q * 10) // 1000), None)
    assert p is not None
    assert summary["ttft"]["percentiles"][str(p)] == s[(n - 1) * round(p * 10) // 1000]
    assert summary["ttft"]["percentiles"][str(p)] <= s[min(math.floor(n * p / 100), n - 1)]


class _Report(msgspec.Struct):
    """The reference client's Report fields and their types (docs/sources.md §2), declared here."""

    version: str
    git_sha: str | None
    test_started_at: int
    n_samples_issued: int
    n_samples_completed: int
    n_samples_failed: int
    duration_ns: int | None
    state: str
    complete: bool
    ttft: dict[str, Any]
    tpot: dict[str, Any]
    latency: dict[str, Any]
    output_sequence_lengths: dict[str, Any]
    input_sequence_lengths: dict[str, Any]
    legacy_loadgen_window_duration_ns: int | None
    qps: float | None
    tps: float | None
    finish_reason_counts: dict[str, int]
    run_config: dict[str, Any] | None


def test_result_summary_decodes_as_the_reference_report(run_dir: Path) -> None:
    report = msgspec.json.decode((run_dir / "result_summary.json").read_bytes(), type=_Report)
    # the commit of the checkout loadtest runs from (None outside a git checkout of its own)
    root = Path(loadtest.__file__).resolve().parents[1]
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False)
    assert report.git_sha == (git.stdout.strip() if git.returncode == 0 else None)
    assert report.test_started_at > 1_600_000_000 * 10**9 and report.complete
    assert set(report.finish_reason_counts) == {
        "stop",
        "length",
        "tool_calls",
        "content_filter",
        "function_call",
        "other",
    }
    for block in (report.ttft, report.tpot, report.latency):
        hist = block["histogram"]
        assert all(lo < hi for lo, hi in hist["buckets"]) and len(hist["counts"]) == len(hist["buckets"])


def test_a_messages_stream_keeps_each_deltas_characters() -> None:
    events = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 3}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "So"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Paris."}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
        {"type": "message_stop"},
    ]
    body = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    s = parse_messages_stream([body], [3])
    assert s.chunk_chars == [2, 6] and s.first_text == "So" and len(s.chunk_ns) == 2


def test_the_template_may_come_from_tokenizer_config(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tok = Tokenizer(str(folder))
    assert tok.template_file == "tokenizer_config.json" and tok.assistant.templated
    assert tok.assistant.templated_count("hi", "think") == len("<think>think</think>hi")


def test_a_streamed_tool_call_is_counted_through_the_template(tmp_path: Path) -> None:
    """The real client against a server streaming a tool call: its name first (a chunk of no characters),
    then argument fragments that do not parse as JSON, so the template renders them as the string they are."""
    tok = Tokenizer(str(model_folder(tmp_path)))
    with FaultServer(["bad_tool_call"]) as srv:
        client = OpenAIClient(srv.base_url, None, tok)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        rec = client.send(PreparedRequest("t-0", "chat", body, 1, 4), 0, 0.0)
        client.close()
    args = '{"city": "Paris, Fr'
    assert rec.tool_calls_text == args and rec.chunk_chars == [0, 7, 6, 2, 4]
    assert rec.endpoints_output_tokens == len("<tool>get_weather " + json.dumps(args) + "</tool>")
    # TPOT counts what followed the first delta, which carried the call's name (the reference's rule)
    assert rec.endpoints_tpot_tokens == len("<tool> " + json.dumps(args) + "</tool>")
    assert rec.completion_tokens_client == len(args)  # loadtest's own count: the arguments' text


def test_an_answer_the_template_refuses_is_counted_plainly_and_not_claimed(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m.reasoning_content %}{{ raise_exception('no reasoning here') }}"
        "{% endif %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    )
    counter = Tokenizer(str(folder)).assistant
    assert counter.templated and counter.templated_count("abc") == len("<|assistant|>abc") - len(
        "<|assistant|>"
    )
    assert counter.templated_count("abc", "why") is None and counter.failed == 1
    assert counter.endpoints_counts("abc", "why", [], None)[0] == len("abc\nwhy")
