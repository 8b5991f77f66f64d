"""`loadtest ui` end to end: real UI process, embedded engine, Locust's HTTP API and headless chromium."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from loadtest.fmt import fmt_ms
from loadtest.locust.live_series import LiveSeries
from loadtest.locust.ui_stats import request_counts, slos_text, table_rows, verdict_lines
from loadtest.metrics import hdr
from loadtest.metrics.hdr import fast_percentiles
from loadtest.metrics.recorder import Aggregate, Recorder
from loadtest.metrics.slo import merge_slos
from tests.conftest import CLI, GENERATOR_HEALTH, write_profile

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


def test_window_percentiles_are_the_percentiles_of_the_window_alone() -> None:
    rng = np.random.default_rng(7)
    first, second = (rng.lognormal(m, 1, 5_000).astype(np.int64) + 1 for m in (8, 11))
    both, alone = hdr.new_histogram(), hdr.new_histogram()
    hdr.record_many(both, first)
    before = hdr.counts_of(both)
    hdr.record_many(both, second)
    hdr.record_many(alone, second)
    pcts = (50.0, 90.0, 99.0, 100.0)
    window = hdr.percentiles_of_counts(both, hdr.counts_of(both) - before, pcts)
    assert window == fast_percentiles(alone, pcts) != fast_percentiles(both, pcts)
    assert hdr.percentiles_of_counts(both, before - before, pcts) == [None] * 4


def test_ui_texts_carry_units_and_each_reason_once() -> None:
    slos = merge_slos({"ttft_p99": "2s", "error_rate": "1%", "quality_min": "95%"}, None)
    assert slos_text(slos) == "ttft_p99 ≤ 2,000 ms, error_rate ≤ 1.00%, quality_min ≥ 95.00%"
    reason = "SLO missed: ttft_p99: p99 15.4 ms > 2 ms; run ≥ 459 requests"
    verdict = {
        "reasons": [reason],
        "checks": [
            {"name": "ttft_p99", "passed": False, "blocking": True, "detail": "p99 15.4 ms > 2 ms"},
            {"name": "generator_cpu", "passed": False, "blocking": False, "detail": "CPU 95% > 90%"},
            {"name": "error_rate", "passed": True, "blocking": True, "detail": "0.00% ≤ 1.00%"},
        ],
    }
    assert verdict_lines(verdict) == [reason, "generator_cpu (flagged, not blocking): CPU 95% > 90%"]


def test_live_series_windows_rates_and_stays_bounded() -> None:
    rec = Recorder()
    agg = rec.all.total
    series = LiveSeries(started_epoch=1000.0, interval_s=1.0, max_points=8)
    for i in range(1, 41):  # 40 samples of 1 s: request i's TTFT is i ms, i requests ok, one error
        hdr.record_many(agg.hists["ttft"], np.full(i, i * 1000, dtype=np.int64))
        agg.outcomes.update({"ok": i, "http_5xx": 1})
        agg.totals.update({"output_tokens": 10 * i})
        series.sample(rec.result(), 1000.0 + i, in_flight=i % 3, users=4)
        if i == 3:
            early = series.to_data()
            ttft = early["scopes"]["all"]["latency_ms"]["ttft"]
            assert [round(v) for v in ttft["p50"]] == [1, 2, 3]  # each window holds only its own requests
            assert early["scopes"]["all"]["ok_per_s"] == [1.0, 2.0, 3.0]
            assert early["scopes"]["all"]["output_tokens_per_s"] == [10.0, 20.0, 30.0]
            assert early["scopes"]["all"]["errors_per_s"] == {"http_5xx": [1.0, 1.0, 1.0]}
    data = series.to_data()
    assert 4 <= len(data["t"]) <= 8 and data["interval_s"] > 1.0  # halved, the interval doubled
    assert data["t"] == sorted(data["t"]) and data["t"][-1] == 40.0
    cols = data["scopes"]["all"]
    assert all(len(c) == len(data["t"]) for c in (cols["ok_per_s"], cols["latency_ms"]["ttft"]["p99"]))
    assert len(cols["errors_per_s"]["http_5xx"]) == len(data["t"])
    assert round(cols["latency_ms"]["ttft"]["p50"][-1]) == 40


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
        m = re.search(r'id="lat-ttft-p50">([0-9.]+)<', dom)
        assert m and float(m.group(1)) > 0, dom[-3000:]
        assert "ui-chat" in dom and "4 concurrent streams (closed loop)" in dom
        # Locust's React UI renders the extended tab from extended_tabs/extended_tables/extended_stats.
        tab = _dump_dom(base + "/?tab=llm", tmp_path / "chromium", budget_ms=4000)
        assert "LLM metrics" in tab and "TTFT ms" in tab and "ttft_p99" in tab, tab[-3000:]
        assert 'id="llm-dashboard-link"' in tab and 'href="./llm"' in tab  # Locust's page links the dashboard
        # Locust's Statistics tab: its Median/95%ile are the E2E latency, its size the output tokens
        locust_rows = json.loads(_get(base + "/stats/requests")[1])["stats"]
        assert {r["method"] for r in locust_rows if r["name"] != "Aggregated"} == {
            "CHAT E2E (size: output tokens)"
        }

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
        assert done["report_url"] == f"/llm/runs/{done['run']['id']}/report"
        assert _get(base + "/llm/report")[1] == _get(base + done["report_url"])[1]  # the latest run's
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

        # The start form's one "Profile" field (Locust's own) offers the shipped profiles of the same
        # load model, the UI's own first.
        form = urllib.request.urlopen(base + "/", timeout=10).read().decode()
        assert "llm_profile" not in form and '"profile": "ui-chat"' in form
        assert re.search(r'"all_profiles": \["ui-chat", [^]]*"shared-prefix-chat"', form), form[-2000:]
        # A new start is a new run (new folder, new numbers, here the profile chosen in the form);
        # SIGTERM mid-run writes it as interrupted, then the UI exits cleanly and takes the engine with it.
        assert _post(
            base + "/swarm",
            {"user_count": 2, "spawn_rate": 2, "host": "", "profile": "shared-prefix-chat"},
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


# ---- the live dashboard, the form's users, every run of a session ----------------------------------


@pytest.fixture(scope="module")
def ui_session(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One `loadtest ui` (embedded engine failing 5 % with 503, a closed-loop profile of 4 streams, two
    scenarios) for the tests below."""
    tmp = tmp_path_factory.mktemp("ui-session")
    prompt = {"system_prompt_tokens": 0, "input_tokens": {"dist": "fixed", "value": 64}}
    prof = tmp / "ui-dash.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "ui-dash",
                "api": "chat",
                "load": {"concurrency": 4},
                "duration_s": 3,
                "seed": 1,
                "slos": {"ttft_p99": "2s", "tpot_p99": "1s"},
                "judging": {"generator_health": GENERATOR_HEALTH},
                "scenarios": [  # two scenarios: the dashboard charts each one apart
                    {"name": "short", **prompt, "output_tokens": {"dist": "fixed", "value": 4}},
                    {"name": "long", **prompt, "output_tokens": {"dist": "fixed", "value": 48}},
                ],
            }
        )
    )
    port = _free_port()
    log = tmp / "ui.log"
    args = ["ui", "--profile", str(prof), "--web-port", str(port), "--engine-speedup", "8"]
    args += ["--engine-faults", "http_503=5%"]  # a few errors for the errors-by-class chart
    with log.open("wb") as logf:
        proc = subprocess.Popen(
            [*CLI, *args, "--reports-dir", str(tmp / "reports")],
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for("the UI to answer", lambda: _get(base + "/")[0] == 200, 30, proc, log)
        yield base, proc, log, tmp
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run_once(ui: Any, users: int, until_ok: int = 30, edit_to: int | None = None) -> dict[str, Any]:
    """Start a run with ``users`` users, let ``until_ok`` requests succeed (then, with ``edit_to``, change
    the user count as Locust's Edit does), stop it, wait for its results."""
    base, proc, log, _ = ui
    assert _post(base + "/swarm", {"user_count": users, "spawn_rate": users, "host": ""})["success"]
    _wait_for(
        "some requests",
        lambda: (
            (s := _stats(base))["run"]["phase"] == "running" and s["overall"]["requests"]["ok"] >= until_ok
        ),
        30,
        proc,
        log,
    )
    if edit_to is not None:
        assert _post(base + "/swarm", {"user_count": edit_to, "spawn_rate": edit_to})["success"]
        _wait_for("the new user count", lambda: _stats(base)["users"] == edit_to, 20, proc, log)
    assert _post(base + "/stop")["success"]
    return _wait_for(
        "the results",
        lambda: (s := _stats(base))["run"]["phase"] in ("done", "failed") and s,
        30,
        proc,
        log,
    )


# Every chart's traces as plotted: (id, [y values of each trace]).
_CHART_DATA = (
    "[...document.querySelectorAll('.js-plotly-plot')].map(g => "
    "[g.id, (g.data || []).map(t => (t.y || []).map(v => v == null ? null : +v))])"
)
_TTFT_POINTS = "(document.getElementById('chart-ttft').data || [{y: []}])[0].y.filter(v => v != null).length"


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless chromium")
def test_live_dashboard_charts_change_during_a_run_then_show_the_verdict(ui_session: Any) -> None:
    from tests.browser import ARTIFACTS, LivePage

    base, proc, log, tmp = ui_session
    assert _post(base + "/swarm", {"user_count": 4, "spawn_rate": 4, "host": ""})["success"]
    with LivePage(base + "/llm", tmp / "chromium-dash") as page:
        first_n = page.wait_for(f"{_TTFT_POINTS} >= 2 && {_TTFT_POINTS}", timeout=30)
        first = dict(page.evaluate(_CHART_DATA))
        shot1 = page.screenshot(ARTIFACTS / "webui-dashboard-1.png")
        page.wait_for(f"{_TTFT_POINTS} >= {first_n + 2}", timeout=30)
        second = dict(page.evaluate(_CHART_DATA))
        shot2 = page.screenshot(ARTIFACTS / "webui-dashboard-2.png")
        cards = page.evaluate("document.getElementById('card-ok').textContent")

        # the eight charts, each plotted, and between the two moments they show different values
        assert (
            sorted(first)
            == sorted(second)
            == sorted(
                f"chart-{c}"
                for c in ("ttft", "tpot", "itl", "e2e", "throughput", "inflight", "errors", "attainment")
            )
        )
        for chart in ("chart-ttft", "chart-tpot", "chart-itl", "chart-e2e", "chart-throughput"):
            assert second[chart] != first[chart], chart
            assert len(second[chart][0]) > len(first[chart][0]) >= 2, chart
        ttft_p50 = [v for v in second["chart-ttft"][0] if v is not None]
        assert all(v > 0 for v in ttft_p50)
        tokens = [v for v in second["chart-throughput"][0] if v is not None]
        assert tokens and max(tokens) > 0
        assert max(second["chart-inflight"][0]) >= 1  # requests in flight during the run
        error_classes = page.evaluate("document.getElementById('chart-errors').data.map(t => t.name)")
        assert error_classes == ["http_5xx"] and max(second["chart-errors"][0]) > 0  # the injected 503s
        assert max(v for v in second["chart-attainment"][1] if v is not None) > 0  # SLO attainment %
        assert shot1 != shot2
        assert "requests ok" in cards and re.search(r"\d", cards)
        series = json.loads(_get(base + "/llm/series")[1])
        assert series["t"] == sorted(series["t"]) and len(series["t"]) >= first_n + 2
        assert set(series["scopes"]) == {"all", "short", "long"}

        # per scenario: the scope list offers each one, and choosing one charts its requests alone
        options = page.evaluate("[...document.getElementById('scope').options].map(o => o.value)")
        assert options == ["all", "long", "short"]

        def tokens_per_request(scope: str) -> set[int]:
            page.evaluate(
                f"(() => {{ const s = document.getElementById('scope'); s.value = '{scope}';"
                " s.dispatchEvent(new Event('change')); return 1; })()"
            )
            tokens, ok = dict(page.evaluate(_CHART_DATA))["chart-throughput"]
            return {round(a / b) for a, b in zip(tokens, ok, strict=True) if a and b}

        assert tokens_per_request("long") == {48}  # fixed 48 output tokens in this scenario
        page.screenshot(ARTIFACTS / "webui-dashboard-scenario-long.png")
        assert tokens_per_request("short") == {4}
        mixed = tokens_per_request("all")
        assert mixed and all(4 < r < 48 for r in mixed)

        # stopped: the page shows the verdict with its reasons and links the run's report
        assert _post(base + "/stop")["success"]
        status = page.wait_for(
            "document.getElementById('verdict-status') && document.getElementById('verdict-status').textContent",
            timeout=40,
        )
        done = _stats(base)
        assert status == done["verdict"]["status"]
        banner = page.evaluate("document.getElementById('verdict').textContent")
        assert all(line in banner for line in done["verdict_lines"])
        # next to the verdict, the figures it judged (run.json's), labelled
        assert page.evaluate("document.getElementById('judged-label').textContent") == done["judged"]["label"]
        ttft = done["judged"]["latency_ms"]["ttft"]
        shown = page.evaluate("document.getElementById('judged-ttft').textContent")
        assert shown == f"{fmt_ms(ttft['p50'])} / {fmt_ms(ttft['p99'])}", shown
        href = page.evaluate("document.getElementById('report-link').getAttribute('href')")
        assert href == "." + done["report_url"]
        page.screenshot(ARTIFACTS / "webui-dashboard-done.png")
        assert not page.errors(), page.errors()
    status_code, body = _get(base + done["report_url"])
    assert status_code == 200 and b"loadtest report" in body


def _assert_the_judged_figures_shown(done: dict[str, Any], run_json: dict[str, Any]) -> None:
    """/llm/stats and the LLM tab's rows carry run.json's judged figures next to the verdict, labelled."""
    judged = run_json.get("judged")
    m = judged["metrics"] if judged else run_json["metrics"]
    shown = done["judged"]
    assert shown["window"] == (judged is not None)
    n = f"{m['requests']['completed']:,} requests"
    if judged:
        w = judged["window"]
        start, end = w["warmup_s"], w["warmup_s"] + w["duration_s"]
        assert shown["label"] == f"judged window: {start:.1f}–{end:.1f} s, {n}", shown["label"]
    else:
        assert shown["label"].startswith(f"judged: the whole run, {n}"), shown["label"]
    for key in ("ttft", "tpot", "itl", "e2e"):
        assert [shown["latency_ms"][key][p] for p in ("p50", "p90", "p99")] == [
            m["latency_ms"][key][p] for p in ("p50", "p90", "p99")
        ], key
    rows = table_rows(done)
    verdict_at = next(i for i, r in enumerate(rows) if r["section"] == "verdict")
    ttft = next(
        r for r in rows[verdict_at:] if r["section"].startswith("judged") and r["metric"] == "TTFT ms"
    )
    assert ttft["p99"] == fmt_ms(m["latency_ms"]["ttft"]["p99"])
    assert any(r["value"] == shown["label"] for r in rows[verdict_at:])


def test_ui_run_records_the_form_users_and_the_session_lists_every_run(ui_session: Any) -> None:
    base, proc, log, tmp = ui_session
    before = {r["id"] for r in _stats(base)["runs"]}
    # the form's profile field is checked: an unknown profile is refused with the reason, nothing starts
    refused = _post(base + "/swarm", {"user_count": 2, "spawn_rate": 2, "host": "", "profile": "no-such"})
    assert not refused["success"] and "'no-such'" in refused["message"]
    assert _stats(base)["state"] in ("ready", "stopped")

    runs = {}
    for users, edit_to in ((3, None), (2, 5)):  # the profile says 4 streams; the form's count is the run's
        done = _run_once(ui_session, users, edit_to=edit_to)
        assert done["run"]["error"] is None and done["run"]["users"] == users
        runs[done["run"]["id"]] = users
        out = Path(done["run"]["out_dir"])
        run_json = json.loads((out / "run.json").read_text())
        load = run_json["config"]["load"]
        assert load["concurrency"] == users
        assert load["description"] == f"{users} concurrent streams (closed loop)"
        summary = (out / "mlperf_log_summary.txt").read_text()
        assert f"Concurrency ({users} streams)" in summary and f"target_concurrency : {users}" in summary
        _assert_the_judged_figures_shown(done, run_json)
        changed = [n for n in run_json["notes"] if "user count changed" in n]
        if edit_to is None:
            assert not changed
        else:  # an Edit during the run is said, with the count it started with
            assert len(changed) == 1 and f"{users} at the start, then {edit_to} at " in changed[0], changed

    listed = [r for r in _stats(base)["runs"] if r["id"] not in before]
    assert [r["id"] for r in listed] == list(reversed(runs))  # newest first
    assert [r["users"] for r in listed] == [2, 3]
    assert [[n for _, n in r["user_changes"]] for r in listed] == [[5], []]
    bodies = set()
    for r in listed:
        assert r["phase"] == "done" and r["report_url"] == f"/llm/runs/{r['id']}/report"
        status, body = _get(base + r["report_url"])
        assert status == 200 and b"loadtest report" in body and r["id"].encode() in body
        bodies.add(body)
    assert len(bodies) == 2
    try:
        _get(base + "/llm/runs/not-a-run/report")
        raise AssertionError("an unknown run's report answered")
    except urllib.error.HTTPError as e:
        assert e.code == 404
    if CHROMIUM is not None:  # the dashboard's runs list links both reports
        dom = _dump_dom(base + "/llm", tmp / "chromium-runs", budget_ms=4000)
        for r in listed:
            assert f'data-run="{r["id"]}"' in dom and f'href=".{r["report_url"]}"' in dom
        assert "2 → 5" in dom


def test_ui_start_form_host_is_checked_as_run_checks_it_and_named_in_the_results(ui_session: Any) -> None:
    """A host typed into the start form: one that does not answer is refused with the reason and nothing
    starts; a real one is used, and the run's results name it (never the UI's embedded engine)."""
    from loadtest.sim.process import SimProcess

    base, proc, log, _ = ui_session
    before = [r["id"] for r in _stats(base)["runs"]]
    dead = f"http://127.0.0.1:{_free_port()}"
    refused = _post(base + "/swarm", {"user_count": 2, "spawn_rate": 2, "host": dead})
    assert not refused["success"] and refused["message"].startswith(f"Host {dead}: cannot reach"), refused
    assert _stats(base)["state"] in ("ready", "stopped")
    assert [r["id"] for r in _stats(base)["runs"]] == before  # no run was started
    with SimProcess(speedup=20, extra_args=["--served-model-name", "typed-host-model"]) as sim:
        assert _post(base + "/swarm", {"user_count": 2, "spawn_rate": 2, "host": sim.base_url})["success"]
        _wait_for(
            "requests to the typed host",
            lambda: (s := _stats(base))["run"]["phase"] == "running" and s["overall"]["requests"]["ok"] >= 10,
            30,
            proc,
            log,
        )
        assert _post(base + "/stop")["success"]
        done = _wait_for(
            "the results",
            lambda: (s := _stats(base))["run"]["phase"] in ("done", "failed") and s,
            30,
            proc,
            log,
        )
        received = sim.stats()["requests_received"]
    assert done["run"]["error"] is None, done["run"]["error"]
    run = json.loads((Path(done["run"]["out_dir"]) / "run.json").read_text())
    endpoint = run["endpoint"]
    assert endpoint["url"] == sim.base_url and endpoint["embedded"] is False and endpoint["engine"] is None
    assert endpoint["models"] == [
        "typed-host-model"
    ]  # what the typed host serves, and what the run asked for
    assert received >= run["metrics"]["requests"]["ok"] > 0
    report = (Path(done["run"]["out_dir"]) / "report.html").read_text()
    assert sim.base_url in report and "embedded simulator" not in report
    summary = (Path(done["run"]["out_dir"]) / "mlperf_log_summary.txt").read_text()
    assert "embedded simulator" not in summary
