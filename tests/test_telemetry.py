"""Server telemetry: each engine's metric names mapped to the common series, polling, and a real run."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
from conftest import run_cli, write_profile

from loadtest.sim import SimProcess
from loadtest.telemetry import TelemetryPoller, attach, detect_engine, metrics_urls, parse
from loadtest.telemetry.names import candidates, source_names
from loadtest.telemetry.poller import value_of

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_running{{engine="1",model_name="m"}} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.5
vllm:kv_cache_usage_perc{{engine="1",model_name="m"}} 0.3
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {preempt}
vllm:num_preemptions_created{{engine="0",model_name="m"}} 1.7e9
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{le="0.1",model_name="m"}} 3.0
vllm:time_to_first_token_seconds_sum{{model_name="m"}} 0.2
"""
SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0",moe_ep_rank="0"}} {running}
sglang:num_running_reqs{{engine_type="unified",model_name="m",tp_rank="1",pp_rank="0",moe_ep_rank="0"}} {running}
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0",moe_ep_rank="0"}} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0",moe_ep_rank="0"}} 0.25
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0",moe_ep_rank="0"}} 0.6
# TYPE sglang:num_retracted_requests counter
sglang:num_retracted_requests_total{{model_name="m",tp_rank="0",pp_rank="0",moe_ep_rank="0"}} {preempt}
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{{model_name="m"}} {gen}
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{{model_name="m"}} {prompt}
"""
TRTLLM = """\
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{{model_name="m",engine_type="trtllm",rank="0",pid="11"}} {running}
trtllm_num_requests_running{{model_name="m",engine_type="trtllm",rank="1",pid="12"}} {running}
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{{model_name="m",engine_type="trtllm",rank="0",pid="11"}} 1.0
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{{model_name="m",engine_type="trtllm",rank="0",pid="11"}} 0.75
# TYPE trtllm_kv_cache_reused_blocks counter
trtllm_kv_cache_reused_blocks_total{{model_name="m",engine_type="trtllm",rank="0",pid="11"}} {hits}
# TYPE trtllm_kv_cache_missed_blocks counter
trtllm_kv_cache_missed_blocks_total{{model_name="m",engine_type="trtllm",rank="0",pid="11"}} {misses}
# TYPE trtllm_generation_tokens counter
trtllm_generation_tokens_total{{model_name="m",engine_type="trtllm",rank="0",pid="11"}} {gen}
# TYPE trtllm_prompt_tokens counter
trtllm_prompt_tokens_total{{model_name="m",engine_type="trtllm",rank="0",pid="11"}} {prompt}
"""
DYNAMO = """\
# TYPE dynamo_frontend_inflight_requests gauge
dynamo_frontend_inflight_requests{{model="m"}} {running}
# TYPE dynamo_frontend_queued_requests gauge
dynamo_frontend_queued_requests{{model="m"}} 4
# TYPE dynamo_component_kvstats_gpu_cache_usage_percent gauge
dynamo_component_kvstats_gpu_cache_usage_percent{{dp_rank="0"}} 0.4
dynamo_component_kvstats_gpu_cache_usage_percent{{dp_rank="1"}} 0.6
# TYPE dynamo_frontend_cached_tokens histogram
dynamo_frontend_cached_tokens_bucket{{model="m",le="+Inf"}} 3
dynamo_frontend_cached_tokens_sum{{model="m"}} {hits}
dynamo_frontend_cached_tokens_count{{model="m"}} 3
# TYPE dynamo_frontend_input_sequence_tokens histogram
dynamo_frontend_input_sequence_tokens_sum{{model="m"}} {prompt}
dynamo_frontend_input_sequence_tokens_count{{model="m"}} 3
# TYPE dynamo_frontend_output_tokens counter
dynamo_frontend_output_tokens_total{{model="m"}} {gen}
"""


def series_between(template: str, before: dict, after: dict, dt: float = 2.0) -> tuple[str, dict]:
    """The engine detected and every series' value from two scrapes ``dt`` seconds apart."""
    prev, cur = parse(template.format(**before)), parse(template.format(**after))
    engine = cur.engine
    out = {}
    for series, srcs in candidates(engine).items():
        src = next((s for s in srcs if all(n in cur.total for n in source_names(s))), None)
        if src is not None:
            out[series] = value_of(src, prev, cur, dt)
    return engine, out


