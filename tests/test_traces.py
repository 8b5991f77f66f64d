"""Trace readers, sniffing, window/rescale, statistics, and the figures derived from the shared traces."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import yaml

from loadtest.traces import (
    TRACE_FORMATS,
    TraceFormatError,
    TraceRecord,
    empirical_points,
    mean_rate,
    read_azure,
    read_bailian,
    read_burstgpt,
    read_loadtest,
    read_mooncake,
    read_trace,
    rescale,
    sniff_format,
    trace_stats,
    window,
)

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
AZURE = TRACES / "azure-llm-2023"
MOONCAKE = TRACES / "mooncake-fast25"

AZURE_CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 23:59:59.9999999,300,30
2023-11-16 23:59:58.5000000,100,10
2023-11-17 00:00:01.0000001,200,20
"""
MOONCAKE_JSONL = """{"timestamp": 3000, "input_length": 1024, "output_length": 7, "hash_ids": [0, 2]}
{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}

{"timestamp": 1500, "input_length": 10, "output_length": 1, "hash_ids": []}
"""
BURSTGPT_CSV = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,GPT-4,1087,0,1087,API log
12.5,ChatGPT,300,200,500,Conversation log
"""
BAILIAN_JSONL = """{"chat_id": 7, "parent_chat_id": -1, "timestamp": 10.5, "input_length": 40, "output_length": 9, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}
{"chat_id": 9, "parent_chat_id": 7, "timestamp": 70.25, "input_length": 80, "output_length": 4, "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4, 5]}
{"chat_id": 12, "parent_chat_id": 9, "timestamp": 99.0, "input_length": 90, "output_length": 2, "type": "image", "turn": 3, "hash_ids": [1, 2, 3, 4, 5, 6]}
{"chat_id": 8, "parent_chat_id": -1, "timestamp": 11.0, "input_length": 5, "output_length": 3, "type": "search", "turn": 1, "hash_ids": [10]}
"""
LOADTEST_JSONL = """{"t": 2.5, "input_tokens": 812, "output_tokens": 96, "session": "s1", "turn": 2, "scenario": "chat"}
{"t": 1.0, "input_tokens": 700, "output_tokens": 50, "hash_ids": [4, 5], "session": "s1", "turn": 1}
{"t": 1.75, "input_tokens": 9, "output_tokens": 1}
"""
SAMPLES = {
    "azure": ("a.csv", AZURE_CSV),
    "mooncake": ("m.jsonl", MOONCAKE_JSONL),
    "burstgpt": ("b.csv", BURSTGPT_CSV),
    "bailian": ("q.jsonl", BAILIAN_JSONL),
    "loadtest": ("l.jsonl", LOADTEST_JSONL),
}


def write(tmp_path: Path, name: str, text: str) -> Path:
    """Write a sample trace file and return its path."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def raises_at(reader: Any, path: Path, line: int | None, *words: str) -> TraceFormatError:
    """Assert reader(path) raises TraceFormatError naming the file, the line and every word."""
    with pytest.raises(TraceFormatError) as info:
        reader(path)
    err = info.value
    text = str(err)
    assert err.path == path and path.name in text
    assert err.line == line
    if line is not None:
        assert f"{path.name}:{line}:" in text
    for word in words:
        assert word in text, text
    return err


# --- readers on inline samples ---------------------------------------------------------------


def test_azure_sorts_rebases_and_keeps_seven_fractional_digits(tmp_path: Path) -> None:
    recs = read_azure(write(tmp_path, "a.csv", AZURE_CSV))
    assert [r.input_tokens for r in recs] == [100, 300, 200]
    assert [r.output_tokens for r in recs] == [10, 30, 20]
    assert recs[0].timestamp_s == 0.0
    assert recs[1].timestamp_s == pytest.approx(1.4999999, abs=1e-9)
    assert recs[2].timestamp_s == pytest.approx(2.5000001, abs=1e-9)  # crosses midnight
    assert recs[2].timestamp_s - recs[1].timestamp_s == pytest.approx(1.0000002, abs=1e-9)
    assert recs[0].hash_ids == () and recs[0].session_id is None


@pytest.mark.parametrize(
    ("row", "line", "words"),
    [
        ("2023-11-16 25:00:00.0,1,2", 3, ["TIMESTAMP", "25:00:00.0"]),
        ("yesterday,1,2", 3, ["TIMESTAMP"]),
        ("2023-11-16 10:00:00.0,12x,2", 3, ["ContextTokens", "12x"]),
        ("2023-11-16 10:00:00.0,1,-2", 3, ["GeneratedTokens", "negative"]),
        ("2023-11-16 10:00:00.0,1", 3, ["expected 3 columns, got 2"]),
    ],
)
def test_azure_malformed_rows(tmp_path: Path, row: str, line: int, words: list[str]) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 10:00:00.0,5,6\n" + row + "\n"
    raises_at(read_azure, write(tmp_path, "bad.csv", text), line, *words)


def test_azure_missing_column_names_header(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.csv", "TIMESTAMP,ContextTokens\n2023-11-16 10:00:00.0,5\n")
    raises_at(read_azure, path, 1, "GeneratedTokens")


def test_mooncake_ms_to_seconds_and_hash_ids(tmp_path: Path) -> None:
    recs = read_mooncake(write(tmp_path, "m.jsonl", MOONCAKE_JSONL))
    assert [r.timestamp_s for r in recs] == [0.0, 0.5, 2.0]
    assert recs[0].hash_ids == (0, 1) and recs[1].hash_ids == () and recs[2].hash_ids == (0, 2)
    assert (recs[2].input_tokens, recs[2].output_tokens) == (1024, 7)


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ('{"timestamp": 1, "input_length": 2, "output_length": 3, ', ["invalid JSON"]),
        ('{"timestamp": 1, "output_length": 3}', ["missing field 'input_length'"]),
        ('{"timestamp": "x", "input_length": 2, "output_length": 3}', ["'timestamp'"]),
        ('{"timestamp": 1, "input_length": 2.5, "output_length": 3}', ["'input_length'", "2.5"]),
        ('{"timestamp": 1, "input_length": 2, "output_length": true}', ["'output_length'"]),
        ('{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [1, "a"]}', ["'hash_ids'"]),
        ("[1, 2, 3]", ["expected a JSON object"]),
    ],
)
def test_mooncake_malformed_lines(tmp_path: Path, bad: str, words: list[str]) -> None:
    good = '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}'
    raises_at(read_mooncake, write(tmp_path, "m.jsonl", f"{good}\n\n{bad}\n{good}\n"), 3, *words)


