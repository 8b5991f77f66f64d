"""`loadtest ui` end to end: real UI process, embedded engine, Locust's HTTP API and headless chromium."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from loadtest.locust.webui import request_counts
from loadtest.metrics import hdr
from loadtest.metrics.hdr import fast_percentiles
from loadtest.metrics.recorder import Aggregate
from tests.conftest import CLI, write_profile

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _post(url: str, form: dict[str, Any] | None = None) -> dict[str, Any]:
    data = urllib.parse.urlencode(form or {}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"), timeout=30) as r:
        return json.loads(r.read())


def _stats(base: str) -> dict[str, Any]:
    return json.loads(_get(base + "/llm/stats")[1])


def _wait_for(what: str, check: Any, timeout: float, proc: subprocess.Popen, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"loadtest ui exited ({proc.returncode}) waiting for {what}:\n{log.read_text()}")
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()}")


def _dump_dom(url: str, profile_dir: Path, budget_ms: int = 3000) -> str:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile_dir}",
        "--dump-dom",
        f"--virtual-time-budget={budget_ms}",
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout


def test_live_percentiles_follow_loadgens_rank_and_counts_match_run_json_rules() -> None:
    agg = Aggregate()
    values = np.random.default_rng(3).lognormal(10, 2, 20_000).astype(np.int64) + 1
    hdr.record_many(agg.hists["e2e"], values)
    pcts = (0.1, 50.0, 90.0, 99.0, 99.9, 100.0)
    ranked = np.sort(np.clip(values, 1, None))  # LoadGen's rank, the bucket's highest equivalent value
    assert fast_percentiles(agg.hists["e2e"], pcts) == [
        agg.hists["e2e"].get_highest_equivalent_value(
            int(ranked[min(int(len(ranked) * p / 100), len(ranked) - 1)])
        )
        for p in pcts
    ]
    assert fast_percentiles(agg.hists["ttft"], (50.0,)) == [None]
    agg.outcomes.update({"ok": 90, "http_5xx": 10, "cancelled": 5})
    assert request_counts(agg) == {
        "completed": 105,
        "ok": 90,
        "failed": 10,
        "cancelled": 5,
        "error_rate": 0.1,
    }


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless chromium")
def test_ui_live_llm_metrics_then_results_and_clean_exit(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "ui-chat.yaml",
        name="ui-chat",
        output_tokens={"dist": "fixed", "value": 16},
        slos={"ttft_p99": "2s", "error_rate": "1%"},
    )
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "ui.log"
    reports = tmp_path / "reports"
    args = ["ui", "--profile", str(prof), "--web-port", str(port), "--engine-speedup", "8"]
    with log.open("wb") as logf:
        proc = subprocess.Popen(
            [*CLI, *args, "--reports-dir", str(reports)], stdout=logf, stderr=subprocess.STDOUT, cwd=tmp_path
        )
    try:
        _wait_for("the UI to answer", lambda: _get(base + "/")[0] == 200, 30, proc, log)
        engines = [
            p for p in psutil.Process(proc.pid).children(recursive=True) if "loadtest.sim" in p.cmdline()
        ]
        assert len(engines) == 1
        before = _stats(base)
        assert before["state"] == "ready" and before["run"] is None
        assert before["profile"]["name"] == "ui-chat"
        assert before["profile"]["load"] == "4 concurrent streams (closed loop)"
        assert before["profile"]["slos"] == {"ttft_p99": 2000.0, "error_rate": 0.01}

        # Start a run through Locust's own HTTP API (what the start form posts).
        res = _post(base + "/swarm", {"user_count": 4, "spawn_rate": 4, "host": ""})
        assert res["success"], res
        live = _wait_for(
            "live TTFT numbers",
            lambda: (
                (s := _stats(base))["overall"] and s["overall"]["latency_ms"]["ttft"]["count"] >= 20 and s
            ),
            20,
            proc,
            log,
        )
        assert live["run"]["phase"] == "running" and live["verdict"] is None
        assert live["overall"]["latency_ms"]["ttft"]["p50"] > 0
        assert {s["key"] for s in live["slos"]} == {"ttft_p99", "error_rate"}

        # The standalone page renders the live numbers in a real browser.
        dom = _dump_dom(base + "/llm", tmp_path / "chromium")
        m = re.search(r'id="all-ttft-p50">([0-9.]+)<', dom)
        assert m and float(m.group(1)) > 0, dom[-3000:]
        assert "ui-chat" in dom and "4 concurrent streams (closed loop)" in dom
        # Locust's React UI renders the extended tab from extended_tabs/extended_tables/extended_stats.
        tab = _dump_dom(base + "/?tab=llm", tmp_path / "chromium", budget_ms=4000)
        assert "LLM metrics" in tab and "TTFT ms" in tab and "ttft_p99" in tab, tab[-3000:]

        # Stop (Locust's stop button): the run is drained, judged and reported.
        assert _post(base + "/stop")["success"]
        done = _wait_for(
            "the results",
            lambda: (s := _stats(base))["run"]["phase"] in ("done", "failed") and s,
            30,
            proc,
            log,
        )
        assert done["run"]["error"] is None, done["run"]["error"]
        assert done["state"] == "stopped" and done["run"]["phase"] == "done"
        # The verdict depends on this machine (generator CPU is a health check): it exists, SLOs judged.
        verdict = done["verdict"]
        assert verdict["status"] in ("pass", "slo_missed", "invalid", "error_rate")
        assert any("ttft" in c["name"] for c in verdict["checks"]), verdict
        assert done["report_url"] == "/llm/report"
        status, body = _get(base + done["report_url"])
        assert (
            status == 200
            and body.lstrip().lower().startswith(b"<!doctype html")
            and b"loadtest report" in body
        )
        out = Path(done["run"]["out_dir"])
        assert out.parent == reports and out.name.endswith("-ui-chat")
        run = json.loads((out / "run.json").read_text())
        assert run["status"] == "completed"
        assert run["metrics"]["requests"]["ok"] == done["overall"]["requests"]["ok"] > 0
        assert run["metrics"]["requests"]["cancelled"] == 0  # the stop drained in-flight requests
        # each UI run polls the endpoint's /metrics like `loadtest run` (docs/telemetry.md)
        assert run["telemetry"]["engine"] == "loadtest-sim" and run["telemetry"]["t"]
        assert (
            len((out / "records.jsonl").read_text().splitlines()) == run["metrics"]["requests"]["completed"]
        )

        # The start form offers the shipped profiles of the same load model.
        form = urllib.request.urlopen(base + "/", timeout=10).read().decode()
        assert "llm_profile" in form and "shared-prefix-chat" in form
        # A new start is a new run (new folder, new numbers, here the profile chosen in the form);
        # SIGTERM mid-run writes it as interrupted, then the UI exits cleanly and takes the engine with it.
        assert _post(
            base + "/swarm",
            {"user_count": 2, "spawn_rate": 2, "host": "", "llm_profile": "shared-prefix-chat"},
        )["success"]
        second = _wait_for(
            "the second run",
            lambda: (s := _stats(base))["run"]["id"] != out.name and s["overall"]["requests"]["ok"] > 0 and s,
            20,
            proc,
            log,
        )
        assert second["verdict"] is None and second["report_url"] is None
        assert sorted(p.name for p in reports.iterdir()) == sorted([out.name, second["run"]["id"]])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()
        run2 = json.loads((Path(second["run"]["out_dir"]) / "run.json").read_text())
        assert run2["status"] == "interrupted" and run2["interrupted_reason"] == "SIGTERM"
        assert run2["config"]["profile"] == "shared-prefix-chat"
        gone, alive = psutil.wait_procs(engines, timeout=10)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_web_login_guards_the_ui_with_credentials_from_the_environment(tmp_path: Path) -> None:
    import http.cookiejar
    import os
    import urllib.error
    import urllib.parse

    prof = write_profile(tmp_path / "ui-chat.yaml", name="ui-chat")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, LT_UI_LOGIN="ops:s3cret-pass")
    log = tmp_path / "ui.log"
    with log.open("wb") as logf:
        proc = subprocess.Popen(
            [
                *CLI,
                "ui",
                "--profile",
                str(prof),
                "--web-port",
                str(port),
                "--web-login",
                "LT_UI_LOGIN",
                "--reports-dir",
                str(tmp_path / "r"),
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
        )
    try:
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

        def get(path: str) -> tuple[int, str]:
            try:
                with opener.open(base + path, timeout=5) as r:
                    return r.status, r.geturl()
            except urllib.error.HTTPError as e:
                return e.code, ""

        _wait_for("the UI", lambda: get("/login")[0] == 200, 30, proc, log)
        status, url = get("/llm/stats")
        assert status == 401 or "/login" in url  # not logged in: sent to the login page, no LLM data
        bad = urllib.parse.urlencode({"username": "ops", "password": "wrong"}).encode()
        opener.open(base + "/llm/login", data=bad, timeout=5)
        assert "/login" in get("/llm/stats")[1]
        good = urllib.parse.urlencode({"username": "ops", "password": "s3cret-pass"}).encode()
        opener.open(base + "/llm/login", data=good, timeout=5)
        status, url = get("/llm/stats")
        assert status == 200 and url.endswith("/llm/stats")
        assert "s3cret-pass" not in " ".join(psutil.Process(proc.pid).cmdline())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert "s3cret-pass" not in log.read_text()
