"""The run report, the console summary, mlperf_log_summary.txt and the exports: synthetic run folders and
real runs against the embedded engine, rendered in headless chromium."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.offline
import pytest
from markupsafe import escape

from loadtest.client.record import RequestRecord
from loadtest.contracts.record_line import LINE_ENCODER
from loadtest.contracts.run_document import from_data
from loadtest.fmt import fmt_ms
from loadtest.metrics import hdr
from loadtest.metrics.recorder import Recorder
from loadtest.metrics.summary import build_metrics
from loadtest.report import format_summary, render_run_report
from loadtest.report.charts import CDF_TITLE
from loadtest.results.mlperf_summary import SUMMARY_NAME
from tests.browser import ARTIFACTS, CHROMIUM, open_in_chromium
from tests.conftest import CLI, interrupt_when, read_lines, run_cli, write_profile

EPOCH = 1_795_000_000.0
FINGERPRINT = "ab12cd34" * 8
CLOSED_LOAD = {"mode": "closed", "concurrency": 8, "rate": None, "arrival": None, "cv": None, "stages": None,
               "trace": None, "description": "8 concurrent streams (closed loop)"}  # fmt: skip


def _records(n_ok: int, n_err: int, seed: int = 0) -> list[RequestRecord]:
    rng = random.Random(seed)
    recs: list[RequestRecord] = []
    for i in range(n_ok + n_err):
        sched = 1_000_000_000 + i * 250_000_000  # every 250 ms
        sent = sched + rng.randint(50_000, 2_000_000)
        ok = i < n_ok
        rec = RequestRecord(
            request_id=f"r{i}",
            scheduled_epoch=EPOCH + (sched - 1_000_000_000) / 1e9,
            scheduled_ns=sched,
            sent_ns=sent,
            prompt_tokens_client=200 + i,
        )
        if ok:
            first = sent + rng.randint(30_000_000, 400_000_000)
            n_tok = rng.randint(20, 80)
            chunks = [first]
            for _ in range(n_tok - 1):
                chunks.append(chunks[-1] + rng.randint(8_000_000, 40_000_000))
            rec.first_token_ns = rec.first_answer_ns = first
            rec.chunk_ns = chunks
            rec.done_ns = chunks[-1] + 1_000_000
            rec.outcome = "ok"
            rec.finish_reason = "stop"
            rec.http_status = 200
            rec.completion_tokens_client = n_tok
            rec.completion_tokens_server = n_tok + (1 if i % 7 == 0 else 0)
            rec.prompt_tokens_server = rec.prompt_tokens_client
        else:
            rec.done_ns = sent + 5_000_000
            rec.outcome = "http_5xx"
            rec.http_status = 503
            rec.error = "503 Service Unavailable <b>overloaded</b>"
        recs.append(rec)
    return recs


def _write_run(run_dir: Path, recs: list[RequestRecord], **overrides: Any) -> dict[str, Any]:
    recorder = Recorder()
    for rec in recs:
        recorder.add(rec)
    recorder.flush()
    agg = recorder.total
    run: dict[str, Any] = {
        "schema_version": 1,
        "tool": {"name": "loadtest", "version": "0.1.0"},
        "run_id": "20261130-121500-interactive-chat",
        "created": "2026-11-30T12:15:00Z",
        "status": "completed",
        "interrupted_reason": None,
        "config": {
            "profile": "interactive-chat",
            "profile_path": "traffic_profiles/interactive-chat.yaml",
            "profile_resolved": {"name": "interactive-chat", "note": "<script>alert(1)</script>"},
            "load": CLOSED_LOAD,
            "scenarios": [{"name": "default", "kind": "chat", "weight": 1.0}],
            "tokenizer": "cl100k_base",
            "run_salt": {"mode": "off", "nonce": None},
            "duration_s": 30.0,
            "seed": 0,
            "processes": 1,
            "model": "llama-3.1-8b",
            "api": "chat",
            "api_key_env": None,
            "api_key_file": None,
            "timeouts": {"connect_s": 10.0, "read_s": 60.0, "total_s": None},
            "retries": None,
            "tls_verify": True,
        },
        "endpoint": {
            "url": "http://127.0.0.1:41234",
            "embedded": True,
            "models": ["llama-3.1-8b"],
            "engine": None,
        },
        "workload": {"fingerprint": FINGERPRINT},
        "metrics": build_metrics(agg),
        "scenarios": {},
        "histograms": {n: hdr.encode(h) for n, h in agg.hists.items() if h.get_total_count()},
        "files": {"records": ["records.jsonl"], "report": "report.html"},
        "notes": [],
    }
    run.update(overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps(run, indent=2))
    (run_dir / "records.jsonl").write_bytes(b"".join(LINE_ENCODER.encode(r.to_log()) + b"\n" for r in recs))
    return run


@pytest.fixture(scope="module")
def normal_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    run_dir = tmp_path_factory.mktemp("normal")
    run = _write_run(run_dir, _records(60, 4))
    path = render_run_report(run_dir)
    return run, path.read_text(encoding="utf-8"), path


def _assert_offline(html: str) -> None:
    low = html.lower()
    for bad in ('src="http', "src='http", 'href="http', "href='http", 'src="//', "src='//", 'href="//'):
        assert bad not in low, bad


def test_report_written_and_self_contained(normal_run: tuple[dict[str, Any], str, Path]) -> None:
    _, html, path = normal_run
    assert path.name == "report.html" and path.is_file()
    _assert_offline(html)
    assert html.count(plotly.offline.get_plotlyjs()[:200]) == 1
    assert html.count("plotly.js v") == 1
    assert "@media print" in html


def test_report_contents(normal_run: tuple[dict[str, Any], str, Path]) -> None:
    run, html, _ = normal_run
    lat = run["metrics"]["latency_ms"]
    assert CDF_TITLE in html and "Throughput over time" in html
    assert "interactive-chat" in html and run["run_id"] in html
    for key in ("ttft", "itl", "tpot", "e2e", "schedule_lag"):
        assert fmt_ms(lat[key]["p99"]) in html
    assert fmt_ms(lat["ttft"]["p99_9"]) in html
    assert "INTERRUPTED" not in html
    assert "closed loop, concurrency 8" in html
    assert f'title="{FINGERPRINT}"' in html
    assert "embedded simulator" in html
    # Error samples and configuration are escaped, never injected.
    assert "&lt;b&gt;overloaded&lt;/b&gt;" in html and "<b>overloaded</b>" not in html
    assert "<script>alert(1)</script>" not in html
    assert "http_5xx" in html
    assert 'class="main-svg"' not in html  # charts are drawn by the browser, not pre-rendered
    # CDF, six time series, lengths and token agreement; no telemetry block, so no telemetry chart.
    assert html.count("Plotly.newPlot(") == 9
    assert 'id="telemetry-section"' not in html


def test_interrupted_open_loop(tmp_path: Path) -> None:
    load = {**CLOSED_LOAD, "mode": "open", "concurrency": None, "rate": 2.0, "arrival": "poisson"}
    run = _write_run(tmp_path, _records(10, 0), status="interrupted", interrupted_reason="SIGINT")
    run["config"]["load"] = load
    (tmp_path / "run.json").write_text(json.dumps(run))
    html = render_run_report(tmp_path).read_text()
    assert "INTERRUPTED (SIGINT): results cover the requests finished before the stop" in html
    assert "open loop, 2 req/s, Poisson arrivals" in html
    text = format_summary(from_data(run))
    assert "INTERRUPTED (SIGINT)" in text


def test_zero_ok_requests(tmp_path: Path) -> None:
    run = _write_run(tmp_path, _records(0, 5))
    assert "histograms" in run and not run["histograms"].get("ttft")
    html = render_run_report(tmp_path).read_text()
    _assert_offline(html)
    assert "No data" in html
    assert "The server sent no usage" in html
    text = format_summary(from_data(run))
    assert "ok 0" in text and "http_5xx 5" in text and "the server sent no usage" in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_empty_run(tmp_path: Path) -> None:
    run = _write_run(tmp_path, [])
    html = render_run_report(tmp_path).read_text()
    assert html.count("No data") >= 2 and "plotly.js v" not in html
    assert format_summary(from_data(run))


def test_format_summary(normal_run: tuple[dict[str, Any], str, Path]) -> None:
    run, _, _ = normal_run
    text = format_summary(from_data(run))
    m = run["metrics"]
    lat = m["latency_ms"]
    assert "completed" in text.splitlines()[1]
    assert "\x1b" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "ok 60" in text and "failed 4" in text and "http_5xx 4" in text
    assert f"{fmt_ms(m['throughput']['output_tokens_per_s'])} output tok/s" in text
    for key in ("ttft", "itl", "tpot", "e2e", "schedule_lag"):
        for p in ("p50", "p90", "p99", "p99_9", "max"):
            assert fmt_ms(lat[key][p]) in text
    tok = m["tokens"]
    assert f"{tok['output_total']:,}" in text and f"{tok['usage_output_total']:,}" in text
    assert f"{tok['mismatched_requests']} with a different output count" in text
    # No judged window: the whole run is judged, said once, and no second "whole run" line repeats it.
    assert "judged" not in run
    assert text.count(f"judged: the whole run, {m['requests']['completed']:,} requests") == 1
    assert "Whole run" not in text and "judged window" not in text


# ---- real runs against the embedded engine ----

FAULTS = "http_503=6%,error_frame=4%"
SCENARIOS = [
    {
        "name": "short",
        "weight": 2,
        "input_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.5, "min": 10, "max": 400},
        "output_tokens": {"dist": "uniform", "min": 8, "max": 40},
    },
    {
        "name": "long",
        "weight": 1,
        "input_tokens": {"dist": "fixed", "value": 600},
        "output_tokens": {"dist": "normal", "mean": 60, "std": 10, "min": 20, "max": 100},
    },
]


def _mix_profile(path: Path, **overrides: Any) -> Path:
    prof = {
        "name": "report-mix",
        "api": "chat",
        "scenarios": SCENARIOS,
        "slos": {"ttft_p99": "2s", "tpot_p99": "100ms"},
        "load": {"concurrency": 6},
        "duration_s": 3,
        "seed": 1,
        **overrides,
    }
    path.write_text(json.dumps(prof))
    return path


@pytest.fixture(scope="module")
def mix_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short two-scenario run with SLOs and injected faults; its folder."""
    tmp = tmp_path_factory.mktemp("mix")
    prof = _mix_profile(tmp / "mix.yaml")
    out = tmp / "run"
    res = run_cli(
        ["run", "--profile", str(prof), "--duration", "3", "--out", str(out)]
        + ["--engine-speedup", "4", "--engine-faults", FAULTS],
        timeout=180,
    )
    assert res.returncode in (0, 10, 11, 12), res.stderr
    assert "Traceback" not in res.stderr
    (tmp / "stdout.txt").write_text(res.stdout)
    return out


