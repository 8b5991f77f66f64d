"""Server-side latency histograms and the warm prefix-cache warning: Prometheus parsing and bucket
interpolation, the poller against a real HTTP server, and real runs against the embedded engine."""

from __future__ import annotations

import http.server
import json
import math
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest.contracts.run_document import read_run_document
from loadtest.contracts.sweep_document import (
    SCHEMA_VERSION,
    SweepDocument,
    SweepEndpoint,
    write_sweep_document,
)
from loadtest.fmt import fmt_ms
from loadtest.profile.schema import Profile
from loadtest.report.sweep_report import render_sweep_report
from loadtest.sim import SimProcess
from loadtest.sweep.model import point_entry, point_figures
from loadtest.telemetry import TelemetryPoller, attach, parse
from loadtest.telemetry.histograms import delta, nearest_snapshots, quantile, server_latency, summarize
from loadtest.telemetry.warm import WARM_THRESHOLD, expected_reuse
from tests.conftest import run_cli, write_profile

DATA = Path(__file__).parent / "data"


# ---- bucket arithmetic ----


def test_quantile_interpolates_linearly_within_the_bucket() -> None:
    b = {0.1: 10.0, 0.25: 30.0, 0.5: 40.0, math.inf: 40.0}
    assert quantile(0.5, b) == pytest.approx((0.175, 0.1, 0.25))  # rank 20: half-way through (0.1, 0.25]
    assert quantile(0.9, b) == pytest.approx((0.4, 0.25, 0.5))  # rank 36: 6 of the 10 in (0.25, 0.5]
    assert quantile(0.25, b) == pytest.approx((0.1, 0.0, 0.1))  # the first bucket starts at 0
    assert quantile(0.5, {0.1: 1.0, math.inf: 10.0}) == (0.1, 0.1, None)  # +Inf: the last finite bound
    assert quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None
    assert quantile(0.5, {0.1: 3.0}) is None  # no +Inf bucket: not a Prometheus histogram


def test_percentiles_never_exceed_markovs_bound() -> None:
    b = {0.3: 100.0, math.inf: 100.0}  # 100 values in (0, 300 ms], averaging 1 ms
    s = summarize("q", b, total_s=0.1)
    assert s is not None and s["mean_ms"] == 1.0
    assert s["p50_ms"] == 2.0 and s["p50_bucket_ms"] == [0.0, 2.0]  # not 150 ms: mean / (1 - 0.5)
    assert s["p90_ms"] == pytest.approx(10.0) and s["p99_ms"] == pytest.approx(100.0)
    wide = summarize("q", b, total_s=15.0)  # mean 150 ms: the interpolation stands
    assert wide is not None and wide["p50_ms"] == 150.0 and wide["p50_bucket_ms"] == [0.0, 300.0]


def test_delta_counts_from_zero_after_a_restart() -> None:
    start = {0.1: 5.0, math.inf: 8.0}
    assert delta(start, {0.1: 7.0, math.inf: 12.0}) == ({0.1: 2.0, math.inf: 4.0}, False)
    assert delta(start, {0.1: 1.0, math.inf: 2.0}) == ({0.1: 1.0, math.inf: 2.0}, True)  # went down
    assert delta(None, {0.1: 1.0, math.inf: 2.0})[1] is True


def test_nearest_snapshots_bracket_the_window() -> None:
    snaps: list[Any] = [(0.0, "a"), (1.0, "b"), (2.0, "c"), (3.0, "d")]
    assert nearest_snapshots(snaps, 1.4, 2.2) == ((1.0, "b"), (3.0, "d"))
    assert nearest_snapshots(snaps, -5, 99) == ((0.0, "a"), (3.0, "d"))
    assert nearest_snapshots(snaps[:1], 0, 1) is None