def test_burstgpt_keeps_failures_and_labels(tmp_path: Path) -> None:
    recs = read_burstgpt(write(tmp_path, "b.csv", BURSTGPT_CSV))
    assert [r.timestamp_s for r in recs] == [0.0, 7.5, 40.0]
    failed = recs[2]
    assert failed.output_tokens == 0 and failed.model == "GPT-4" and failed.kind == "API log"
    assert recs[0].model == "ChatGPT" and recs[0].kind == "Conversation log"


def test_burstgpt_malformed(tmp_path: Path) -> None:
    text = BURSTGPT_CSV + "50,ChatGPT,many,3,3,API log\n"
    raises_at(read_burstgpt, write(tmp_path, "b.csv", text), 5, "Request tokens", "many")


def test_bailian_sessions_turns_and_kinds(tmp_path: Path) -> None:
    recs = read_bailian(write(tmp_path, "q.jsonl", BAILIAN_JSONL))
    assert [r.timestamp_s for r in recs] == [0.0, 0.5, 59.75, 88.5]
    by_turn = {(r.session_id, r.turn): r for r in recs}
    assert set(by_turn) == {("7", 1), ("8", 1), ("7", 2), ("7", 3)}
    assert by_turn[("7", 1)].parent_id is None and by_turn[("7", 3)].parent_id == "9"
    assert by_turn[("7", 3)].kind == "image" and by_turn[("7", 2)].hash_ids == (1, 2, 3, 4, 5)


def test_bailian_malformed(tmp_path: Path) -> None:
    bad = BAILIAN_JSONL + '{"chat_id": 13, "parent_chat_id": 12, "timestamp": 5, "output_length": 1}\n'
    raises_at(read_bailian, write(tmp_path, "q.jsonl", bad), 5, "input_length")


def test_loadtest_format(tmp_path: Path) -> None:
    recs = read_loadtest(write(tmp_path, "l.jsonl", LOADTEST_JSONL))
    assert recs[0] == TraceRecord(0.0, 700, 50, (4, 5), session_id="s1", turn=1)
    assert recs[1] == TraceRecord(0.75, 9, 1)
    assert recs[2] == TraceRecord(1.5, 812, 96, session_id="s1", turn=2, kind="chat")


def test_loadtest_malformed(tmp_path: Path) -> None:
    path = write(
        tmp_path, "l.jsonl", LOADTEST_JSONL + '{"t": 3, "input_tokens": 1, "output_tokens": 1, "turn": "x"}\n'
    )
    raises_at(read_loadtest, path, 4, "'turn'")
    raises_at(read_loadtest, write(tmp_path, "e.jsonl", "\n\n"), None, "no requests")


