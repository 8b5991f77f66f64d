"""The official MLPerf Endpoints checker (endpoints-submission-cli 1.5.3.0's submission_checker) on a bundle from `loadtest sweep --mlperf-endpoints`, and the v1.0 point planner."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from loadtest.sweep import load_sweep
from loadtest.sweep.rules import BENCHMARKS, min_duration_s, plan_points, regions
from tests.conftest import run_cli

checker = pytest.importorskip("submission_checker.checker")
checker_regions = pytest.importorskip("submission_checker.models.regions")
checker_results = pytest.importorskip("submission_checker.models.aggregate.point_result")

CLI = [sys.executable, "-m", "endpoints_submission_cli"]
DATA = Path(__file__).parent / "data" / "submission"
ENDPOINT = DATA / "endpoint.yaml"
SEED_SET = f"{DATA / 'seedset.yaml'}:2026-10-C1:A"
LADDER = (1, 2, 4, 8, 16, 32, 64)  # the plan for C_max 64 (endpoint.yaml): every region covered, 7 points
# What a 2-second run cannot satisfy, and nothing else:
SHORT_RUN_RULES = {
    "point-duration",  # §6.2: 600 s (1,200 s above 32) per point
    "min-query-count",  # §6.4: 13,368 cnn_dailymail queries per point
    # §4.4: a reporting window spans ≥ 4 super-passes and §6.2's minimum duration; a 2 s point has
    # neither, so its steady-state status is insufficient_duration / insufficient_passes (a warning)
    "steady-state-basis",
    # §15: an accuracy run of the whole accuracy dataset (13,368 samples); the test's sample has 4, so
    # its total generated length (gen_len, summed over the samples) is far under the dataset's too
    "accuracy-sample-count",
    "accuracy-gate",
}
# The accuracy runs (--accuracy, after each mandatory point, the engine answering from the references)
# meet the targets on the mandatory points: no accuracy rule remains.
CNN_SAMPLE = Path(__file__).parent / "data" / "accuracy" / "cnn_eval_sample.json"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """One short `loadtest sweep --mlperf-endpoints` on the embedded engine: the sweep, the bundle, stdout."""
    base = tmp_path_factory.mktemp("bundle")
    sweep, tree = base / "sweep", base / "tree"
    # no --points: the ladder is the v1.0 plan's for the declared C_max (64), every point run
    args = ["sweep", "--profile", "mlperf-llama3.1-8b-server", "--smoke", "--point-duration", "2"]
    args += ["--engine-speedup", "10"]
    args += ["--offline-concurrency", "128", "--seed-set", SEED_SET, "--endpoint-file", str(ENDPOINT)]
    args += ["--accuracy", f"llama3.1-8b:{CNN_SAMPLE}", "--engine-reference"]
    r = run_cli([*args, "--mlperf-endpoints", str(tree), "--out", str(sweep)], timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return sweep, tree, r.stdout


def _findings(tree: Path) -> dict[str, list[str]]:
    """The checker's errors and warnings by rule id (its Python API: no network, no version check)."""
    report = checker.SubmissionChecker(tree).run()
    out: dict[str, list[str]] = {}
    for result in report.results:
        if result.severity.value != "info":
            out.setdefault(result.rule, []).append(f"{result.severity.value}: {result.message}")
    return out


def test_the_checker_fails_only_what_a_short_run_must(bundle: tuple[Path, Path, str]) -> None:
    _, tree, _ = bundle
    found = _findings(tree)
    assert set(found) == SHORT_RUN_RULES, json.dumps(found, indent=1)[:6000]
    assert all(m.startswith("warning") for m in found["point-duration"] + found["steady-state-basis"])
    # the scores themselves meet their targets: only the 4-sample set's total length is short
    assert all("gen_len" in m for m in found["accuracy-gate"]), found["accuracy-gate"]


def _offline_env(home: Path) -> dict[str, str]:
    """The CLI's environment with a HOME whose version-check cache is fresh (the installed version as
    the latest, endpoints_submission_cli/_version_check.py): the CLI then never asks PyPI."""
    cache = home / ".cache" / "endpoints-submission-cli" / "version_check.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"latest": version("endpoints-submission-cli"), "ts": time.time()}))
    return {**os.environ, "HOME": str(home)}


