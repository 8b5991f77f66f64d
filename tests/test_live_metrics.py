"""The run's live Prometheus metrics, scraped during real runs by the project's own telemetry parser, and
NVIDIA dcgm-exporter's GPU gauges polled into run.json with the energy per output token."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from loadtest.telemetry.scrape import Scrape, ScrapeError, fetch, parse
from tests.conftest import CLI, write_profile


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape_while(proc: subprocess.Popen, url: str) -> tuple[list[Scrape], Scrape | None, str]:
    """Scrapes while the load runs (the run not finished), and the first one with the final figures
    (parsed, and its text: the run may end right after that scrape)."""
    during: list[Scrape] = []
    deadline = time.monotonic() + 90
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            text = fetch(url, 2.0)
        except ScrapeError:
            time.sleep(0.1)
            continue
        got = parse(text)
        if got.total.get("loadtest_run_finished") == 1.0:
            return during, got, text
        if got.total.get("loadtest_requests_total"):
            during.append(got)
        time.sleep(0.2)
    return during, None, ""


@pytest.mark.parametrize("processes", [1, 2])
def test_live_metrics_scraped_during_the_run_add_up_to_run_json(tmp_path: Path, processes: int) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"rate": 12.0}, duration_s=4)
    port, out = _free_port(), tmp_path / "run"
    args = ["run", "--profile", str(prof), "--out", str(out), "--processes", str(processes)]
    args += ["--prometheus-port", str(port), "--prometheus-hold", "30", "--slo", "ttft_p99=5s"]
    args += ["--generator-health", "warn", "--progress", "0"]
    proc = subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        during, final, _ = _scrape_while(proc, f"http://127.0.0.1:{port}/metrics")
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 11), output  # 11: too short to prove the SLO, not this test's subject
    assert f"live metrics (Prometheus): http://127.0.0.1:{port}/metrics" in output
    assert final is not None, output
    assert final.engine == "loadtest"  # the parser knows the exporter's names
    run = json.loads((out / "run.json").read_text())
    m = run["metrics"]
    # Watched live: the counts grew while the load ran, and stayed below the final ones.
    assert len(during) >= 2, len(during)
    counts = [s.total["loadtest_requests_total"] for s in during]
    assert counts == sorted(counts) and 0 < counts[0] < m["requests"]["completed"]
    # At the end, the exporter's figures are run.json's.
    assert final.total["loadtest_requests_total"] == m["requests"]["completed"] > 0
    assert final.total["loadtest_output_tokens_total"] == m["tokens"]["output_total"]
    assert final.total["loadtest_input_tokens_total"] == m["tokens"]["input_total"]
    assert final.total["loadtest_requests_in_flight"] == 0
    for metric in ("ttft", "itl", "tpot", "e2e"):
        buckets = final.buckets[f"loadtest_{metric}_seconds"]
        assert buckets[float("inf")] == m["latency_ms"][metric]["count"], metric
        assert list(buckets.values()) == sorted(buckets.values()), metric  # cumulative
        # the median lies in the bucket the histogram puts it in
        p50 = m["latency_ms"][metric]["p50"] / 1000
        below = max((le for le in buckets if le < p50 * 0.99), default=None)
        above = min(le for le in buckets if le >= p50 * 1.01)
        half = buckets[float("inf")] / 2
        assert (below is None or buckets[below] <= half) and buckets[above] >= half, (metric, p50, buckets)
    judged = final.total["loadtest_slo_judged_total"]
    assert judged == m["requests"]["completed"]
    assert final.total["loadtest_slo_attainment"] == pytest.approx(
        final.total["loadtest_slo_good_total"] / judged
    )


DCGM_PAGE = """\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 1980
DCGM_FI_DEV_SM_CLOCK{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 1700
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 90
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 1
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 70000
DCGM_FI_DEV_FB_USED{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 1000
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} {p0}
DCGM_FI_DEV_POWER_USAGE{{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}} 100.0
"""


class _FakeDcgm(BaseHTTPRequestHandler):
    """dcgm-exporter's /metrics with two GPUs; GPU 0's power alternates 500 W / 700 W per scrape."""

    scrapes = 0
    auth_seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.headers.get("Authorization"):
            _FakeDcgm.auth_seen.append(self.headers["Authorization"])
        _FakeDcgm.scrapes += 1
        body = DCGM_PAGE.format(p0=500.0 if _FakeDcgm.scrapes % 2 else 700.0).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_dcgm_exporter_gauges_become_gpu_series_and_energy_per_output_token(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeDcgm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        prof = write_profile(tmp_path / "p.yaml", load={"rate": 10.0}, duration_s=4)
        out = tmp_path / "run"
        key = tmp_path / "key"
        key.write_text("sk-live-metrics-test-key")
        args = ["run", "--profile", str(prof), "--out", str(out), "--api-key-file", str(key)]
        args += ["--dcgm-url", f"http://127.0.0.1:{server.server_port}/metrics", "--generator-health", "warn"]
        done = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads((out / "run.json").read_text())
    tel = run["telemetry"]
    series = tel["series"]
    assert tel["engine"] == "loadtest-sim"  # the engine's names still lead; the GPUs' come with them
    assert set(series) >= {"gpu_utilization", "gpu_power_w", "gpu_memory_used_mib", "gpu_sm_clock_mhz"}
    assert len(series["gpu_power_w"]) >= 2
    assert {v for v in series["gpu_utilization"] if v is not None} == {0.455}  # (90 % + 1 %) / 2
    assert {v for v in series["gpu_memory_used_mib"] if v is not None} == {71000.0}  # summed
    assert {v for v in series["gpu_sm_clock_mhz"] if v is not None} == {1840.0}  # averaged
    assert {v for v in series["gpu_power_w"] if v is not None} <= {600.0, 800.0}  # summed, per poll
    energy = tel["energy"]
    m = run["metrics"]
    power = [v for v in series["gpu_power_w"] if v is not None]
    assert energy["power_w_mean"] == pytest.approx(sum(power) / len(power), abs=1e-3)
    assert energy["output_tokens"] == m["tokens"]["counted_output_total"] > 0
    assert energy["j_per_output_token"] == pytest.approx(
        energy["power_w_mean"] * m["window"]["duration_s"] / energy["output_tokens"], rel=1e-3
    )
    assert energy["output_tokens_per_s_per_w"] == pytest.approx(
        m["throughput"]["output_tokens_per_s"] / energy["power_w_mean"], rel=1e-3
    )
    # the run report shows them (its Energy section: this run has no hardware given)
    html = (out / "report.html").read_text()
    assert (
        "Energy per output token" in html and f"{energy['j_per_output_token']:,.4f} J / output token" in html
    )
    assert "GPU utilization (dcgm-exporter)" in html and "GPU power (dcgm-exporter)" in html  # charted
    # the endpoint's API key never went to the GPU exporter
    assert _FakeDcgm.scrapes >= 2 and _FakeDcgm.auth_seen == []


@pytest.mark.parametrize("processes", [1, 2])
def test_live_metrics_split_by_endpoint_match_each_engine_and_run_json(
    tmp_path: Path, processes: int
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from loadtest.sim import SimProcess

    prof = write_profile(tmp_path / "p.yaml", load={"rate": 12.0}, duration_s=3)
    port, out = _free_port(), tmp_path / "run"
    with SimProcess(speedup=4) as a, SimProcess(speedup=4) as b:
        args = ["run", "--profile", str(prof), "--out", str(out), "--host", a.base_url, "--host", b.base_url]
        args += ["--processes", str(processes)]
        args += ["--prometheus-port", str(port), "--prometheus-hold", "30", "--generator-health", "warn"]
        proc = subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            _, final, text = _scrape_while(proc, f"http://127.0.0.1:{port}/metrics")
            output, _ = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        received = {a.base_url: a.stats()["requests_received"], b.base_url: b.stats()["requests_received"]}
    assert proc.returncode == 0, output
    assert final is not None, output
    by_endpoint: dict[str, float] = {}
    ttft_count: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "loadtest_requests_total":
                by_endpoint[s.labels["endpoint"]] = by_endpoint.get(s.labels["endpoint"], 0) + s.value
            if s.name == "loadtest_ttft_seconds_count":
                ttft_count[s.labels["endpoint"]] = s.value
    run = json.loads((out / "run.json").read_text())
    rows = {r["url"]: r for r in run["metrics"]["per_endpoint"]["endpoints"]}
    assert set(by_endpoint) == set(rows) == set(received)
    for url, row in rows.items():
        # each endpoint's live count is what that engine received and what run.json says it got
        assert by_endpoint[url] == row["requests"] == received[url] > 0, url
        assert ttft_count[url] == row["ok"], url
    assert sum(by_endpoint.values()) == run["metrics"]["requests"]["completed"]


def test_a_taken_live_metrics_port_is_one_clear_error_line(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", duration_s=2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["run", "--profile", str(prof), "--out", str(tmp_path / "run"), "--prometheus-port", str(port)]
        done = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"loadtest: error: cannot serve live metrics on 127.0.0.1:{port}: Address already in use "
        "(--prometheus-port: another port, or 0 for a free one)"
    )
    assert "Traceback" not in done.stderr