def test_console_ends_with_the_reasons_then_the_verdict_headline(mix_run: Path) -> None:
    """The run's last lines: each reason of run.json as a ``  - `` item (wrapped under 101 columns),
    then the verdict line with its headline, last."""
    run = json.loads((mix_run / "run.json").read_text())
    lines = (mix_run.parent / "stdout.txt").read_text().rstrip("\n").splitlines()
    verdict, reasons = run["verdict"], run["verdict"]["reasons"]
    assert verdict["status"] != "pass" and reasons  # the injected faults fail the run
    label = {"slo_missed": "SLO MISSED", "invalid": "RUN INVALID", "error_rate": "ENDPOINT FAILING"}
    assert lines[-1].startswith(f"verdict: {label[verdict['status']]} ({len(verdict['checks'])} checks, ")
    assert len(lines[-1]) < 140 and "; fix:" not in lines[-1]  # a headline, not the reasons
    start = len(lines) - 1
    while lines[start - 1].startswith(("  - ", "    ")):
        start -= 1
    assert lines[start - 1].startswith("report:")  # the reasons follow the file lines
    items = " ".join(lines[start:-1])
    assert items.startswith("  - ") and all(len(ln) <= 100 for ln in lines[start:-1])
    assert [r.split()[:4] for r in items.split("  - ")[1:]] == [r.split()[:4] for r in reasons]