def test_vllm_names() -> None:
    engine, s = series_between(
        VLLM,
        dict(running=4, preempt=2, queries=1000, hits=0, gen=100, prompt=1000),
        dict(running=6, preempt=5, queries=1400, hits=300, gen=300, prompt=1600),
    )
    assert engine == "vllm"
    assert s["requests_running"] == 7  # two engines (label sets) summed
    assert s["requests_waiting"] == 3
    assert s["kv_cache_usage"] == pytest.approx(0.4)  # a fraction: averaged over the engines
    assert s["preemptions"] == 3  # count in the interval, not the running total
    assert s["prefix_cache_hit_rate"] == pytest.approx(0.75)  # 300 hit tokens of 400 queried
    assert s["generation_tokens_per_s"] == pytest.approx(100.0)  # 200 tokens in 2 s
    assert s["prompt_tokens_per_s"] == pytest.approx(300.0)


def test_sglang_names_take_the_max_over_tensor_parallel_ranks() -> None:
    engine, s = series_between(
        SGLANG, dict(running=5, preempt=0, gen=0, prompt=0), dict(running=8, preempt=1, gen=50, prompt=500)
    )
    assert engine == "sglang"
    assert s["requests_running"] == 8  # tp ranks 0 and 1 report the same batch: not 16
    assert s["requests_waiting"] == 2
    assert s["kv_cache_usage"] == pytest.approx(0.25)
    assert s["prefix_cache_hit_rate"] == pytest.approx(0.6)
    assert s["preemptions"] == 1
    assert s["generation_tokens_per_s"] == pytest.approx(25.0)


def test_trtllm_names() -> None:
    engine, s = series_between(
        TRTLLM,
        dict(running=3, hits=10, misses=10, gen=0, prompt=0),
        dict(running=3, hits=40, misses=20, gen=80, prompt=800),
    )
    assert engine == "trtllm"
    assert s["requests_running"] == 3  # rank 0 and rank 1 are one instance
    assert s["kv_cache_usage"] == pytest.approx(0.75)
    assert s["prefix_cache_hit_rate"] == pytest.approx(0.75)  # 30 reused of 40 blocks
    assert s["prompt_tokens_per_s"] == pytest.approx(400.0)
    assert "preemptions" not in s  # TensorRT-LLM has no such counter: absent, not zero


def test_dynamo_names() -> None:
    engine, s = series_between(
        DYNAMO, dict(running=2, hits=0, prompt=0, gen=0), dict(running=9, hits=100, prompt=400, gen=60)
    )
    assert engine == "dynamo"
    assert s["requests_running"] == 9
    assert s["requests_waiting"] == 4
    assert s["kv_cache_usage"] == pytest.approx(0.5)
    assert s["generation_tokens_per_s"] == pytest.approx(30.0)
    assert s["prompt_tokens_per_s"] == pytest.approx(200.0)


def test_detection_and_unrelated_metrics() -> None:
    assert detect_engine("# HELP x\nprocess_cpu_seconds_total 3\n") == "unknown"
    scrape = parse("process_cpu_seconds_total 3\nhttp_requests_total 4\n")
    assert scrape.total == {}  # only the mapped names are kept


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""
    status = 404

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_404():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_no_metrics_endpoint_gives_a_note_and_no_telemetry(http_404: str) -> None:
    poller = TelemetryPoller([http_404 + "/metrics"], interval_s=0.2).start()
    poller._thread.join(timeout=10)  # gives up by itself: 404 on /metrics and /prometheus/metrics
    doc: dict = {"notes": []}
    attach(doc, poller)
    assert "telemetry" not in doc
    assert len(doc["notes"]) == 1 and "HTTP 404" in doc["notes"][0]