HIST = """\
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.01",model_name="m"}} {a1}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {a2}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {a2}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {a2}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {sa}
vllm:time_to_first_token_seconds_bucket{{engine="1",le="0.01",model_name="m"}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="1",le="0.1",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_bucket{{engine="1",le="+Inf",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_count{{engine="1",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_sum{{engine="1",model_name="m"}} {sb}
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{{le="0.01",model_name="m",tp_rank="0"}} {i}
vllm:time_per_output_token_seconds_bucket{{le="+Inf",model_name="m",tp_rank="0"}} {i}
vllm:time_per_output_token_seconds_bucket{{le="0.01",model_name="m",tp_rank="1"}} {i}
vllm:time_per_output_token_seconds_bucket{{le="+Inf",model_name="m",tp_rank="1"}} {i}
vllm:time_per_output_token_seconds_sum{{model_name="m",tp_rank="0"}} {si}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {q}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {h}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 1.0
"""
BEFORE = dict(a1=2, a2=4, sa=0.2, b2=1, sb=0.05, i=10, si=0.04, q=1000, h=100)
AFTER = dict(a1=12, a2=44, sa=2.2, b2=21, sb=1.05, i=110, si=0.44, q=3000, h=1900)


def test_histograms_sum_over_label_sets_and_take_one_rank() -> None:
    a, b = parse(HIST.format(**BEFORE)), parse(HIST.format(**AFTER))
    assert b.buckets["vllm:time_to_first_token_seconds"] == {0.01: 12.0, 0.1: 65.0, math.inf: 65.0}
    assert b.buckets["vllm:time_per_output_token_seconds"] == {0.01: 110.0, math.inf: 110.0}  # ranks: max
    lat = server_latency(a, b, "vllm")
    ttft = lat["ttft"]
    # both engines, after minus before: 10 in (0, 10 ms], 50 in (10, 100 ms]
    assert ttft["count"] == 60 and ttft["mean_ms"] == pytest.approx(3000 / 60)
    assert ttft["p50_ms"] == pytest.approx(10 + 90 * (30 - 10) / 50)
    assert ttft["p50_bucket_ms"] == [10.0, 100.0] and ttft["bounds_ms"] == [10.0, 100.0]
    assert lat["itl"]["name"] == "vllm:time_per_output_token_seconds"  # the older name, as a fallback
    assert lat["itl"]["count"] == 100 and lat["itl"]["p99_bucket_ms"] == [0.0, 10.0]
    assert "e2e" not in lat  # absent is absent


def test_a_real_vllm_metrics_page() -> None:
    """tests/data/vllm_metrics.txt: vLLM 0.32.0's own exposition after one request (1 prompt of 21
    tokens, 20 output tokens), against an all-zero copy of itself as the start of the run."""
    text = (DATA / "vllm_metrics.txt").read_text()
    end = parse(text)
    assert end.engine == "vllm"
    assert "vllm:request_prompt_tokens" not in end.buckets  # a token-count histogram: not a latency
    zero = parse(
        "\n".join(
            line if line.startswith("#") else line.rsplit(" ", 1)[0] + " 0.0" for line in text.splitlines()
        )
    )
    lat = server_latency(zero, end, "vllm")
    assert list(lat) == ["ttft", "itl", "tpot", "e2e", "queue", "prefill", "decode"]
    names = {k: v["name"] for k, v in lat.items()}
    assert names["itl"] == "vllm:inter_token_latency_seconds" and names["tpot"].startswith(
        "vllm:request_time_per"
    )
    assert all(v["count"] == 1 for k, v in lat.items() if k != "itl") and lat["itl"]["count"] == 19
    ttft = lat["ttft"]  # one TTFT of 27.4 ms, in vLLM's (20 ms, 40 ms] bucket
    assert ttft["mean_ms"] == pytest.approx(27.449, abs=0.001) and ttft["p50_bucket_ms"] == [20.0, 40.0]
    assert ttft["p50_ms"] == pytest.approx(30.0) and ttft["p99_ms"] == pytest.approx(39.8)
    assert ttft["bounds_ms"][:4] == [1.0, 5.0, 10.0, 20.0] and ttft["bounds_ms"][-1] == 2_560_000.0
    assert lat["e2e"]["bounds_ms"][0] == 300.0
    # one queue time of 0.046 ms in vLLM's first bucket (0-300 ms): interpolation alone would say 150 ms;
    # Markov's bound (p50 <= 2 x mean for latencies >= 0) caps the value and the bucket's upper end
    queue = lat["queue"]
    assert queue["mean_ms"] == pytest.approx(0.046) and queue["p50_bucket_ms"] == [0.0, 0.092]
    assert queue["p50_ms"] == pytest.approx(0.092) and queue["p99_ms"] == pytest.approx(4.609)
    assert (
        end.total["vllm:prefix_cache_queries_total"] == 21.0
        and end.total["vllm:prefix_cache_hits_total"] == 0
    )