def _section(html: str, sid: str) -> str:
    """The HTML of the element with this id, up to the next section."""
    start = html.index(f'id="{sid}"')
    end = html.find("<section", start)
    return html[start : end if end > 0 else len(html)]


def test_every_section_on_a_real_mixed_run(mix_run: Path) -> None:
    run = json.loads((mix_run / "run.json").read_text())
    html = (mix_run / "report.html").read_text()
    _assert_offline(html)
    # Verdict with its reasons at the top, before the headline numbers.
    assert html.index('id="verdict"') < html.index('id="headline"')
    label = {
        "pass": "PASS",
        "slo_missed": "SLO MISSED",
        "invalid": "RUN INVALID",
        "error_rate": "ENDPOINT FAILING",
    }
    assert f"Verdict: {label[run['verdict']['status']]}" in html
    for reason in run["verdict"]["reasons"]:
        assert str(escape(reason)) in _section(html, "verdict")
    # Headline: throughput, goodput, attainment, and the four latencies at p50..p99.9 with ES estimates.
    head = _section(html, "headline")
    for card in ("Output tokens/s", "Requests/s", "Goodput", "SLO attainment", "Error rate"):
        assert card in head
    assert f"{run['goodput']['attainment'] * 100:.2f}%" in head
    for col in ("p50", "p90", "p99", "p99.9"):
        assert f">{col}<" in head
    for metric in ("TTFT", "TPOT", "ITL", "E2E"):
        assert f"<strong>{metric}</strong>" in head
    assert "(ES)" in head  # p50/p90 have enough samples for an early-stopping estimate
    assert fmt_ms(run["metrics"]["latency_ms"]["ttft"]["p99_9"]) in html
    # Every chart: a heading, a drawn figure and a caption.
    for cid in ("latency-cdf", "throughput", "in-flight", "ttft-series", "itl-series", "errors-series"):
        fig = _section(html, cid)
        assert "<h3>" in fig and "Plotly.newPlot(" in fig and "<figcaption" in fig, cid
    for cid in ("lag-series", "lengths", "token-diff"):
        assert "Plotly.newPlot(" in _section(html, cid), cid
    # Per-scenario breakdown: both scenarios with their own request counts.
    table = _section(html, "scenario-table")
    for name in ("short", "long"):
        n = run["scenarios"][name]["requests"]["completed"]
        assert f"<code>{name}</code>" in table and f">{n:,}<" in table
    # Error classes from the record log, with the injected faults' messages.
    records = read_lines([mix_run / "records.jsonl"])
    errors = _section(html, "error-classes")
    assert "Injected fault http_503" in errors and "Injected fault error_frame" in errors
    failed = sum(1 for r in records if r["outcome"] != "ok")
    assert f"{failed:,} in all" in html
    # Lengths against the profile, server-vs-client tokens, and the run's identity.
    lengths = _section(html, "lengths-table")
    assert "<code>short</code>" in lengths and "600 / 600.0 / 600" in lengths  # the fixed 600-token input
    assert "profile's distribution (n=" in html and "requested (max_tokens)" in html
    details = _section(html, "run-details")
    assert run["workload"]["fingerprint"] in details and f"loadtest {run['tool']['version']}" in details
    assert run["endpoint"]["url"] in details and f"<td>{run['config']['seed']}</td>" in details
    assert f"{len(records):,} records read from records.jsonl" in details
    assert str(escape('"name": "long"')) in details  # the resolved profile