def test_run_against_the_embedded_engine_records_telemetry(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        input_tokens={"dist": "fixed", "value": 512},
        output_tokens={"dist": "uniform", "min": 64, "max": 128},
        load={"concurrency": 12},
    )
    out = tmp_path / "run"
    r = run_cli(
        ["run", "--profile", str(prof), "--duration", "6", "--engine-speedup", "4", "--out", str(out)]
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "run.json").read_text())
    tele = doc["telemetry"]
    assert tele["engine"] == "loadtest-sim" and tele["url"].endswith("/metrics")
    assert tele["interval_s"] == 1.0
    n = len(tele["t"])
    assert 4 <= n <= 9  # about one point per second of a 6 s run (plus the drain)
    assert tele["t"] == sorted(tele["t"])
    series = tele["series"]
    assert set(series) >= {
        "requests_running",
        "requests_waiting",
        "kv_cache_usage",
        "generation_tokens_per_s",
    }
    assert all(len(v) == n for v in series.values())
    assert max(series["requests_running"]) > 0
    assert all(0.0 <= u <= 1.0 for u in series["kv_cache_usage"])
    assert max(series["kv_cache_usage"]) > 0
    assert sum(series["generation_tokens_per_s"]) > 0


def test_server_info_recorded_and_no_telemetry_flag(tmp_path: Path, small_profile: Path) -> None:
    info = tmp_path / "server.json"
    info.write_text(
        json.dumps(
            {
                "engine": "vllm",
                "version": "0.11.0",
                "preset": "llama-3.1-8b",
                "url": "http://127.0.0.1:1",
                "launcher_pid": 1,
                "processes": [{"name": "server", "role": "server", "argv": ["vllm", "serve", "m"], "pid": 7}],
            }
        )
    )
    out = tmp_path / "run"
    with SimProcess(speedup=5) as sim:
        r = run_cli(
            ["run", "--profile", str(small_profile), "--host", sim.base_url, "--duration", "2",
             "--server-info", str(info), "--no-telemetry", "--out", str(out)]
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "run.json").read_text())
    assert "telemetry" not in doc
    server = doc["endpoint"]["server"]
    assert server["engine"] == "vllm" and server["version"] == "0.11.0"
    assert server["processes"] == [
        {"name": "server", "role": "server", "argv": ["vllm", "serve", "m"], "env": None}
    ]
    bad = run_cli(["run", "--profile", str(small_profile), "--host", "http://127.0.0.1:9", "--server-info",
                   str(tmp_path / "missing.json"), "--out", str(tmp_path / "r2")])  # fmt: skip
    assert bad.returncode == 2 and "--server-info" in bad.stderr and "missing.json" in bad.stderr


def test_metrics_urls_for_a_base_url_with_v1_and_for_replicas() -> None:
    assert metrics_urls("http://h:8000/v1/", None, None) == ["http://h:8000/metrics"]
    assert metrics_urls(["http://a:1", "http://b:2/v1"], None, None) == [
        "http://a:1/metrics",
        "http://b:2/metrics",
    ]
    assert metrics_urls("http://h:8000", "http://x/m, http://y/m", None) == ["http://x/m", "http://y/m"]