def test_the_cli_commands_read_it(bundle: tuple[Path, Path, str], tmp_path: Path) -> None:
    """`endpoints-submission-cli check-submission` reports what the Python API does; `runs create
    --dry-run` parses every point folder as a run folder (nothing reaches the network)."""
    _, tree, _ = bundle
    env = _offline_env(tmp_path)
    report = tmp_path / "report.json"
    r = subprocess.run(
        [*CLI, "check-submission", str(tree), "--no-annotate", "-q", "-o", str(report)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    results = json.loads(report.read_text())["results"]
    assert {x["rule"] for x in results if x["severity"] != "info"} == SHORT_RUN_RULES
    for folder in sorted((tree / "results" / "loadtest-sim-h100" / "llama3_1-8b").iterdir()):
        r = subprocess.run(
            [*CLI, "runs", "create", "--dry-run", "--path", str(folder)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        payload = json.loads(r.stdout)
        assert payload["point_config"]["concurrency"] == int(folder.name[1:])
        assert payload["result_summary"]["n_samples_completed"] > 0


def test_the_bundle_has_every_v1_file_and_field(bundle: tuple[Path, Path, str]) -> None:
    sweep, tree, stdout = bundle
    doc = load_sweep(sweep)
    curve = tree / "results" / "loadtest-sim-h100" / "llama3_1-8b"
    assert (tree / "docs" / "software.md").is_file() and (tree / "src" / "loadtest" / "README.md").is_file()
    power = json.loads((tree / "results" / "loadtest-sim-h100" / "system_power.json").read_text())
    assert power["node_sets"][0]["published_power"]["value_kw"] == 1.2
    assert (
        [p.concurrency for p in doc.points if not p.offline] == list(LADDER) == plan_points(64).concurrencies
    )
    expected = {f"r{n}" for n in LADDER} | ({"r128"} if doc.offline == "dedicated" else set())
    assert {p.name for p in curve.iterdir()} == expected
    r = regions(64, 1)
    for folder in curve.iterdir():
        point = yaml.safe_load((folder / "point.yaml").read_text())
        n = point["concurrency"]
        assert folder.name == f"r{n}"
        assert point["runtime_settings"]["runtime"]["sample_index_rng_seed"] == 586478644936801402
        assert point["seed_set"] == "A" and point["target_cohort"] == "2026-10-C1"
        assert (point["shared_src"], point["shared_docs"]) == ("src/loadtest", "docs")
        entry = next(p for p in doc.points if p.concurrency == n)
        run = json.loads((sweep / entry.dir / "run.json").read_text())
        assert point["steady_state"]["status"] == run["reporting_window"]["status"]
        if point["offline"] == "dedicated":
            assert n == 128 and "region" not in point
        else:
            assert point["region"] == r.of(n)
            assert point["runtime_settings"]["min_duration_ms"] == min_duration_s(n) * 1000
        standing = (
            "dedicated" if n == 128 else ("elected" if doc.offline == "elected" and n == 64 else "none")
        )
        assert point["offline"] == standing
        assert yaml.safe_load((folder / "config.yaml").read_text())["load"]["concurrency"] == n
        assert (folder / "performance" / "result_summary.json").read_bytes() == (
            folder / "result_summary.json"
        ).read_bytes()
        # the mandatory points (1, the region tops, C_max, Offline) carry their accuracy run's scores;
        # the others have no accuracy file
        mandatory = {p.concurrency for p in plan_points(64, offline_concurrency=128).points if p.mandatory}
        acc_file = folder / "accuracy" / "accuracy_results.json"
        assert acc_file.exists() == (n in mandatory), n
        if acc_file.exists():
            assert json.loads(acc_file.read_text())["accuracy_scores"], n
    assert "for C_max 64" in stdout and "mlperf endpoints: " in stdout


def test_every_file_says_loadtest_wrote_it(bundle: tuple[Path, Path, str]) -> None:
    _, tree, _ = bundle
    files = [p for p in tree.rglob("*") if p.is_file()]
    assert len(files) > 40
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert re.search(r"loadtest \d+\.\d+", text), path
    meta = json.loads((tree / "cli_metadata.json").read_text())
    assert meta["produced_by"].startswith("loadtest ") and meta["cli_version"] is None
    assert "not by endpoints-submission-cli" in meta["note"]


def test_missing_declarations_are_one_error_naming_each(tmp_path: Path) -> None:
    endpoint = tmp_path / "endpoint.yaml"
    full = yaml.safe_load(ENDPOINT.read_text())
    del full["system"]["division"], full["system"]["node_types"][0]["driver"], full["system_power"]
    endpoint.write_text(yaml.safe_dump(full))
    args = ["sweep", "--profile", "mlperf-llama3.1-8b-server", "--smoke", "--points", "1", "--endpoint-file"]
    args += [str(endpoint), "--mlperf-endpoints", str(tmp_path / "tree"), "--out", str(tmp_path / "s")]
    r = run_cli(args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(endpoint) in lines[0] and "fix:" in lines[0]
    for name in ("system.division", "system.node_types[0].driver", "system_power", "--seed-set"):
        assert name in lines[0]
    assert "system.system_name" not in lines[0] and not (tmp_path / "s" / "points").exists()


def test_regions_are_the_checkers() -> None:
    for c_max in (33, 40, 64, 100, 512, 1000, 4096):
        for c_min in (1, 8, 32):
            ours, theirs = regions(c_max, c_min), checker_regions.compute_regions(c_max, c_min)
            for name in ("low_latency", "low_concurrency", "med_concurrency", "high_concurrency", "margin"):
                bounds = getattr(theirs, name)
                assert getattr(ours, name) == (bounds.start, bounds.end), (c_max, c_min, name)
    for name, bench in BENCHMARKS.items():
        assert checker_results.MIN_QUERY_COUNT[bench.dataset] == bench.min_queries, name
    for c in (1, 32, 33, 512):
        assert min_duration_s(c) * 1000 == checker_regions.min_duration_ms(
            "high_concurrency", c, agentic=False
        )
        assert min_duration_s(c, agentic=True) * 1000 == checker_regions.min_duration_ms(
            "high_concurrency", c, agentic=True
        )


def test_the_plan_meets_the_rules() -> None:
    for c_max in (33, 40, 64, 100, 512, 1000):
        for agentic in (False, True):
            plan = plan_points(c_max, agentic=agentic)
            fixed = plan.concurrencies
            theirs = checker_regions.compute_regions(c_max, min(min(fixed), 32))
            covered = {checker_regions.covered_region(c, theirs) for c in fixed}
            assert {"low_concurrency", "med_concurrency", "high_concurrency"} <= covered, (c_max, fixed)
            assert len(plan.points) >= (7 if agentic else 8) and len(plan.points) <= 32
            assert fixed[0] == 1 and fixed[-1] == c_max and fixed == sorted(set(fixed))
            assert [p.offline for p in plan.points].count(True) == (0 if agentic else 1)


def test_plan_for_llama_at_c_max_512_prints_without_running(tmp_path: Path) -> None:
    r = run_cli(["sweep", "--profile", "mlperf-llama3.1-8b-server", "--plan", "--c-max", "512"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "C_max 512" in out and "high 66–512" in out and "margin 513–564" in out
    rows = re.findall(r"^  c(\d+)\s+(.+?)\s+≥ ([\d,]+) s", out, flags=re.M)
    assert [int(c) for c, _, _ in rows] == [2**k for k in range(10)]
    assert all(int(s.replace(",", "")) == min_duration_s(int(c)) for c, _, s in rows)
    assert "offline  concurrency 13,368" in out and "≥ 8,400 s (2 h 20 min)" in out
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written
    r = run_cli(["sweep", "--profile", "mlperf-llama3.1-8b-server", "--plan"], cwd=tmp_path)
    assert r.returncode == 2 and "--c-max" in r.stderr