def test_summary_text_fields(mix_run: Path) -> None:
    run = json.loads((mix_run / "run.json").read_text())
    text = (mix_run / SUMMARY_NAME).read_text()
    fields = dict(
        (k.strip(), v.strip())
        for k, _, v in (ln.partition(":") for ln in text.splitlines() if " : " in ln or ": " in ln)
    )
    assert text.startswith("=" * 48 + "\nMLPerf Results Summary\n")
    # LoadGen has no closed-loop scenario: a concurrency point is written in its Server form
    assert fields["Scenario"] == "Server" and fields["load_shape"] == "Concurrency (6 streams)"
    assert fields["Mode"] == "PerformanceOnly"
    assert fields["SUT name"].startswith(f"{run['config']['model']} @ {run['endpoint']['url']}")
    assert fields["Result is"] == ("VALID" if run["verdict"]["status"] == "pass" else "INVALID")
    assert float(fields["Completed tokens per second"]) == pytest.approx(
        run["metrics"]["throughput"]["output_tokens_per_s"], abs=0.01
    )
    # LoadGen: (n − 1) completed samples over the time to the last completion
    req, window = run["metrics"]["requests"], run["metrics"]["window"]
    assert float(fields["Completed samples per second"]) == pytest.approx(
        (req["completed"] - 1) / window["duration_s"], abs=0.01
    )
    es_ok = all(c["passed"] for c in run["verdict"]["checks"] if c["name"].startswith("early_stopping."))
    assert fields["Early stopping satisfied"] == ("Yes" if es_ok else "NO")
    for label in ("latency", "first token latency", "time to output token"):
        for p in ("50.00", "90.00", "95.00", "97.00", "99.00", "99.90"):
            assert int(fields[f"{p} percentile {label} (ns)"]) > 0
    # The p50 TTFT in ns is run.json's p50 (ms) at µs resolution.
    assert int(fields["50.00 percentile first token latency (ns)"]) == round(
        run["metrics"]["latency_ms"]["ttft"]["p50"] * 1e6
    )
    assert fields["ttft_latency (ns)"] == "2000000000" and fields["tpot_latency (ns)"] == "100000000"
    assert fields["target_concurrency"] == "6" and fields["schedule_rng_seed"] == str(run["config"]["seed"])
    assert fields["workload_fingerprint"] == run["workload"]["fingerprint"]
    assert "TTFT Early Stopping Result:" in text and "p90 early-stopping estimate (ns)" in text
    failed = run["metrics"]["requests"]["failed"]
    assert f"{failed} errors encountered during test" in text


