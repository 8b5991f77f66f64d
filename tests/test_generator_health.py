"""The generator's own health: with several processes on one host their CPU is added up per core they may
use, so workers that share a core are judged together; a closed loop's streams held are measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import write_profile

ROOT = Path(__file__).resolve().parent.parent


def test_workers_sharing_one_core_are_judged_together(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml", load={"concurrency": 32}, output_tokens={"dist": "fixed", "value": 64}
    )
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "loadtest.cli.main", "run", "--profile", str(prof), "--duration", "6"]
    argv += ["--processes", "2", "--engine-speedup", "50", "--generator-health", "warn", "--out", str(out)]
    # the master, its two workers (and the engine) on core 0 only
    res = subprocess.run(["taskset", "-c", "0", *argv], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert (out / "run.json").exists(), res.stderr[-3000:]
    doc = json.loads((out / "run.json").read_text())
    gen = doc["metrics"]["generator"]
    host, one = gen["host_cpu_p90_percent"], gen["cpu_p90_percent"]
    assert host is not None and one is not None, gen
    # the processes together use at least what the busiest one alone does, within sampling noise
    assert host >= 0.8 * one, gen
    check = next(c for c in doc["verdict"]["checks"] if c["name"] == "generator_cpu")
    assert check["value"] == max(host, one), (check, gen)
    if host > one:
        assert "each core its processes on this host share" in check["detail"]


def test_the_streams_a_closed_loop_held_are_measured_and_judged(tmp_path: Path) -> None:
    """run.json generator_health.mean_in_flight is the time-averaged count of requests in flight over
    the steady state, recomputed here from the record log; 16 streams against the engine are held."""
    prof = write_profile(
        tmp_path / "p.yaml", load={"concurrency": 16}, output_tokens={"dist": "fixed", "value": 48}
    )
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "loadtest.cli.main", "run", "--profile", str(prof), "--duration", "8"]
    argv += ["--generator-health", "warn", "--out", str(out)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert (out / "run.json").exists(), res.stderr[-3000:]
    doc = json.loads((out / "run.json").read_text())
    health = doc["generator_health"]
    lines = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    t0 = min(r["t"] for r in lines)
    start, end = t0 + health["startup_s"], max(r["t"] for r in lines)
    busy = 0.0
    for r in lines:
        if r.get("sent_us") is None:
            continue
        sent = r["t"] + r["sent_us"] / 1e6
        done = max(sent, r["t"] + (r.get("e2e_us") or 0) / 1e6)
        busy += max(0.0, min(done, end) - max(sent, start))
    assert abs(health["mean_in_flight"] - busy / (end - start)) <= 0.1, health
    assert health["in_flight_ok_share"] == 1.0
    assert 0.9 * 16 <= health["mean_in_flight"] <= 16, health
    check = next(c for c in doc["verdict"]["checks"] if c["name"] == "streams_held")
    assert check["passed"] and check["value"] == health["mean_in_flight"], check