def test_records_are_frozen_with_slots() -> None:
    rec = TraceRecord(0.0, 1, 2)
    with pytest.raises(AttributeError):
        rec.input_tokens = 3  # type: ignore[misc]
    assert not hasattr(rec, "__dict__")


# --- sniffing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(SAMPLES))
def test_sniff_and_read_trace(tmp_path: Path, fmt: str) -> None:
    name, text = SAMPLES[fmt]
    path = write(tmp_path, name, text)
    assert sniff_format(path) == fmt
    assert read_trace(path) == TRACE_FORMATS[fmt](path) == read_trace(str(path), format=fmt)


def test_sniff_gzip_and_unknown(tmp_path: Path) -> None:
    gz = tmp_path / "m.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as fh:
        fh.write(MOONCAKE_JSONL)
    assert sniff_format(gz) == "mooncake" and len(read_trace(gz)) == 3
    raises_at(sniff_format, write(tmp_path, "x.csv", "\na,b,c\n1,2,3\n"), 2, "unknown trace format")
    raises_at(sniff_format, write(tmp_path, "x.jsonl", '{"foo": 1}\n'), 1, "foo")
    raises_at(sniff_format, write(tmp_path, "empty.csv", ""), None, "empty")
    with pytest.raises(ValueError, match="unknown trace format 'nope'"):
        read_trace(gz, format="nope")


# --- window and rescale -----------------------------------------------------------------------


def _evenly(n: int, gap: float) -> list[TraceRecord]:
    """n records gap seconds apart."""
    return [TraceRecord(i * gap, 10 + i, 5) for i in range(n)]


def test_window_is_half_open_and_rebases() -> None:
    recs = _evenly(10, 1.0)
    cut = window(recs, 2.0, 5.0)
    assert [r.timestamp_s for r in cut] == [0.0, 1.0, 2.0]
    assert [r.input_tokens for r in cut] == [12, 13, 14]
    assert [r.timestamp_s for r in window(recs, 2.5, 5.0, rebase=False)] == [3.0, 4.0]
    assert window(recs, 20.0, 30.0) == []
    with pytest.raises(ValueError):
        window(recs, 5.0, 2.0)


def test_rescale_speedup_and_target_rate() -> None:
    recs = _evenly(11, 1.0)  # 11 requests over 10 s: 1.1 req/s
    assert mean_rate(recs) == pytest.approx(1.1)
    fast = rescale(recs, speedup=4.0)
    assert [r.timestamp_s for r in fast][:3] == [0.0, 0.25, 0.5]
    assert mean_rate(fast) == pytest.approx(4.4)
    slow = rescale(recs, target_rate=0.55)
    assert mean_rate(slow) == pytest.approx(0.55) and slow[-1].timestamp_s == pytest.approx(20.0)
    assert [r.input_tokens for r in slow] == [r.input_tokens for r in recs]
    for kwargs in ({}, {"speedup": 2.0, "target_rate": 1.0}, {"speedup": 0.0}, {"target_rate": -1.0}):
        with pytest.raises(ValueError):
            rescale(recs, **kwargs)


# --- statistics and empirical tables ----------------------------------------------------------


def test_trace_stats_on_a_known_trace() -> None:
    recs = [
        TraceRecord(0.0, 1024, 10, (0, 1)),
        TraceRecord(0.5, 1200, 20, (0, 1, 2)),
        TraceRecord(1.0, 600, 30, (0, 3)),
        TraceRecord(2.0, 100, 40, (4,)),
    ]
    s = trace_stats(recs)
    assert s["count"] == 4 and s["duration_s"] == 2.0 and s["mean_rate_rps"] == 2.0
    gaps = np.array([0.5, 0.5, 1.0])
    assert s["interarrival_mean_s"] == pytest.approx(gaps.mean())
    assert s["interarrival_cv"] == pytest.approx(gaps.std() / gaps.mean())
    assert s["peak_1s_rate_rps"] == 2 and s["peak_to_mean"] == 1.0
    assert s["input_tokens"]["p50"] == 812.0 and s["input_tokens"]["max"] == 1200.0
    assert s["output_tokens"]["mean"] == 25.0
    # blocks: 2 + 3 + 2 + 1 = 8, seen before: 0,1 (req 2) and 0 (req 3) -> 3/8
    assert s["prefix_reuse_share"] == 3 / 8 and s["mean_blocks_per_request"] == 2.0
    # tokens: 1024 + 1200 + 600 + 100 = 2924; reused 512+512 (req 2) + 512 (req 3)
    assert s["prefix_reuse_token_share"] == pytest.approx(1536 / 2924)
    assert "prefix_reuse_share" not in trace_stats(_evenly(5, 1.0))