def test_exports_read_back(mix_run: Path, tmp_path: Path) -> None:
    run = json.loads((mix_run / "run.json").read_text())
    res = run_cli(["export", str(mix_run), "--out", str(tmp_path)])
    assert res.returncode == 0, res.stderr
    req = run["metrics"]["requests"]
    frames = {
        "csv": pd.read_csv(tmp_path / "requests.csv"),
        "parquet": pd.read_parquet(tmp_path / "requests.parquet"),
    }
    for fmt, df in frames.items():
        assert len(df) == req["completed"], fmt
        assert df["outcome"].value_counts().to_dict() == {o: n for o, n in req["by_outcome"].items() if n}, (
            fmt
        )
        assert set(df["scenario"]) == {"short", "long"}
        ok = df[df["outcome"] == "ok"]
        assert int(ok["output_tokens"].sum()) == run["metrics"]["tokens"]["output_total"]
        assert ok["ttft_ms"].notna().all() and ok["itl_mean_ms"].notna().all()
        assert (ok["itl_max_ms"] >= ok["itl_mean_ms"] - 1e-6).all()
        assert df.loc[df["outcome"] != "ok", "error"].str.contains("Injected fault").all()
    for name in ("series.csv", "series.parquet"):
        s = pd.read_csv(tmp_path / name) if name.endswith("csv") else pd.read_parquet(tmp_path / name)
        assert int(s["completed"].sum()) == req["completed"]
        assert int(s["errors"].sum()) == req["failed"]
        assert (s["bucket_s"] <= 1.0).all() and s["time_s"].is_monotonic_increasing
    bad = run_cli(["export", str(tmp_path / "nowhere")])
    assert bad.returncode == 2 and "not a folder" in bad.stderr and "Traceback" not in bad.stderr


def test_rebuild_from_a_log_cut_mid_line(mix_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "cut"
    shutil.copytree(mix_run, copy)
    (copy / "report.html").unlink()
    (copy / SUMMARY_NAME).unlink()
    log = copy / "records.jsonl"
    data = log.read_bytes()
    lines = data.count(b"\n")
    log.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 40])  # last line cut after 39 bytes
    res = run_cli(["report", str(copy)])
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(copy / "report.html"), str(copy / SUMMARY_NAME)]
    html = (copy / "report.html").read_text()
    assert f"{lines - 1:,} records read from records.jsonl; 1 unreadable or cut line(s) skipped" in html
    assert "Plotly.newPlot(" in _section(html, "ttft-series")
    assert (copy / SUMMARY_NAME).read_text().count("MLPerf Results Summary") == 1
    missing = run_cli(["report", str(tmp_path)])
    assert missing.returncode == 2 and "run.json not found" in missing.stderr


def test_interrupted_run_says_so_in_its_verdict(tmp_path: Path) -> None:
    prof = _mix_profile(tmp_path / "p.yaml", duration_s=60)
    out = tmp_path / "out"
    log = out / "records.jsonl"
    code, _, stderr = interrupt_when(
        CLI + ["run", "--profile", str(prof), "--out", str(out), "--engine-speedup", "2"],
        lambda: log.exists() and log.read_bytes().count(b"\n") >= 20,
    )
    assert code == 130, stderr
    html = (out / "report.html").read_text()
    verdict = _section(html, "verdict")
    assert "INTERRUPTED · " in verdict
    assert "INTERRUPTED (SIGINT): results cover the requests finished before the stop" in verdict
    text = (out / SUMMARY_NAME).read_text()
    assert "Result is : INVALID" in text and "Run completed (not interrupted) : NO (SIGINT)" in text
    assert "the run was interrupted (SIGINT)" in text


TELEMETRY = {
    "url": "http://127.0.0.1:9/metrics",
    "engine": "loadtest-sim",
    "interval_s": 1.0,
    "t": [0.0, 1.0, 2.0, 3.0],
    "series": {
        "requests_running": [1, 6, 6, None],
        "requests_waiting": [0, 2, 1, 0],
        "kv_cache_usage": [0.01, 0.2, None, 0.05],
        "preemptions": [0, 1, 0, 0],
        "generation_tokens_per_s": [100.0, 2500.0, 2600.0, 400.0],
    },
}


