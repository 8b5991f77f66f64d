"""Tests for the HTML run report and the console summary, on synthetic run directories."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import plotly.offline
import pytest

from loadtest.client.record import RequestRecord
from loadtest.metrics import hdr
from loadtest.metrics.recorder import Recorder
from loadtest.metrics.summary import build_metrics
from loadtest.report import format_summary, render_run_report
from loadtest.report.charts import CDF_TITLE, THROUGHPUT_TITLE
from loadtest.report.fmt import fmt_ms

CHROMIUM = Path("/usr/bin/chromium")
EPOCH = 1_795_000_000.0
FINGERPRINT = "ab12cd34" * 8


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
            "load": {"mode": "closed", "concurrency": 8, "rate": None, "arrival": None},
            "duration_s": 30.0,
            "seed": 0,
            "processes": 1,
            "model": "llama-3.1-8b",
            "api": "chat",
        },
        "endpoint": {
            "url": "http://127.0.0.1:41234",
            "embedded": True,
            "models": ["llama-3.1-8b"],
            "engine": None,
        },
        "workload": {"fingerprint": FINGERPRINT},
        "metrics": build_metrics(agg),
        "histograms": {n: hdr.encode(h) for n, h in agg.hists.items() if h.get_total_count()},
        "files": {"records": ["records.jsonl"], "report": "report.html"},
    }
    run.update(overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps(run, indent=2))
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r.to_log()) + "\n" for r in recs))
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
    assert CDF_TITLE in html and THROUGHPUT_TITLE in html
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
    assert html.count("Plotly.newPlot(") == 2


def test_interrupted_open_loop(tmp_path: Path) -> None:
    load = {"mode": "open", "concurrency": None, "rate": 2.0, "arrival": "poisson"}
    run = _write_run(tmp_path, _records(10, 0), status="interrupted", interrupted_reason="SIGINT")
    run["config"]["load"] = load
    (tmp_path / "run.json").write_text(json.dumps(run))
    html = render_run_report(tmp_path).read_text()
    assert "INTERRUPTED (SIGINT): results cover the requests finished before the stop" in html
    assert "open loop, 2 req/s, Poisson arrivals" in html
    text = format_summary(run)
    assert "INTERRUPTED (SIGINT)" in text


def test_zero_ok_requests(tmp_path: Path) -> None:
    run = _write_run(tmp_path, _records(0, 5))
    assert "histograms" in run and not run["histograms"].get("ttft")
    html = render_run_report(tmp_path).read_text()
    _assert_offline(html)
    assert "No data" in html
    assert "The server sent no usage" in html
    text = format_summary(run)
    assert "ok 0" in text and "http_5xx 5" in text and "the server sent no usage" in text
    assert all(len(line) < 100 for line in text.splitlines())


def test_empty_run(tmp_path: Path) -> None:
    run = _write_run(tmp_path, [])
    html = render_run_report(tmp_path).read_text()
    assert html.count("No data") >= 2 and "plotly.js v" not in html
    assert format_summary(run)


def test_format_summary(normal_run: tuple[dict[str, Any], str, Path]) -> None:
    run, _, _ = normal_run
    text = format_summary(run)
    m = run["metrics"]
    lat = m["latency_ms"]
    assert "completed" in text.splitlines()[1]
    assert "\x1b" not in text
    assert all(len(line) < 100 for line in text.splitlines())
    assert "ok 60" in text and "failed 4" in text and "http_5xx 4" in text
    assert f"{m['throughput']['output_tokens_per_s']:,.1f} output tok/s" in text
    for key in ("ttft", "itl", "tpot", "e2e", "schedule_lag"):
        for p in ("p50", "p90", "p99", "p99_9", "max"):
            assert fmt_ms(lat[key][p]) in text
    tok = m["tokens"]
    assert f"{tok['output_total']:,}" in text and f"{tok['usage_output_total']:,}" in text
    assert f"{tok['mismatched_requests']} with a different output count" in text


@pytest.mark.skipif(not CHROMIUM.exists(), reason="chromium is not installed")
def test_renders_in_headless_chromium(normal_run: tuple[dict[str, Any], str, Path], tmp_path: Path) -> None:
    _, _, path = normal_run
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        path.resolve().as_uri(),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    dom = out.stdout
    assert dom.count('class="main-svg"') >= 2, out.stderr[-2000:]
    assert CDF_TITLE in dom
