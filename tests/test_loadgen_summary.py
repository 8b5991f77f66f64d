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
from loadtest.metrics import early_stopping as es
from loadtest.metrics import hdr
from loadtest.metrics.samples import LatencySamples
from loadtest.results.mlperf_detail import DETAIL_NAME
from loadtest.results.mlperf_summary import OWN_SECTION, SUMMARY_NAME
from tests.conftest import run_cli
from tests.loadgen_summary import RULE, LoadGenSummary, compare_details, parse_summary, read_detail

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
    tmp_path: Path,
    scenario: str,
    qps: float,
    ttft_ms: float,
    tpot_ms: float,
    tokens: int,
    min_ms: int = 2000,
    ttft_limit_ms: float = 2000,
) -> str:
    """A real LoadGen run of ~``min_ms`` with an in-process SUT of that latency shape (SingleStream: an
    expected latency of 1/qps); its summary text (its other logs beside it in ``tmp_path/loadgen-<scenario>``)."""
    folder = tmp_path / f"loadgen-{scenario}"
    folder.mkdir()
    args = [scenario, str(qps), f"{ttft_ms:.3f}", f"{tpot_ms:.3f}", str(tokens), str(min_ms), "16"]
    args += [f"{ttft_limit_ms:g}", "100"]
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
        assert es_form(block) or ss_form(block), block


def check_detail(ours_dir: Path, real_dir: Path, summary: LoadGenSummary) -> dict[str, object]:
    """Our mlperf_log_detail.txt read as LoadGen's parsers read it, against LoadGen's own for the
    scenario; its values by key."""
    ours = read_detail((ours_dir / DETAIL_NAME).read_text())
    compare_details(ours, read_detail((real_dir / "mlperf_log_detail.txt").read_text()))
    values = {m["key"]: m["value"] for m in ours}
    assert values["result_validity"] == summary.results["Result is"]
    assert values["effective_scenario"] == summary.results["Scenario"]
    assert values["result_min_duration_met"] == (summary.results["Min duration satisfied"] == "Yes")
    return values


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
    detail = check_detail(out, tmp_path / "loadgen-Server", ours)
    assert detail["result_completed_samples_per_sec"] == pytest.approx(
        float(ours.results["Completed samples per second"]), abs=0.01
    )
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
    detail = check_detail(out, tmp_path / "loadgen-Offline", ours)
    assert detail["result_samples_per_second"] == pytest.approx(
        float(ours.results["Samples per second"]), rel=1e-5
    )


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


def ss_trace_latencies(trace: str, event: str) -> np.ndarray:
    """Per sample of a SingleStream run, LoadGen's latency (ns): ``complete_ns − issue_start_ns`` of each
    ``Sample`` (completion) or ``Token`` (first token) span that mlperf_log_trace.json opens."""
    pattern = rf'"name":"{event}","cat":"default","ph":"b".*?"issue_start_ns":(\d+),"complete_ns":(\d+)'
    return np.sort(np.array([int(b) - int(a) for a, b in re.findall(pattern, trace)], dtype=np.int64))


def test_early_stopping_estimates_and_floors_are_loadgens(tmp_path: Path) -> None:
    """LoadGen's SingleStream early stopping on its own samples: the 64 / 662 query floors (p90 / p99),
    the number of samples discarded and the estimate itself are ours."""
    text = loadgen_summary(tmp_path, "SingleStream", 200, 1, 0.2, 4, min_ms=1000)
    trace = (tmp_path / "loadgen-SingleStream" / "mlperf_log_trace.json").read_text()
    ns = ss_trace_latencies(trace, "Token")
    n = len(ns)
    assert es.min_queries_for_percentile(0.9) <= n < es.min_queries_for_percentile(0.99)
    ttft_block = parse_summary(text).early_stopping["TTFT"]
    t = es.estimate_t(n, 0.9)
    assert t is not None
    assert ttft_block[:3] == [
        f" * Processed at least {es.min_queries_for_percentile(0.9)} queries ({n}).",
        f" * Would discard {t - 1} highest latency queries.",
        f" * Early stopping 90.0th percentile estimate: {es.percentile_estimate(ns.tolist(), 0.9)}",
    ]
    assert ttft_block[3:] == [
        " * Not enough queries processed for 99.0th percentile",
        " early stopping estimate (would need to process at",
        f" least {es.min_queries_for_percentile(0.99)} total queries).",
    ]
    assert (es.min_queries_for_percentile(0.9), es.min_queries_for_percentile(0.99)) == (64, 662)


