"""The live metrics pushed over OTLP/HTTP during real runs against the embedded engine: a receiver on
loopback decodes each ``ExportMetricsServiceRequest`` with opentelemetry-proto; the last push equals
run.json; a collector that is down or refuses never fails the run."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from loadtest.locust.otlp_push import resolve_endpoint
from loadtest.locust.prometheus import REQUEST_BUCKETS, TOKEN_BUCKETS
from tests.conftest import CLI, write_profile

pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2  # noqa: E402

API_KEY = "sk-otlp-test-key-4c2e"
ENV_SECRET = "otlp-env-secret-9a1f"
TENANT = "fleet-tenant-5b0d"  # a --otlp-header value: sent, never written down


@dataclass
class Push:
    at: float
    path: str
    headers: dict[str, str]
    body: bytes
    request: ExportMetricsServiceRequest


class Collector:
    """An OTLP/HTTP receiver on loopback: every POST kept (raw bytes and decoded), answered ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.pushes: list[Push] = []
        pushes, answer = self.pushes, status

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = ExportMetricsServiceRequest.FromString(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                pushes.append(Push(time.monotonic(), self.path, headers, body, req))
                out = ExportMetricsServiceResponse().SerializeToString() if answer == 200 else b"no"
                self.send_response(answer)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _metrics(req: ExportMetricsServiceRequest) -> dict[str, metrics_pb2.Metric]:
    (rm,) = req.resource_metrics
    (sm,) = rm.scope_metrics
    return {m.name: m for m in sm.metrics}


def _attrs(kvs: Any) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in kvs}


def _value(p: Any) -> float:
    return p.as_int if p.WhichOneof("value") == "as_int" else p.as_double


def _gauge(req: ExportMetricsServiceRequest, name: str) -> float:
    (p,) = _metrics(req)[name].gauge.data_points
    return _value(p)


def _sum_by(req: ExportMetricsServiceRequest, name: str, key: str | None = None) -> dict[str, float]:
    out: dict[str, float] = {}
    metric = _metrics(req).get(name)
    for p in metric.sum.data_points if metric is not None else ():
        k = _attrs(p.attributes)[key] if key else ""
        out[k] = out.get(k, 0) + _value(p)
    return out


def _run(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None, duration_s: float = 3
) -> tuple[int, str, Path]:
    prof = write_profile(tmp_path / "p.yaml", load={"rate": 12.0}, duration_s=duration_s)
    out, key = tmp_path / "run", tmp_path / "key"
    key.write_text(API_KEY)
    args = ["run", "--profile", str(prof), "--out", str(out), "--api-key-file", str(key)]
    args += ["--generator-health", "warn", "--progress", "0", *extra]
    done = subprocess.run(
        CLI + args, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )
    return done.returncode, done.stdout + done.stderr, out