class _Replicas(http.server.BaseHTTPRequestHandler):
    """A router over ``replicas`` vLLM instances: each scrape is answered by the next one in turn, every
    instance's counters rising by its own step."""

    replicas = 2
    scrapes = 0

    def do_GET(self) -> None:  # noqa: N802
        cls = type(self)
        n, cls.scrapes = cls.scrapes, cls.scrapes + 1
        replica, round_ = n % cls.replicas, n // cls.replicas
        base = 100_000 * (replica + 1)  # the instances have counted different totals
        values = {"running": 2.0, "preempt": 0.0, "queries": base, "hits": base // 2}
        values |= {"gen": base + 500 * round_, "prompt": base + 900 * round_}
        body = VLLM.format(**values).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("replicas", [1, 2])
def test_instances_answering_in_turn_behind_one_url_are_named(replicas: int) -> None:
    handler = type("Handler", (_Replicas,), {"replicas": replicas, "scrapes": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        poller = TelemetryPoller([f"http://127.0.0.1:{server.server_address[1]}/metrics"], interval_s=0.1)
        poller.start()
        poller._stop.wait(1.5)
        doc: dict = {"notes": []}
        attach(doc, poller)
    finally:
        server.shutdown()
        server.server_close()
    assert handler.scrapes >= 8
    if replicas == 1:  # one instance: its counters only rise, nothing to say
        assert "mixed_instances" not in doc["telemetry"] and doc["notes"] == []
        return
    assert doc["telemetry"]["mixed_instances"] >= 4  # every other tick went backwards
    (note,) = doc["notes"]
    assert "several server instances answer behind it" in note and "--metrics-url once per replica" in note


def test_replicas_given_one_metrics_url_each_are_shown_side_by_side(tmp_path: Path) -> None:
    """Two embedded engines as replicas, conversations kept on one replica (--balance session), each
    replica's /metrics given: run.json telemetry.replicas has each one's own requests, output tokens and
    prefix-cache hits, equal to that engine's truth, and the report shows them in one table."""
    prof = write_profile(
        tmp_path / "mt.yaml",
        kind="multi_turn",
        input_tokens={"dist": "fixed", "value": 64},
        output_tokens={"dist": "fixed", "value": 8},
        session={"turns": {"dist": "fixed", "value": 3}, "think_time_s": {"dist": "fixed", "value": 0.0}},
        load={"concurrency": 4},
        duration_s=3,
    )
    out = tmp_path / "run"
    sims = [SimProcess(speedup=20, seed=i) for i in range(2)]
    try:
        for s in sims:
            s.start()
        metrics = ",".join(s.base_url + "/metrics" for s in sims)
        args = ["run", "--profile", str(prof), "--balance", "session"]
        for s in sims:
            args += ["--host", s.base_url]
        res = run_cli([*args, "--metrics-url", metrics, "--out", str(out)], timeout=120)
        truths = [s.truth() for s in sims]
    finally:
        for s in sims:
            s.stop()
    assert res.returncode in (0, 10), res.stderr[-3000:]
    doc = json.loads((out / "run.json").read_text())
    replicas = doc["telemetry"]["replicas"]
    assert [r["url"] for r in replicas] == metrics.split(",")
    for rep, truth in zip(replicas, truths, strict=True):
        done = [t for t in truth if t["outcome"] == "ok"]
        # the first poll may come after the load's first answers and the last before its last ones:
        # at most the 4 requests in flight then are outside the replica's own count
        assert len(done) > 20 and len(done) - 8 <= rep["requests"] <= len(done), (rep, len(done))
        generated = rep["generation_tokens_per_s"] * rep["seconds"]
        assert generated == pytest.approx(sum(t["completion_tokens"] for t in done), rel=0.03)
        hits = sum(t["cached_tokens"] for t in done)
        assert hits > 0 and rep["prefix_cache_hit_tokens"] == pytest.approx(hits, rel=0.03)  # history reused
        queried = sum(t["prompt_tokens"] for t in done)
        assert rep["prefix_cache_queried_tokens"] == pytest.approx(queried, rel=0.03)
        assert rep["prefix_cache_hit_rate"] == pytest.approx(hits / queried, abs=0.02)
        assert 0 <= rep["kv_cache_usage_max"] <= 1 and rep["requests_running_mean"] is not None
    assert sum(r["requests"] for r in replicas) <= doc["metrics"]["requests"]["ok"] + 1  # + the preflight
    html = (out / "report.html").read_text()
    table = html[html.index('id="replica-table"') :]
    table = table[: table.index("</table>")]
    assert all(s.base_url in table for s in sims) and "prefix-cache hit rate" in table
    console = res.stdout[res.stdout.index("Replicas (each one's own /metrics)") :]
    for rep in replicas:
        assert f"{rep['url']}: {rep['requests']:,} requests" in console


def test_one_metrics_url_has_no_replica_view(tmp_path: Path) -> None:
    poller = TelemetryPoller(["http://127.0.0.1:9/metrics"], interval_s=0.1)
    assert poller.replicas() == []