def test_empirical_points_shape() -> None:
    pts = empirical_points(np.arange(1, 101))
    qs = [q for q, _ in pts]
    vals = [v for _, v in pts]
    assert qs[0] == 0.0 and qs[-1] == 1.0 and all(b > a for a, b in zip(qs, qs[1:], strict=False))
    assert vals[0] == 1.0 and vals[-1] == 100.0 and vals == sorted(vals)
    with pytest.raises(ValueError):
        empirical_points([1, 2], grid=[0.0, 0.5, 0.5, 1.0])


def sample_empirical(points: list[list[float]], n: int, rng: np.random.Generator) -> np.ndarray:
    """Inverse-CDF sampling: u ~ U[0,1), find its segment, interpolate linearly between its ends."""
    qs = np.array([p[0] for p in points])
    vs = np.array([p[1] for p in points])
    u = rng.random(n)
    seg = np.searchsorted(qs, u, side="right") - 1  # qs[seg] <= u < qs[seg + 1]
    frac = (u - qs[seg]) / (qs[seg + 1] - qs[seg])
    return vs[seg] + frac * (vs[seg + 1] - vs[seg])


# --- the real traces --------------------------------------------------------------------------

needs_traces = pytest.mark.skipif(
    not TRACES.is_dir(),
    reason=f"shared traces not found at {TRACES} (expected ../shared/traces from the repo root)",
)


def _load_tool() -> ModuleType:
    """Import tools/derive_trace_stats.py (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "derive_trace_stats", REPO / "tools" / "derive_trace_stats.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def derived(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Run the derivation script once into a temp folder and read back the YAML it wrote."""
    out = tmp_path_factory.mktemp("derived")
    assert _load_tool().main(["--traces", str(TRACES), "--out", str(out)]) == 0
    return {p.stem: yaml.safe_load(p.read_text()) for p in sorted(out.glob("*.yaml"))}


@needs_traces
def test_every_shared_trace_reads(derived: dict[str, dict[str, Any]]) -> None:
    assert set(derived) == {"azure-conv", "azure-code", "mooncake-conversation", "mooncake-synthetic"}
    for doc in derived.values():
        assert doc["stats"]["count"] > 0
        assert doc["source"]["license"]["spdx"] in {"CC-BY-4.0", "Apache-2.0"}
        assert doc["source"]["citation"]
    assert derived["azure-conv"]["source"]["citation"].find("Splitwise") >= 0
    assert derived["mooncake-conversation"]["source"]["citation"].find("FAST 2025") >= 0


# docs/sources.md §6 figures: (trace, stat path, value, relative tolerance). Rates/CV ±10 %, lengths ±5 %.
REFERENCE = [
    ("azure-conv", "mean_rate_rps", 5.5, 0.10),
    ("azure-conv", "interarrival_cv", 1.09, 0.10),
    ("azure-conv", "input_tokens.p50", 1020, 0.05),
    ("azure-conv", "input_tokens.p90", 2735, 0.05),
    ("azure-conv", "output_tokens.p50", 129, 0.05),
    ("azure-conv", "output_tokens.p90", 424, 0.05),
    ("azure-code", "mean_rate_rps", 2.6, 0.10),
    ("azure-code", "interarrival_cv", 13.2, 0.10),
    ("azure-code", "peak_to_mean", 26, 0.10),
    ("azure-code", "input_tokens.p50", 1469, 0.05),
    ("azure-code", "input_tokens.p90", 5188, 0.05),
    ("azure-code", "output_tokens.p50", 13, 0.05),
    ("azure-code", "output_tokens.p90", 55, 0.05),
    ("mooncake-conversation", "input_tokens.mean", 12000, 0.05),
    ("mooncake-conversation", "input_tokens.p50", 6900, 0.05),
    ("mooncake-conversation", "input_tokens.p99", 85000, 0.05),
    ("mooncake-conversation", "output_tokens.mean", 343, 0.05),
]


@needs_traces
@pytest.mark.parametrize(("trace", "stat", "expected", "tol"), REFERENCE)
def test_reference_figures(
    derived: dict[str, dict[str, Any]], trace: str, stat: str, expected: float, tol: float
) -> None:
    value: Any = derived[trace]["stats"]
    for key in stat.split("."):
        value = value[key]
    assert value == pytest.approx(expected, rel=tol), (
        f"{trace} {stat}: {value} vs docs/sources.md §6: {expected}"
    )


