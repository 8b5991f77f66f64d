"""mlperf_log_summary.txt against a real LoadGen run (mlcommons-loadgen): one parser reads both, Server and Offline."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtest.contracts.record_line import LINE_DECODER
from loadtest.metrics import hdr
from loadtest.metrics.samples import LatencySamples
from loadtest.results.mlperf_summary import OWN_SECTION, SUMMARY_NAME
from tests.conftest import run_cli
from tests.loadgen_summary import RULE, LoadGenSummary, parse_summary

pytest.importorskip("mlperf_loadgen")
SUT = Path(__file__).with_name("loadgen_sut.py")
ES_FORMS = (
    [" * Run successful."],
    [
        re.compile(r" \* Run unsuccessful\."),
        re.compile(r" \* Processed \d+ queries\."),
        re.compile(r" \* Would need to run at least \d+ more queries,"),
        re.compile(r" with the run being successful if every additional"),
        re.compile(r" query were under latency\."),
    ],
    [""],  # LoadGen's empty recommendation (its TTFT result when TPOT already failed)
)


def loadgen_summary(
    tmp_path: Path, scenario: str, qps: float, ttft_ms: float, tpot_ms: float, tokens: int
) -> str:
    """A real LoadGen run of ~2 s with an in-process SUT of that latency shape; its summary text (its
    other logs beside it in ``tmp_path/loadgen-<scenario>``)."""
    folder = tmp_path / f"loadgen-{scenario}"
    folder.mkdir()
    args = [scenario, str(qps), f"{ttft_ms:.3f}", f"{tpot_ms:.3f}", str(tokens), "2000", "16", "2000", "100"]
    proc = subprocess.run(
        [sys.executable, str(SUT), *args], cwd=folder, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return (folder / "mlperf_log_summary.txt").read_text()


def prefixes(text: str, upto: str) -> list[str]:
    """Each 'key : value' line's text before its value (spacing included), up to the line ``upto``."""
    head = text.split(upto, 1)[0]
    return [ln.rsplit(": ", 1)[0] for ln in head.splitlines() if ": " in ln and not ln.startswith("SUT name")]


def es_form(block: list[str]) -> bool:
    for form in ES_FORMS:
        if len(form) == len(block) and all(
            (f.fullmatch(ln) is not None) if isinstance(f, re.Pattern) else f == ln
            for f, ln in zip(form, block, strict=True)
        ):
            return True
    return False


def check_consistent(s: LoadGenSummary) -> None:
    """What holds in any LoadGen summary: the flags decide the result; integer ns stats in order."""
    flags = [v for k, v in s.results.items() if k.endswith("satisfied")]
    assert set(flags) <= {"Yes", "NO"} and flags
    assert s.results["Result is"] == ("VALID" if all(f == "Yes" for f in flags) else "INVALID")
    for prefix in ("latency", "first token latency", "time to output token"):
        values = [int(v) for k, v in s.stats.items() if k.endswith(f"percentile {prefix} (ns)")]
        assert values == sorted(values)
    for block in s.early_stopping.values():
        assert es_form(block), block


def exact_samples(run_dir: Path) -> LatencySamples:
    samples = LatencySamples()
    samples.add(
        [LINE_DECODER.decode(ln) for ln in (run_dir / "records.jsonl").read_bytes().splitlines() if ln]
    )
    return samples


def test_server_summary_reads_like_loadgens(tmp_path: Path) -> None:
    out = tmp_path / "ours"
    args = ["run", "--profile", "mlperf-llama3.1-8b-server", "--duration", "5", "--rate", "8"]
    proc = run_cli([*args, "--engine-speedup", "20", "--out", str(out)], timeout=120)
    assert proc.returncode in (0, 10, 11), proc.stderr[-2000:]
    run = json.loads((out / "run.json").read_text())
    lat = run["metrics"]["latency_ms"]
    tokens = round(
        run["metrics"]["tokens"]["counted_output_total"] / max(run["metrics"]["requests"]["ok"], 1)
    )
    text = (out / SUMMARY_NAME).read_text()
    real_text = loadgen_summary(tmp_path, "Server", 8, lat["ttft"]["p50"], lat["tpot"]["p50"], tokens)
    ours, real = parse_summary(text), parse_summary(real_text)
    # One parser, the same fields in the same order, the same spacing, LoadGen's forms
    assert list(ours.results) == list(real.results)
    assert list(ours.stats) == list(real.stats) and list(ours.params) == list(real.params)
    assert prefixes(text, "Test Parameters Used") == prefixes(real_text, "Test Parameters Used")
    assert list(ours.early_stopping) == list(real.early_stopping) == ["TTFT", "TPOT"]
    check_consistent(ours)
    check_consistent(real)
    assert real.rest == [""] and ours.rest[:4] == ["", RULE, OWN_SECTION, RULE]
    # A 5 s run of an MLPerf profile is not valid: LoadGen's 600 s minimum
    assert ours.results["Result is"] == "INVALID" and ours.results["Min duration satisfied"] == "NO"
    assert ours.params["min_duration (ms)"] == "600000" and ours.params["min_query_count"] == "100"
    assert (
        ours.params["ttft_latency (ns)"] == "2000000000" and ours.params["tpot_latency (ns)"] == "100000000"
    )
    # LoadGen's percentile rule on the record log's exact samples
    samples = exact_samples(out)
    for metric, label in (
        ("ttft", "first token latency"),
        ("tpot", "time to output token"),
        ("e2e", "latency"),
    ):
        for p in (50.0, 90.0, 99.0):
            want = round((samples.percentile(metric, p) or 0) * 1000)
            assert int(ours.stats[f"{p:.2f} percentile {label} (ns)"]) == want, (metric, p)
    n = samples.issued
    span = (samples.last_scheduled or 0) - (samples.first_scheduled or 0)
    assert float(ours.stats["Scheduled samples per second"]) == pytest.approx((n - 1) / span, abs=0.01)
    # the same latency shape: LoadGen's SUT answered with our median TTFT
    real_p50 = int(real.stats["50.00 percentile first token latency (ns)"]) / 1e6
    assert lat["ttft"]["p50"] <= real_p50 <= lat["ttft"]["p50"] * 3 + 5