@pytest.mark.parametrize("processes", [1, 2])
def test_otlp_pushes_during_the_run_and_the_last_equals_run_json(tmp_path: Path, processes: int) -> None:
    collector = Collector()
    args = ["--processes", str(processes), "--engine-faults", "http_503=10%", "--slo", "error_rate=60%"]
    args += ["--otlp-endpoint", collector.url, "--otlp-interval", "0.5"]
    args += ["--otlp-header", f"x-scope-orgid={TENANT}"]
    try:
        rc, output, out = _run(
            tmp_path,
            *args,
            env={"OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {ENV_SECRET}"},
            duration_s=4,  # a master's figures move with its workers' reports, every 3 s
        )
    finally:
        collector.close()
    assert rc in (0, 11), output  # 11: too short to prove a percentile, not this test's subject
    assert f"live metrics (OTLP push): {collector.url}/v1/metrics every 0.5s" in output
    pushes = collector.pushes
    assert pushes and all(p.path == "/v1/metrics" for p in pushes)
    assert all(p.headers["content-type"] == "application/x-protobuf" for p in pushes)
    # the command line's header and the standard variable's both went with every push
    assert all(p.headers.get("x-scope-orgid") == TENANT for p in pushes)
    assert all(p.headers.get("authorization") == f"Bearer {ENV_SECRET}" for p in pushes)
    run = json.loads((out / "run.json").read_text())
    m = run["metrics"]

    # Watched live: more than one push while the load ran, the counts growing, below the final ones.
    during = [p.request for p in pushes if _gauge(p.request, "loadtest_run_finished") == 0]
    counts = [sum(_sum_by(r, "loadtest_requests_total").values()) for r in during]
    counts = [c for c in counts if c > 0]
    assert len(counts) >= 2, counts
    assert counts == sorted(counts) and 0 < counts[0] < m["requests"]["completed"]

    # The last push has the final figures: run.json's.
    last = pushes[-1].request
    assert _gauge(last, "loadtest_run_finished") == 1 and _gauge(last, "loadtest_requests_in_flight") == 0
    by_outcome = _sum_by(last, "loadtest_requests_total", "outcome")
    assert by_outcome == {k: v for k, v in m["requests"]["by_outcome"].items() if v}
    assert by_outcome.get("http_5xx", 0) > 0 and by_outcome["ok"] > 0  # the faults made two outcomes
    assert sum(by_outcome.values()) == m["requests"]["completed"]
    assert _sum_by(last, "loadtest_output_tokens_total") == {"": m["tokens"]["output_total"]}
    assert _sum_by(last, "loadtest_input_tokens_total") == {"": m["tokens"]["input_total"]}
    metrics = _metrics(last)
    cumulative = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert metrics["loadtest_requests_total"].sum.is_monotonic
    assert metrics["loadtest_requests_total"].sum.aggregation_temporality == cumulative
    for name, bounds in (("ttft", REQUEST_BUCKETS), ("e2e", REQUEST_BUCKETS), ("itl", TOKEN_BUCKETS)):
        hist = metrics[f"loadtest_{name}_seconds"]
        assert hist.unit == "s" and hist.histogram.aggregation_temporality == cumulative
        (point,) = hist.histogram.data_points
        assert list(point.explicit_bounds) == list(bounds)  # the Prometheus buckets
        assert len(point.bucket_counts) == len(bounds) + 1
        assert point.count == sum(point.bucket_counts) == m["latency_ms"][name]["count"] > 0, name
        # the median's bucket holds the half-way count
        p50 = m["latency_ms"][name]["p50"] / 1000
        cum, upto = 0, {}
        for b, c in zip(bounds, point.bucket_counts, strict=False):
            cum += c
            upto[b] = cum
        above = min(b for b in bounds if b >= p50 * 1.01)
        below = max((b for b in bounds if b < p50 * 0.99), default=None)
        assert upto[above] >= point.count / 2 and (below is None or upto[below] <= point.count / 2), name
    # cumulative series: one start time for every push, each push later than the one before
    starts = {p.start_time_unix_nano for r in (x.request for x in pushes) for p in _points(r)}
    assert len(starts) == 1
    times = [_metrics(p.request)["loadtest_run_finished"].gauge.data_points[0].time_unix_nano for p in pushes]
    assert times == sorted(times)
    (rm,) = last.resource_metrics
    resource = _attrs(rm.resource.attributes)
    assert resource["service.name"] == "loadtest"
    assert resource["loadtest.run_id"] == run["run_id"]
    assert resource["loadtest.profile"] == "test-chat"
    assert not any("OTLP" in n for n in run["notes"])  # every push went through: nothing to say
    # secrets: the endpoint's API key never in a push; neither it nor the collector's token written down
    assert all(API_KEY.encode() not in p.body for p in pushes)
    for f in out.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert all(secret.encode() not in data for secret in (API_KEY, ENV_SECRET, TENANT)), f
    assert ENV_SECRET not in output and API_KEY not in output and TENANT not in output


def _points(req: ExportMetricsServiceRequest) -> list[Any]:
    """The points of the cumulative metrics (sums and histograms)."""
    out: list[Any] = []
    for m in _metrics(req).values():
        kind = m.WhichOneof("data")
        if kind in ("sum", "histogram"):
            out += list(getattr(m, kind).data_points)
    return out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _failed_of(note: str) -> tuple[int, int]:
    """The run note's "F of N pushes failed" as (F, N)."""
    counts = re.search(r": (\d+) of (\d+) pushes failed ", note)
    assert counts is not None, note
    return int(counts[1]), int(counts[2])


@pytest.mark.parametrize("collector_state", ["down", "refusing"])
def test_a_collector_that_is_down_or_refuses_leaves_the_run_passing(
    tmp_path: Path, collector_state: str
) -> None:
    collector = Collector(status=401) if collector_state == "refusing" else None
    url = collector.url if collector else f"http://127.0.0.1:{_closed_port()}"
    try:
        if collector:  # --otlp alone: the collector named by the standard variable
            env = {"OTEL_EXPORTER_OTLP_ENDPOINT": url + "/"}
            rc, output, out = _run(tmp_path, "--otlp", "--otlp-interval", "0.5", env=env)
        else:
            rc, output, out = _run(tmp_path, "--otlp-endpoint", url, "--otlp-interval", "0.5")
    finally:
        if collector:
            collector.close()
    assert rc == 0, output
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "completed" and run["metrics"]["requests"]["ok"] > 0
    # one warning, whatever the number of pushes; no traceback, no exporter line of its own
    warnings = [ln for ln in output.splitlines() if f"OTLP push to {url}/v1/metrics failed" in ln]
    assert len(warnings) == 1, output
    reason = "HTTP 401" if collector else "connection refused"
    assert reason in warnings[0], warnings
    assert "Traceback" not in output and "Failed to export" not in output
    (note,) = [n for n in run["notes"] if n.startswith("OTLP push")]
    assert note.startswith(f"OTLP push to {url}/v1/metrics: ") and f"(first: {reason}" in note
    failed, pushes = _failed_of(note)
    assert failed == pushes >= 2, note  # every push failed, and the run still pushed each interval
    if collector:  # each one reached the refusing collector, but perhaps the one cut short at the end
        assert len(collector.pushes) <= pushes <= len(collector.pushes) + 1, note