@needs_traces
def test_mooncake_prefix_reuse(derived: dict[str, dict[str, Any]]) -> None:
    stats = derived["mooncake-conversation"]["stats"]
    assert 0.37 <= stats["prefix_reuse_token_share"] <= 0.40  # docs/sources.md §6: ~37-40 %
    assert 0.35 <= stats["prefix_reuse_share"] <= 0.40  # per block (last partial block counted whole): 36.6 %
    assert stats["mean_blocks_per_request"] == pytest.approx(24.0, rel=0.02)


@needs_traces
def test_arrival_and_length_specs(derived: dict[str, dict[str, Any]]) -> None:
    for name, doc in derived.items():
        assert doc["arrival"] == {
            "rate": doc["stats"]["mean_rate_rps"],
            "cv": doc["stats"]["interarrival_cv"],
        }
        for col in ("input_tokens", "output_tokens"):
            spec = doc[col]
            assert spec["dist"] == "empirical", name
            qs = [q for q, _ in spec["points"]]
            vals = [v for _, v in spec["points"]]
            assert 21 <= len(qs) <= 41
            assert qs[0] == 0.0 and qs[-1] == 1.0 and all(b > a for a, b in zip(qs, qs[1:], strict=False))
            assert all(b >= a for a, b in zip(vals, vals[1:], strict=False))
            assert vals[-1] == doc["stats"][col]["max"]


SAMPLED_TOL = 0.03  # relative, with a floor of 1 token for short lengths (e.g. code outputs p10 = 7)
N_DRAWS = 50_000


def rank_band(truth: np.ndarray, points: list[list[float]], q: float) -> tuple[float, float]:
    """Values at ranks q -/+ 4 standard errors of a 50k-draw sample quantile, under the trace or the table."""
    delta = 4 * np.sqrt(q * (1 - q) / N_DRAWS)
    ranks = [max(q - delta, 0.0), min(q + delta, 1.0)]
    by_trace = np.quantile(truth, ranks)
    by_table = np.interp(ranks, [p[0] for p in points], [p[1] for p in points])
    return float(min(by_trace[0], by_table[0])), float(max(by_trace[1], by_table[1]))


@needs_traces
@pytest.mark.parametrize(
    ("trace", "file"),
    [
        ("azure-conv", AZURE / "AzureLLMInferenceTrace_conv.csv"),
        ("azure-code", AZURE / "AzureLLMInferenceTrace_code.csv"),
        ("mooncake-conversation", MOONCAKE / "conversation_trace.jsonl"),
        ("mooncake-synthetic", MOONCAKE / "synthetic_trace.jsonl"),
    ],
)
def test_empirical_table_reproduces_trace_quantiles(
    derived: dict[str, dict[str, Any]], trace: str, file: Path
) -> None:
    records = read_trace(file)
    rng = np.random.default_rng(12345)
    for col in ("input_tokens", "output_tokens"):
        truth = np.array([getattr(r, col) for r in records], dtype=float)
        points = derived[trace][col]["points"]
        table = dict((q, v) for q, v in points)
        drawn = sample_empirical(points, N_DRAWS, rng)
        for q in (0.10, 0.50, 0.90, 0.99):
            want, got = np.quantile(truth, q), np.quantile(drawn, q)
            assert table[q] == pytest.approx(want, abs=0.05)  # the table holds the quantile itself
            # Sampled: within 3 % (>= 1 token) or, where the distribution is too steep for 50k draws to pin
            # the value that closely, inside the 4-sigma Monte-Carlo rank band around q (trace or table).
            lo, hi = rank_band(truth, points, q)
            close = abs(got - want) <= max(SAMPLED_TOL * want, 1.0)
            assert close or lo <= got <= hi, (
                f"{trace} {col} p{q * 100:g}: {got:.1f} vs {want:.1f} [{lo}, {hi}]"
            )


def test_derived_stats_count_a_bailian_trace_in_its_own_16_token_blocks(tmp_path: Path) -> None:
    """Two requests of 64 tokens sharing their first two 16-token blocks: a quarter of the blocks (and
    of the tokens) reused; counted in Mooncake's 512-token blocks it would read as whole-prompt reuse."""
    rows = [
        {"chat_id": 0, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 64, "output_length": 8,
         "type": "text", "turn": 1, "hash_ids": [1, 2, 3, 4]},
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 64, "output_length": 8,
         "type": "text", "turn": 1, "hash_ids": [1, 2, 5, 6]},
    ]  # fmt: skip
    path = tmp_path / "qwen_bailian.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, doc = _load_tool().derive_one(path)
    assert doc["source"]["format"] == "bailian"
    assert doc["stats"]["prefix_reuse_share"] == 0.25
    assert doc["stats"]["prefix_reuse_token_share"] == 0.25
