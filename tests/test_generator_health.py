"""The generator's own health with several processes on one host: its processes' CPU is added up per core
they may use, so workers that share a core are judged together."""

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