def test_offline_summary_reads_like_loadgens(tmp_path: Path) -> None:
    out = tmp_path / "ours"
    args = ["run", "--profile", "offline-max-throughput", "--duration", "3", "--concurrency", "16"]
    proc = run_cli([*args, "--engine-speedup", "20", "--out", str(out)], timeout=120)
    assert proc.returncode in (0, 10, 11), proc.stderr[-2000:]
    text = (out / SUMMARY_NAME).read_text()
    real_text = loadgen_summary(tmp_path, "Offline", 50, 5, 1, 8)
    ours, real = parse_summary(text), parse_summary(real_text)
    assert ours.results["Scenario"] == real.results["Scenario"] == "Offline"
    assert list(ours.results) == list(real.results)
    assert list(ours.stats) == list(real.stats) and list(ours.params) == list(real.params)
    assert prefixes(text, "Test Parameters Used") == prefixes(real_text, "Test Parameters Used")
    assert ours.early_stopping == real.early_stopping == {}
    check_consistent(ours)
    check_consistent(real)
    assert float(ours.results["Samples per second"]) > 0 and float(ours.results["Tokens per second"]) > 0


def trace_latencies(trace: str, event: str) -> np.ndarray:
    """Per sample, LoadGen's latency from its scheduled time (ns): ``issue_delay + issue_to_done`` of
    each ``Latency`` (completion) or ``Token_Latency`` (first token) event of mlperf_log_trace.json."""
    pattern = rf'"name":"{event}","ph": "C".*?"issue_delay":(\d+),"issue_to_done":(\d+)'
    return np.array([int(a) + int(b) for a, b in re.findall(pattern, trace)], dtype=np.int64)


def test_our_rule_on_loadgens_own_samples_gives_loadgens_percentiles(tmp_path: Path) -> None:
    """LoadGen's trace has every sample's latency: our exact path gives the very percentiles LoadGen
    printed, and the histogram's fast path their buckets (tests/test_loadgen_percentiles.py shows
    hdrh's own round(n·p) rank taking other samples)."""
    text = loadgen_summary(tmp_path, "Server", 40, 20, 1, 8)
    summary = parse_summary(text)
    trace = (tmp_path / "loadgen-Server" / "mlperf_log_trace.json").read_text()
    events = (
        ("Latency", "latency", "latency"),
        ("Token_Latency", "first token latency", "First Token latency"),
    )
    for event, label, low in events:
        ns = trace_latencies(trace, event)
        assert len(ns) >= 50
        samples = LatencySamples()
        z = np.zeros(len(ns))
        yes = np.ones(len(ns), bool)
        samples.add_columns(z, yes, yes, ns.astype(float), z, ns.astype(float))
        metric = "e2e" if event == "Latency" else "ttft"
        hist = hdr.new_histogram()
        hdr.record_many(hist, ns // 1000)  # µs, as loadtest records
        ordered = np.sort(ns)
        assert int(summary.stats[f"Min {low} (ns)"]) == ordered[0]
        assert int(summary.stats[f"Max {low} (ns)"]) == ordered[-1]
        for p in (50.0, 90.0, 95.0, 97.0, 99.0, 99.9):
            printed = int(summary.stats[f"{p:.2f} percentile {label} (ns)"])
            assert samples.percentile(metric, p) == printed, (event, p)
            assert hdr.value_at(hist, p) == hist.get_highest_equivalent_value(printed // 1000), (event, p)