def test_server_early_stopping_need_is_loadgens(tmp_path: Path) -> None:
    """A Server run: TPOT none over its limit (passing from 459 queries on), first tokens over a tight
    limit: LoadGen's "would need N more queries" is find_min_passing(t, p) + t − n for its own (n, t)."""
    text = loadgen_summary(tmp_path, "Server", 400, 4, 0.2, 4, min_ms=1500, ttft_limit_ms=4.3)
    trace = (tmp_path / "loadgen-Server" / "mlperf_log_trace.json").read_text()
    ns = trace_latencies(trace, "Token_Latency")
    n, over = len(ns), int((ns > round(4.3 * 1e6)).sum())
    assert n >= es.server_min_queries(0.99) and over > 0
    blocks = parse_summary(text).early_stopping
    assert blocks["TPOT"] == [" * Run successful."] and es.server_passes(n, 0, 0.99)
    need = es.find_min_passing(over, 0.99) + over
    assert not es.server_passes(n, over, 0.99)
    assert blocks["TTFT"][:3] == [
        " * Run unsuccessful.",
        f" * Processed {n} queries.",
        f" * Would need to run at least {need - n} more queries,",
    ]


SS_FORMS = (
    [
        re.compile(r" \* Processed at least 64 queries \(\d+\)\."),
        re.compile(r" \* Would discard \d+ highest latency queries\."),
        re.compile(r" \* Early stopping 90\.0th percentile estimate: \d+"),
        re.compile(r" \* Early stopping 99\.0th percentile estimate: \d+"),
    ],
    [
        re.compile(r" \* Processed at least 64 queries \(\d+\)\."),
        re.compile(r" \* Would discard \d+ highest latency queries\."),
        re.compile(r" \* Early stopping 90\.0th percentile estimate: \d+"),
        re.compile(r" \* Not enough queries processed for 99\.0th percentile"),
        re.compile(r" early stopping estimate \(would need to process at"),
        re.compile(r" least 662 total queries\)\."),
    ],
)


def ss_form(block: list[str]) -> bool:
    return any(
        len(form) == len(block) and all(f.fullmatch(ln) for f, ln in zip(form, block, strict=True))
        for form in SS_FORMS
    )


def score_as_test04(text: str) -> float:
    """The score compliance TEST04's verify_performance.py takes from a SingleStream summary: 1e9 over
    the last line matching its early-stopping pattern (its regular expression, as it reads the file)."""
    score = None
    for line in text.splitlines():
        if re.match(".*Early stopping (90th|90.0th|99.9th) percentile estimate", line):
            score = 1e9 / float(line.split(": ", 1)[1].strip())
    assert score is not None
    return score


def test_single_stream_summary_reads_like_loadgens(tmp_path: Path) -> None:
    out = tmp_path / "ours"
    args = ["run", "--profile", "mlperf-llama3.1-8b-server", "--duration", "6", "--concurrency", "1"]
    proc = run_cli([*args, "--engine-speedup", "100", "--out", str(out)], timeout=120)
    assert proc.returncode in (0, 10, 11), proc.stderr[-2000:]
    text = (out / SUMMARY_NAME).read_text()
    real_text = loadgen_summary(tmp_path, "SingleStream", 200, 1, 0.2, 4, min_ms=1000)
    ours, real = parse_summary(text), parse_summary(real_text)
    samples = exact_samples(out)
    n = samples.count("ttft")
    assert n >= 64, "the run is too short to give an estimate"
    assert ours.results["Scenario"] == real.results["Scenario"] == "SingleStream"
    assert list(ours.results) == list(real.results)
    assert list(ours.stats) == list(real.stats) and list(ours.params) == list(real.params)
    assert prefixes(text, "Test Parameters Used") == prefixes(real_text, "Test Parameters Used")
    assert list(ours.early_stopping) == list(real.early_stopping) == ["TTFT", "TPOT"]
    check_consistent(ours)
    check_consistent(real)
    for label, metric in (("TTFT", "ttft"), ("TPOT", "tpot")):
        assert ss_form(ours.early_stopping[label]) and ss_form(real.early_stopping[label])
        assert ours.early_stopping[label][2].endswith(f": {round(samples.estimate(metric, 0.9) * 1000)}")
    assert int(ours.results["90.0th percentile latency (ns)"]) == round(
        samples.percentile("e2e", 90.0) * 1000
    )
    assert ours.params["max_async_queries"] == real.params["max_async_queries"] == "1"
    # TEST04 reads both files the same way: the TPOT block's p90 estimate, our own section not mistaken for it
    assert score_as_test04(text) == 1e9 / round(samples.estimate("tpot", 0.9) * 1000)
    assert score_as_test04(real_text) > 0
    detail = check_detail(out, tmp_path / "loadgen-SingleStream", ours)
    assert detail["early_stopping_latency_ss"] == round(samples.estimate("ttft", 0.9) * 1000)
    assert detail["early_stopping_ttft_result"] == " ".join(ours.early_stopping["TTFT"])