# ---- the poller against a real HTTP server ----


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:  # noqa: N802
        body = type(self).body
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, type[_Metrics]]]:
    handler = type("Handler", (_Metrics,), {"body": HIST.format(**BEFORE).encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", handler
    finally:
        server.shutdown()
        server.server_close()


def _wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_poller_differences_first_and_last_scrape(metrics_server: tuple[str, type[_Metrics]]) -> None:
    url, handler = metrics_server
    poller = TelemetryPoller([url], interval_s=0.2).start()
    _wait(lambda: poller.first is not None and len(poller.t) >= 1)
    handler.body = HIST.format(**AFTER).encode()  # the load happens; stop() takes the last scrape
    poller.stop()
    doc: dict[str, Any] = {"notes": [], "config": {"profile_resolved": {"scenarios": [{"name": "chat"}]}}}
    attach(doc, poller, poller.started_epoch)
    sl = doc["telemetry"]["server_latency"]
    assert sl["metrics"]["ttft"]["count"] == 60 and sl["metrics"]["itl"]["count"] == 100
    assert "bucket-interpolated" in sl["method"] and sl["to_s"] > sl["from_s"]
    pc = doc["prefix_cache"]
    assert pc["hit"] == 1800 and pc["queried"] == 2000 and pc["hit_rate"] == pytest.approx(0.9)
    assert pc["warm"] is True and pc["threshold"] == WARM_THRESHOLD and pc["expected_reuse"] is None
    assert doc["notes"] == [pc["warning"]] and "answered 90 % of prompt tokens" in pc["warning"]


def test_no_warning_when_the_profile_asks_for_reuse(metrics_server: tuple[str, type[_Metrics]]) -> None:
    url, handler = metrics_server
    poller = TelemetryPoller([url], interval_s=0.2).start()
    _wait(lambda: poller.first is not None)
    handler.body = HIST.format(**AFTER).encode()
    shared = {"scenarios": [{"name": "rag", "prefix": {"groups": 4, "tokens": 2000}}]}
    doc: dict[str, Any] = {"notes": [], "config": {"profile_resolved": shared}}
    attach(doc, poller)
    assert doc["prefix_cache"]["hit_rate"] == pytest.approx(0.9)
    assert doc["prefix_cache"]["warm"] is False and "shared prefixes" in doc["prefix_cache"]["expected_reuse"]
    assert doc["notes"] == []
    assert expected_reuse({"scenarios": [{"name": "s", "kind": "multi_turn"}]})
    assert expected_reuse({"scenarios": [{"name": "c", "system_prompt_tokens": 64}]}) is None


def test_prefix_cache_from_the_records_without_telemetry() -> None:
    tokens = {"usage_cached_total": 600, "usage_input_total": 1000}
    doc: dict[str, Any] = {"notes": [], "metrics": {"tokens": tokens}, "config": {"profile_resolved": {}}}
    attach(doc, None)
    assert doc["prefix_cache"]["hit_rate"] == pytest.approx(0.6) and doc["prefix_cache"]["warm"] is True
    assert "cached_tokens" in doc["prefix_cache"]["source"] and len(doc["notes"]) == 1
    cold: dict[str, Any] = {
        "notes": [],
        "metrics": {"tokens": {"usage_cached_total": 0, "usage_input_total": 9}},
    }
    attach(cold, None)
    assert "prefix_cache" not in cold  # a server that reports no cached tokens: unknown, not 0


# ---- real runs against the embedded engine ----


def _close_within_bucket(client: float, server: dict[str, Any]) -> bool:
    lo, hi = server["p50_bucket_ms"]
    return hi is not None and abs(client - server["p50_ms"]) <= hi - lo


SERVER_ROW = re.compile(r"^(TTFT|ITL|E2E) (p50|p90|p99) +(\S+) +(\S+)  (\S+) +(.+)$")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _assert_signed_only_beyond_the_bucket(stdout: str, doc: dict[str, Any]) -> None:
    """The console's server-vs-client rows (the judged window on both sides): the server figure's bucket
    as run.json has it; a signed difference only where it exceeds that bucket's width, else "within
    bucket (±width)"; every line in 80 columns."""
    long = [ln for ln in stdout.splitlines() if len(ln) > 80 and not ln.split()[-1].startswith("/")]
    assert not long, long  # a path at the end of a line cannot be broken
    server = doc["telemetry"]["server_latency"]["judged"]["metrics"]
    client = doc["judged"]["metrics"]["latency_ms"]
    rows = [m for m in map(SERVER_ROW.match, stdout.splitlines()) if m]
    assert len(rows) == 9, stdout  # TTFT, ITL and E2E at p50, p90 and p99
    signed = within = 0
    for m in rows:
        key, p, bucket, diff = m.group(1).lower(), m.group(2), m.group(5), m.group(6)
        srv = server[key]
        lo, hi = srv[f"{p}_bucket_ms"]
        if hi is None or not lo:  # past the last bound, or in the first bucket: no difference at all
            assert diff == "-", m.group(0)
            continue
        assert [_num(b) for b in bucket.split("–")] == pytest.approx([lo, hi], rel=0.01), m.group(0)
        d = client[key][p] - srv[f"{p}_ms"]
        if diff.startswith("within bucket"):
            assert abs(d) <= hi - lo and diff == f"within bucket (±{fmt_ms(hi - lo)})", m.group(0)
            within += 1
        else:
            assert diff[0] in "+−" and abs(d) > hi - lo, m.group(0)
            assert _num(diff[1:]) == pytest.approx(abs(d), rel=0.01), m.group(0)
            signed += 1
    assert signed + within > 0, stdout


def test_run_writes_server_histograms_that_agree_with_the_client(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        input_tokens={"dist": "fixed", "value": 256},
        output_tokens={"dist": "uniform", "min": 16, "max": 48},
        load={"concurrency": 6},
        judging={"warmup_s": 1},
    )
    out = tmp_path / "run"
    r = run_cli(
        ["run", "--profile", str(prof), "--duration", "4", "--engine-speedup", "4", "--out", str(out)]
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "run.json").read_text())
    m = doc["metrics"]
    ok = m["requests"]["ok"]
    assert ok > 20 and m["requests"]["completed"] == ok
    sl = doc["telemetry"]["server_latency"]
    srv = sl["metrics"]
    assert set(srv) >= {"ttft", "itl", "tpot", "e2e", "decode"}
    # the engine counted exactly the requests the client sent, and each of their tokens after the first
    assert all(srv[k]["count"] == ok for k in ("ttft", "tpot", "e2e", "decode"))
    assert srv["itl"]["count"] == m["tokens"]["usage_output_total"] - ok
    lat = m["latency_ms"]
    for client, server in (("ttft_send", "ttft"), ("itl", "itl"), ("tpot", "tpot"), ("e2e", "e2e")):
        assert _close_within_bucket(lat[client]["p50"], srv[server]), (client, lat[client], srv[server])
    assert srv["ttft"]["bounds_ms"][:3] == [1.0, 5.0, 10.0]  # vLLM's own bucket bounds
    judged = sl["judged"]["metrics"]  # the judged window (1 s warm-up) from the per-tick snapshots
    assert 0 < judged["e2e"]["count"] < srv["e2e"]["count"]
    assert doc["prefix_cache"]["warm"] is False and doc["prefix_cache"]["hit_rate"] < WARM_THRESHOLD
    assert "Server vs client" in r.stdout and "bucket-interpolated" in r.stdout
    _assert_signed_only_beyond_the_bucket(r.stdout, doc)
    html = (out / "report.html").read_text()
    start = html.index('id="server-vs-client"')
    table = html[start : html.index("</section>", start)]
    assert "<strong>TTFT</strong>" in table and "<strong>E2E</strong>" in table and "Decode time" in table
    assert "what the network and the generator add" in table and 'title="bucket ' in table
    assert 'id="warm-cache"' not in html


def _warm_profile(path: Path) -> Path:
    """Fixed prompts with no salt and no run salt: the same seed sends the same prompts again."""
    extra = {"run_salt": "off"} if "run_salt" in Profile.model_fields else {}
    return write_profile(
        path,
        input_tokens={"dist": "fixed", "value": 512},
        output_tokens={"dist": "fixed", "value": 4},
        load={"concurrency": 4},
        salt=False,
        seed=7,
        **extra,
    )


@pytest.fixture(scope="module")
def warm_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The same prompts twice against one engine: the second run finds them in the prefix cache.

    Both runs send the same 40 requests (--max-requests), so how much the second finds cached does not
    depend on how fast a busy machine let each run go."""
    root = tmp_path_factory.mktemp("warm")
    prof = _warm_profile(root / "warm.yaml")
    outs, stdout = [], ""
    with SimProcess(speedup=5) as sim:
        for i in range(2):
            out = root / f"run{i}"
            argv = ["run", "--profile", str(prof), "--host", sim.base_url, "--duration", "60"]
            r = run_cli([*argv, "--max-requests", "40", "--out", str(out)])
            assert r.returncode == 0, r.stderr
            outs.append(out)
            stdout = r.stdout
    return outs[0], outs[1], stdout


def test_a_warm_rerun_is_flagged(warm_runs: tuple[Path, Path, str]) -> None:
    cold_dir, warm_dir, stdout = warm_runs
    cold = json.loads((cold_dir / "run.json").read_text())
    warm = json.loads((warm_dir / "run.json").read_text())
    assert cold["prefix_cache"]["warm"] is False and cold["prefix_cache"]["hit_rate"] < 0.1
    pc = warm["prefix_cache"]
    assert pc["warm"] is True and pc["hit_rate"] > WARM_THRESHOLD and pc["expected_reuse"] is None
    assert pc["source"].startswith("vllm:prefix_cache_hits_total")
    assert pc["warning"] in warm["notes"] and "latencies are not cold-cache figures" in pc["warning"]
    assert pc["warning"] not in warm["verdict"]["reasons"]  # a warning, not a reason to fail
    # the client's cached_tokens tell the same story as the server's counters
    tok = warm["metrics"]["tokens"]
    assert tok["usage_cached_total"] / tok["usage_input_total"] == pytest.approx(pc["hit_rate"], abs=0.05)
    assert "WARNING" in stdout and "warm workload" in stdout
    html = (warm_dir / "report.html").read_text()
    banner = html[html.index('id="warm-cache"') : html.index("</div>", html.index('id="warm-cache"'))]
    assert f"answered {pc['hit_rate'] * 100:.0f} % of prompt tokens" in banner
    assert 'id="warm-cache"' not in (cold_dir / "report.html").read_text()


def test_the_sweep_marks_warm_points(warm_runs: tuple[Path, Path, str], tmp_path: Path) -> None:
    points = []
    for i, src in enumerate(warm_runs[:2]):
        rel = f"points/{i:02d}-c4"
        shutil.copytree(src, tmp_path / rel)
        run = read_run_document(tmp_path / rel)
        points.append(
            point_entry(i, f"c4-{i}", 4, None, rel_dir=rel, status="completed", exit_code=0, run=run)
        )
    assert points[0].warm_cache is False and points[1].warm_cache is True
    hit_rate = points[1].prefix_cache_hit_rate
    assert hit_rate is not None and hit_rate == point_figures(run).prefix_cache_hit_rate > WARM_THRESHOLD
    doc = SweepDocument(
        schema_version=SCHEMA_VERSION,
        kind="sweep",
        mode="concurrency",
        status="completed",
        interrupted_reason=None,
        created=run.created,
        tool={"name": "loadtest", "version": run.tool.version},
        profile="test-chat",
        profile_path=run.config.profile_path or "",
        seed=run.config.seed,
        fingerprint=run.workload.fingerprint,
        endpoint=SweepEndpoint(url=run.endpoint.url, embedded=False, engine=None),
        slo={},
        point_duration_s=run.config.duration_s,
        offline_concurrency=None,
        stop_at_saturation=False,
        points=points,
        knee=None,
        best_under_slo=None,
        stopped_because=None,
    )
    write_sweep_document(tmp_path, doc)
    html = render_sweep_report(tmp_path).read_text()
    banner = html[html.index('id="warm-cache"') : html.index("</div>", html.index('id="warm-cache"'))]
    assert "1 point(s)" in banner and "c4-1" in banner and "c4-0" not in banner
    assert "prefix hit" in html and "warm prefix cache (" in html