@pytest.fixture(scope="module")
def telemetry_run(mix_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mixed run with a hand-made server telemetry block, report rebuilt."""
    copy = tmp_path_factory.mktemp("telemetry") / "run"
    shutil.copytree(mix_run, copy)
    run = json.loads((copy / "run.json").read_text())
    run["telemetry"] = TELEMETRY
    (copy / "run.json").write_text(json.dumps(run))
    render_run_report(copy)
    return copy


def test_telemetry_drawn_when_present(telemetry_run: Path, mix_run: Path) -> None:
    html = (telemetry_run / "report.html").read_text()
    tel = _section(html, "telemetry-section")
    assert "loadtest-sim metrics from http://127.0.0.1:9/metrics, every 1.0 s" in tel
    assert "Plotly.newPlot(" in tel and "<figcaption" in tel
    for name in ("running", "waiting", "KV cache used", "generation", "preemptions per interval"):
        assert f'"name":"{name}"' in tel, name
    assert '"name":"prefix cache hit rate"' not in tel and '"name":"prompt"' not in tel  # absent series
    assert '"y":[1.0,20.0,null,5.0]' in tel  # KV cache use in percent; the missing poll stays a gap
    # Whatever the real run's own telemetry holds, the report shows it exactly when run.json has it.
    real = json.loads((mix_run / "run.json").read_text())
    assert ('id="telemetry-section"' in (mix_run / "report.html").read_text()) == ("telemetry" in real)


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless chromium")
def test_report_renders_in_headless_chromium(telemetry_run: Path, tmp_path: Path) -> None:
    page = telemetry_run / "report.html"
    html = page.read_text()
    charts = html.count("Plotly.newPlot(")
    assert charts == 10
    shot = ARTIFACTS / "run-report.png"
    first = ARTIFACTS / "run-report-first-screen.png"
    seen = open_in_chromium(
        page, shot, tmp_path / "chromium", expect_plots=charts, evaluate=LAYOUT_PROBE, first_screen=first
    )
    assert [u for u in seen["requests"] if not u.startswith("data:")] == [seen["url"]]  # only the file
    assert seen["errors"] == [], seen["errors"]
    assert seen["plots"] == charts
    assert all(n >= 1 for n in seen["traces"])
    assert shot.stat().st_size > 50_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert first.stat().st_size > 10_000
    laid = seen["value"]
    # What was tested and the verdict with its reasons: on the first screen (1280 × 900), in that order.
    run = json.loads((telemetry_run / "run.json").read_text())
    tested, verdict = laid["tested"], laid["verdict"]
    assert 0 <= tested["top"] < tested["bottom"] <= verdict["top"] < verdict["bottom"] <= 900, laid
    for label in ("Endpoint", "Model", "Load", "Ran", "Date"):
        assert label in tested["text"]
    assert run["endpoint"]["url"] in tested["text"] and run["config"]["model"] in tested["text"]
    assert run["created"][:10] in tested["text"]
    assert all(r.split(";")[0] in verdict["text"] for r in run["verdict"]["reasons"])
    # No legend under plotly's modebar; a right-hand axis has round ticks.
    assert not [c for c in laid["charts"] if c["overlap"]], laid["charts"]
    assert sum(1 for c in laid["charts"] if c["legend"]) >= 5
    right = [c["y2"] for c in laid["charts"] if c["id"] == "throughput"][0]
    assert len(right) >= 3 and all(_round_tick(t) for t in right), right
    # The CDF's log axis starts where its data starts, not decades below.
    lo = 10 ** laid["cdf_range"][0]
    assert lo >= 0.5 * laid["cdf_start"] and lo <= laid["cdf_start"], laid


# Bounding boxes of the first screen's header parts, and per chart: the modebar against the legend, the
# right axis's tick labels; the CDF's x range (log10 ms) and its smallest drawn latency (ms) at ≥ 0.1 %.
LAYOUT_PROBE = """(() => {
  const box = e => { const b = e.getBoundingClientRect();
    return {top: b.top, bottom: b.bottom, left: b.left, right: b.right, text: e.innerText}; };
  const hit = (a, b) => a && b && a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const charts = [...document.querySelectorAll('.js-plotly-plot')].map(g => {
    const m = g.querySelector('.modebar'), l = g.querySelector('g.legend');
    return {id: g.closest('figure') ? g.closest('figure').id : '', legend: !!l,
            overlap: !!(m && l && hit(box(m), box(l))),
            y2: [...g.querySelectorAll('.y2tick text')].map(t => t.textContent)};
  });
  const cdf = document.querySelector('#latency-cdf .js-plotly-plot');
  const starts = cdf.data.map(t => t.x.find((x, i) => t.y[i] >= 0.001 && x > 0));
  return {tested: box(document.getElementById('tested')), verdict: box(document.getElementById('verdict')),
          charts, cdf_range: cdf._fullLayout.xaxis.range, cdf_start: Math.min(...starts)};
})()"""


def _round_tick(text: str) -> bool:
    """A tick label with at most one significant digit after its leading digit (0, 2, 2.5, 40, 1.5k)."""
    digits = text.replace(",", "").replace(".", "").rstrip("kM").lstrip("0")
    return len(digits.rstrip("0")) <= 2


def test_server_vs_client_table_and_warm_banner(tmp_path: Path) -> None:
    """A hand-made server_latency block (one p99 past vLLM's last finite bound) and a warm prefix cache."""
    ttft = {"name": "vllm:time_to_first_token_seconds", "count": 60, "mean_ms": 210.0, "p50_ms": 180.0,
            "p50_bucket_ms": [100.0, 250.0], "p90_ms": 400.0, "p90_bucket_ms": [250.0, 500.0],
            "p99_ms": 2560000.0, "p99_bucket_ms": [2560000.0, None], "bounds_ms": [100.0, 250.0, 500.0]}  # fmt: skip
    queue = {"name": "vllm:request_queue_time_seconds", "count": 60, "mean_ms": 1.0, "p50_ms": 150.0,
             "p50_bucket_ms": [0.0, 300.0], "p90_ms": 270.0, "p90_bucket_ms": [0.0, 300.0], "p99_ms": 297.0,
             "p99_bucket_ms": [0.0, 300.0]}  # fmt: skip
    tel = {**TELEMETRY, "server_latency": {"method": "bucket-interpolated", "from_s": -0.5, "to_s": 16.2,
                                           "metrics": {"ttft": ttft, "queue": queue}}}  # fmt: skip
    warning = (
        "warm prefix cache: the prefix cache answered 83 % of prompt tokens: the server saw a warm workload"
    )
    pc = {"hit_rate": 0.83, "hit": 830.0, "queried": 1000.0, "source": "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total",
          "threshold": 0.5, "expected_reuse": None, "warm": True, "warning": warning}  # fmt: skip
    run = _write_run(tmp_path, _records(60, 4), telemetry=tel, prefix_cache=pc)
    html = render_run_report(tmp_path).read_text()
    table = _section(html, "server-vs-client")
    client_p50 = fmt_ms(run["metrics"]["latency_ms"]["ttft"]["p50"])
    row = table[
        table.index("<strong>TTFT</strong>") : table.index("</tr>", table.index("<strong>TTFT</strong>"))
    ]
    assert "60 / 60" in row and f">{client_p50}<" in row and 'title="bucket 100–250 ms">180<' in row
    assert "&gt; 2,560,000" in row  # past the last finite bound: no value, and no difference
    # The client's p50 lies within the server bucket's width (150 ms) of the server's 180: no sign.
    assert abs(run["metrics"]["latency_ms"]["ttft"]["p50"] - 180.0) <= 150.0
    assert ">within bucket (±150)<" in row
    assert f">{fmt_ms(run['metrics']['latency_ms']['ttft']['p50'] - 180.0)}<" not in row
    assert "100–250</span>" in row  # the bucket the server's figure lies in, shown under it
    assert "<strong>ITL</strong>" not in table  # the server exposed no ITL histogram
    assert "Queue time" in table and "vllm:request_queue_time_seconds" in table
    assert warning in _section(html, "warm-cache")
    assert "Prefix-cache hit rate 83.00% of prompt tokens" in _section(html, "tokens")
    text = format_summary(from_data(run))
    assert "Server vs client" in text and "WARNING     warm prefix cache" in text
    ttft_p50 = next(line for line in text.splitlines() if line.startswith("TTFT p50"))
    assert "within bucket (±150)" in ttft_p50 and "100–250" in ttft_p50
    assert max(len(line) for line in text.splitlines()) <= 80


# ---- what is shown is what is judged ----


def _fits_a_terminal(text: str) -> list[str]:
    """The lines over 80 columns, except those that end in a path or URL (which cannot be broken)."""
    return [ln for ln in text.splitlines() if len(ln) > 80 and not ln.rstrip("/").split()[-1].startswith("/")]


@pytest.fixture(scope="module")
def slow_start_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A run whose warm-up is its busiest part: 24 streams of long prompts for 2 s, then 2 streams for 3 s,
    judged after the 2 s warm-up; its folder and stdout."""
    tmp = tmp_path_factory.mktemp("slow-start")
    prof = write_profile(
        tmp / "slow.yaml",
        input_tokens={"dist": "fixed", "value": 2000},
        output_tokens={"dist": "fixed", "value": 16},
        load={"stages": [{"concurrency": 24, "duration_s": 2}, {"concurrency": 2, "duration_s": 3}]},
        judging={"warmup_s": 2},
    )
    out = tmp / "run"
    res = run_cli(["run", "--profile", str(prof), "--engine-speedup", "4", "--out", str(out)], timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    return out, res.stdout


def test_the_console_and_the_first_screen_show_the_judged_figures(slow_start_run: tuple[Path, str]) -> None:
    out, stdout = slow_start_run
    run = json.loads((out / "run.json").read_text())
    judged, whole = run["judged"]["metrics"], run["metrics"]
    j_p99, w_p99 = judged["latency_ms"]["ttft"]["p99"], whole["latency_ms"]["ttft"]["p99"]
    assert fmt_ms(j_p99) != fmt_ms(w_p99), (j_p99, w_p99)  # the warm-up's queueing is in the whole run only
    w = run["judged"]["window"]
    label = (
        f"judged window: {w['warmup_s']:.1f}–{w['warmup_s'] + w['duration_s']:.1f} s, "
        f"{judged['requests']['completed']:,} requests"
    )
    # The console: the label, then the latency table's TTFT row with the judged p50..max.
    lines = stdout.splitlines()
    assert any(ln.startswith(label) for ln in lines), stdout
    ttft = next(ln.split() for ln in lines if ln.startswith("TTFT "))
    assert ttft[1:6] == [
        fmt_ms(judged["latency_ms"]["ttft"][k]) for k in ("p50", "p90", "p99", "p99_9", "max")
    ]
    whole_line = next(ln for ln in lines if ln.startswith("Whole run"))
    assert f"TTFT p99 {fmt_ms(w_p99)} ms" in whole_line  # the whole run's only where labelled so
    assert fmt_ms(w_p99) not in " ".join(ttft)
    assert not _fits_a_terminal(stdout), _fits_a_terminal(stdout)
    load = next(ln for ln in lines if ln.startswith("Load "))
    assert "stages 24 → 2 streams" in load and "None" not in load  # a staged load in the profile's words
    # The report's first screen: the label next to the verdict, the headline numbers the judged ones.
    html = (out / "report.html").read_text()
    first = html[: html.index('<section id="headline"')]
    assert "J" + label[1:] in first[first.index('id="verdict"') :]
    head = _section(html, "headline")
    assert label in head[: head.index("</h2>")]
    row = head[head.index("<strong>TTFT</strong>") : head.index("</tr>", head.index("<strong>TTFT</strong>"))]
    cells = [c.split("<", 1)[0] for c in row.split('<td class="num">')[1:]]
    assert cells[0] == f"{judged['latency_ms']['ttft']['count']:,}"
    assert cells[1:] == [fmt_ms(judged["latency_ms"]["ttft"][k]) for k in ("p50", "p90", "p99", "p99_9")]
    cards = head[: head.index('id="headline-latency"')]
    assert f"{judged['throughput']['output_tokens_per_s']:,.1f}" in cards
    # The whole run's table is labelled so.
    assert "Latency percentiles (ms), whole run" in _section(html, "latency")


def test_profiles_list_fits_a_terminal() -> None:
    """`loadtest profiles list`: every shipped profile with its load, within 80 columns."""
    res = run_cli(["profiles", "list"])
    assert res.returncode == 0, res.stderr
    assert not _fits_a_terminal(res.stdout), _fits_a_terminal(res.stdout)
    names = [p.stem for p in (Path(__file__).resolve().parents[1] / "traffic_profiles").glob("*.yaml")]
    heads = {ln.split()[0]: ln for ln in res.stdout.splitlines() if ln and not ln.startswith(" ")}
    assert names and all(n in heads for n in names), (names, heads)
    assert "8 concurrent streams (closed loop)" in heads["interactive-chat"]


def test_without_a_window_the_report_says_once_that_the_whole_run_is_judged(
    normal_run: tuple[dict[str, Any], str, Path],
) -> None:
    run, html, _ = normal_run
    n = f"{run['metrics']['requests']['completed']:,} requests"
    assert html.count(f"Judged: the whole run, {n}") == 1
    assert f"judged: the whole run, {n}" in _section(html, "headline")  # the headline's label
    assert "Latency percentiles (ms)</h2>" in html and "whole run</h2>" not in html
    head = _section(html, "headline")
    row = head[head.index("<strong>TTFT</strong>") : head.index("</tr>", head.index("<strong>TTFT</strong>"))]
    cells = [c.split("<", 1)[0] for c in row.split('<td class="num">')[1:]]
    assert cells[1:] == [
        fmt_ms(run["metrics"]["latency_ms"]["ttft"][k]) for k in ("p50", "p90", "p99", "p99_9")
    ]
