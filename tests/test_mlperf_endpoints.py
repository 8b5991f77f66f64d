"""`loadtest sweep --mlperf-endpoints`: an MLPerf Endpoints v1.0 submission tree that mlperf-viz 2.0.0 loads and shows."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from loadtest.contracts.sweep_document import SweepDocument, SweepPoint
from loadtest.sweep import load_sweep
from loadtest.sweep.submission import POINT_FILES
from tests.browser import ARTIFACTS, CHROMIUM, open_url
from tests.conftest import run_cli

viz_bundle = pytest.importorskip("mlperf_endpoints_visualizer.bundle")
VIZ = [sys.executable, "-m", "mlperf_endpoints_visualizer.cli"]
LADDER = (1, 4, 16)
DATA = Path(__file__).parent / "data" / "submission"
CURVE = Path("results") / "loadtest-sim-h100" / "llama3_1-8b"
# The reference client's Report fields (inference_endpoint.metrics.report.Report, docs/sources.md §2)
REPORT_KEYS = {
    "version", "git_sha", "test_started_at", "n_samples_issued", "n_samples_completed", "n_samples_failed",
    "duration_ns", "state", "complete", "ttft", "tpot", "latency", "output_sequence_lengths",
    "input_sequence_lengths", "legacy_loadgen_window_duration_ns", "qps", "tps", "finish_reason_counts",
    "run_config",
}  # fmt: skip
STAT_KEYS = {"total", "min", "max", "median", "avg", "std_dev", "percentiles", "histogram"}
GRID = ["99.9", "99.0", "97.0", "95.0", "90.0", "80.0", "75.0", "50.0", "25.0", "10.0", "5.0", "1.0"]


@pytest.fixture(scope="module")
def submission(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A concurrency sweep of mlperf-llama3.1-8b-server (smoke) on the embedded engine, with its tree."""
    base = tmp_path_factory.mktemp("endpoints")
    endpoint = base / "endpoint.yaml"  # the complete v1.0 declaration (C_max 64)
    endpoint.write_bytes((DATA / "endpoint.yaml").read_bytes())
    sweep, tree = base / "sweep", base / "tree"
    r = run_cli(
        ["sweep", "--profile", "mlperf-llama3.1-8b-server", "--smoke", "--ladder", "concurrency", "--points"]
        + [
            ",".join(map(str, LADDER)),
            "--point-duration",
            "2",
            "--engine-speedup",
            "10",
            "--offline-concurrency",
        ]
        + ["32", "--seed-set", f"{DATA / 'seedset.yaml'}:2026-10-C1:A", "--endpoint-file", str(endpoint)]
        + ["--mlperf-endpoints", str(tree), "--out", str(sweep)],
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "mlperf endpoints: " in r.stdout
    return sweep, tree


def _written(doc: SweepDocument) -> list[SweepPoint]:
    """The points the bundle holds: the ladder, and the offline run when it stands as a dedicated one."""
    return [p for p in doc.points if not p.offline or doc.offline == "dedicated"]


def test_the_tree_has_every_point_and_its_figures(submission: tuple[Path, Path]) -> None:
    sweep, tree = submission
    doc = load_sweep(sweep)
    curve = tree / CURVE
    assert sorted(p.name for p in curve.iterdir()) == sorted(f"r{p.concurrency}" for p in _written(doc))
    for p in _written(doc):
        folder = curve / f"r{p.concurrency}"
        files = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
        assert files == sorted(POINT_FILES)
        summary = json.loads((folder / "result_summary.json").read_text())
        run = json.loads((sweep / p.dir / "run.json").read_text())
        assert summary["metric_convention"] == "endpoints"
        assert set(summary) >= REPORT_KEYS, REPORT_KEYS - set(summary)
        assert summary["system_tps"] == summary["tps"] and summary["tps"] > 0
        for block in ("ttft", "tpot", "latency"):
            stats = summary[block]
            assert list(stats["percentiles"]) == GRID and set(stats) >= STAT_KEYS
            # method lower: every percentile is one of the samples, ordered by the grid
            values = list(stats["percentiles"].values())
            assert (
                values == sorted(values, reverse=True)
                and stats["min"] <= values[-1] <= values[0] <= stats["max"]
            )
        assert summary["tps_per_user"] == pytest.approx(1e9 / summary["tpot"]["percentiles"]["90.0"])
        assert summary["n_samples_issued"] >= summary["n_samples_completed"] > 0
        # the Endpoints count is not the server's usage: both kept, the disagreement in run.json
        assert run["tokens"]["endpoints"]["answers_with_usage"] == run["metrics"]["tokens"]["usage_reports"]
        point = yaml.safe_load((folder / "point.yaml").read_text())
        assert point["concurrency"] == p.concurrency and point["runtime_settings"]["load_pattern"] == (
            "offline" if p.offline else "concurrency"
        )
        system = json.loads((folder / "system_desc.json").read_text())
        assert system["system_name"] == "loadtest-sim-h100" and system["submitter_org_names"] == "Example Org"
        assert (
            system["node_types"][0]["accelerator_info"][0]["accelerator_model_name"] == "NVIDIA H100-SXM-80GB"
        )
        # no --accuracy: no accuracy file (the checker refuses an empty one; tests/test_submission_checker.py)
        assert not (folder / "accuracy_results.json").exists()


def test_mlperf_viz_loads_it_without_warnings(submission: tuple[Path, Path], tmp_path: Path) -> None:
    sweep, tree = submission
    out = tmp_path / "bundle.json"
    r = subprocess.run(
        [*VIZ, str(tree), "--strict", "--export", str(out)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    doc = load_sweep(sweep)
    n = len(_written(doc))
    assert "warning" not in r.stderr and f"Found 1 submission(s) and {n} run(s)" in r.stdout
    bundle = json.loads(out.read_text())
    assert bundle["warnings"] == []
    runs = {run["label"]: run["run"] for run in bundle["runs"]}
    for p in _written(doc):
        derived = runs[f"r{p.concurrency}"]["derived_fields"]
        summary = json.loads((tree / CURVE / f"r{p.concurrency}" / "result_summary.json").read_text())
        assert (
            derived["system_tps"] == summary["system_tps"]
            and derived["tps_per_user"] == summary["tps_per_user"]
        )
        assert derived["ttft"] == pytest.approx(summary["ttft"]["percentiles"]["90.0"] / 1e6, abs=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium")
def test_mlperf_viz_page_shows_our_points(submission: tuple[Path, Path], tmp_path: Path) -> None:
    _, tree = submission
    port = _free_port()
    server = subprocess.Popen(
        [*VIZ, str(tree), "--no-browser", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        shot = ARTIFACTS / "mlperf_viz_submission.png"
        page = open_url(
            f"http://127.0.0.1:{port}/",
            shot,
            tmp_path / "chromium",
            ready="document.body.innerText.includes('loadtest-sim-h100') && document.querySelectorAll('svg circle').length >= 3",
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert page["ready"], page["text"][:2000]
    assert any(u.endswith("/cli-data.json") for u in page["requests"])
    assert "Example Org" in page["text"] and "Llama 3.1 8B" in page["text"]
    assert "System Throughput" in page["text"] and not page["errors"], page["errors"]
    assert shot.stat().st_size > 20_000


def test_report_writes_the_same_tree_from_a_finished_sweep(
    submission: tuple[Path, Path], tmp_path: Path
) -> None:
    sweep, tree = submission
    endpoint = tree.parent / "endpoint.yaml"
    again = tmp_path / "again"
    r = run_cli(["report", str(sweep), "--mlperf-endpoints", str(again), "--endpoint-file", str(endpoint)])
    assert r.returncode == 0, r.stderr
    first = sorted(p.relative_to(tree) for p in (tree / "results").rglob("*") if p.is_file())
    second = sorted(p.relative_to(again) for p in (again / "results").rglob("*") if p.is_file())
    assert first == second and len(first) == len(_written(load_sweep(sweep))) * len(POINT_FILES) + 1
    for rel in first:
        assert (tree / rel).read_bytes() == (again / rel).read_bytes(), rel
    r = run_cli(["report", str(sweep), "--mlperf-endpoints", str(again)])
    assert r.returncode == 2 and "already holds results/" in r.stderr
    r = run_cli(["report", str(sweep), "--mlperf-endpoints", str(tmp_path / "undeclared")])
    assert (
        r.returncode == 2 and "system.division" in r.stderr and "--seed-set" not in r.stderr
    )  # the runs have one
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "undeclared" / "results").exists()
    point = next(p for p in (sweep / "points").iterdir() if p.is_dir())
    r = run_cli(["report", str(point), "--mlperf-endpoints", str(tmp_path / "x")])
    assert r.returncode == 2 and "needs a sweep folder" in r.stderr