def test_without_the_otlp_extra_the_option_says_what_to_install(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", duration_s=1)
    hide = "import sys; sys.modules['opentelemetry.exporter.otlp.proto.http.metric_exporter'] = None; "
    run = "from loadtest.cli.main import main; sys.exit(main(sys.argv[1:]))"
    args = ["run", "--profile", str(prof), "--out", str(tmp_path / "run"), "--otlp-endpoint", "http://x:4318"]
    done = subprocess.run(
        [sys.executable, "-c", hide + run, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("loadtest: error: --otlp-endpoint/--otlp need the OpenTelemetry OTLP exporter")
    assert last.endswith("pip install 'loadtest[otlp]'")


def test_the_endpoint_follows_the_command_line_then_the_standard_variables() -> None:
    signal, base = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
    both = {signal: "http://sig:4318/custom/path", base: "http://base:4318/"}
    assert resolve_endpoint("http://given:4318", both) == "http://given:4318/v1/metrics"
    assert resolve_endpoint("http://given:4318/otlp/v1/metrics", both) == "http://given:4318/otlp/v1/metrics"
    assert resolve_endpoint(None, both) == "http://sig:4318/custom/path"  # the signal's own: as it is
    assert resolve_endpoint(None, {base: "http://base:4318/"}) == "http://base:4318/v1/metrics"
    assert resolve_endpoint(None, {}) == "http://localhost:4318/v1/metrics"


def test_a_master_pushes_its_workers_merged_figures_and_notes_the_refused_pushes(tmp_path: Path) -> None:
    from loadtest.sim import SimProcess

    prof = write_profile(tmp_path / "p.yaml", load={"rate": 12.0}, duration_s=4)
    out, port = tmp_path / "run", _closed_port()
    collector = Collector(status=401)  # it reads every push, and takes none
    with SimProcess(speedup=4) as sim:
        master_args = ["master", "--profile", str(prof), "--host", sim.base_url, "--expect-workers", "1"]
        master_args += ["--master-port", str(port), "--out", str(out), "--generator-health", "warn"]
        master_args += ["--otlp-endpoint", collector.url, "--otlp-interval", "0.5", "--progress", "0"]
        master = subprocess.Popen(
            CLI + master_args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        worker_args = ["worker", "--master-port", str(port), "--out", str(tmp_path / "w")]
        worker = subprocess.Popen(CLI + worker_args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            output, _ = master.communicate(timeout=90)
            worker.wait(timeout=30)
        finally:
            for p in (master, worker):
                if p.poll() is None:
                    p.kill()
                    p.wait()
            collector.close()
    assert master.returncode == 0, output
    run = json.loads((out / "run.json").read_text())
    last = collector.pushes[-1].request
    assert _gauge(last, "loadtest_run_finished") == 1
    assert (
        sum(_sum_by(last, "loadtest_requests_total").values()) == run["metrics"]["requests"]["completed"] > 0
    )
    (note,) = [n for n in run["notes"] if n.startswith("OTLP push")]
    assert "pushes failed (first: HTTP 401" in note
    # every push counted as failed; the one under way at the end is cut short (the collector never
    # answers) and may not have reached the collector yet
    failed, pushes = _failed_of(note)
    assert failed == pushes and len(collector.pushes) <= pushes <= len(collector.pushes) + 1, note


def test_a_bad_otlp_endpoint_is_one_error_line_without_its_credentials(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", duration_s=1)
    url = "ftp://user:pw-7f1e@collector:4318/v1/metrics?token=tok-2b9c"
    args = ["run", "--profile", str(prof), "--out", str(tmp_path / "run"), "--otlp-endpoint", url]
    done = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "loadtest: error: --otlp-endpoint 'ftp://collector:4318/v1/metrics': not an http(s) URL"
    )
    assert "pw-7f1e" not in done.stdout + done.stderr and "tok-2b9c" not in done.stdout + done.stderr
