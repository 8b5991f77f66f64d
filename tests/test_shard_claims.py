"""Several pytest processes share one suite through tests/shard_claims.py: every test once, real engines apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

PLUGIN_DIR = Path(__file__).parent

_FILE = """
import json, os, time
import pytest
{mark}

@pytest.mark.parametrize("n", range(3))
def test_step(n):
    start = time.time()
    time.sleep(0.3)
    with open(os.environ["TRACE"], "a") as f:
        f.write(json.dumps({{"file": __name__, "pid": os.getpid(), "start": start, "end": time.time()}}) + "\\n")
"""


def _suite(root: Path) -> None:
    root.mkdir()
    (root / "conftest.py").write_text(
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'real_engine: needs a real engine')\n"
    )
    for name in ("a", "b", "c", "d"):
        (root / f"test_{name}.py").write_text(_FILE.format(mark=""))
    for name in ("r1", "r2"):
        (root / f"test_{name}.py").write_text(_FILE.format(mark="pytestmark = pytest.mark.real_engine"))


def test_two_processes_run_every_test_once_and_the_real_engine_files_one_at_a_time_after_the_install(
    tmp_path: Path,
) -> None:
    suite, claims, trace = tmp_path / "suite", tmp_path / "claims", tmp_path / "trace.jsonl"
    _suite(suite)
    claims.mkdir()
    ready = tmp_path / "engines-ready"
    env = dict(
        os.environ,
        LOADTEST_SHARD_DIR=str(claims),
        LOADTEST_ENGINES_READY=str(ready),
        TRACE=str(trace),
        PYTHONPATH=os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "shard_claims",
        "-o",
        "addopts=",
        "-p",
        "no:cacheprovider",
    ]
    procs = [subprocess.Popen([*cmd, str(suite)], cwd=suite, env=env) for _ in range(2)]
    try:
        time.sleep(3.0)  # the four plain files (3.6 s of tests) are under way; the "install" is not done
        installed_at = time.time()
        ready.write_text("0")
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert codes == [0, 0]
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    ran = sorted((r["file"], r["pid"]) for r in rows)
    assert len(rows) == 18  # six files of three tests, each test once
    assert {f for f, _ in ran} == {"test_a", "test_b", "test_c", "test_d", "test_r1", "test_r2"}
    for name in {f for f, _ in ran}:
        assert len({pid for f, pid in ran if f == name}) == 1, f"{name} was split between processes"
    assert len({pid for _, pid in ran}) == 2, "both processes took work"
    real = [r for r in rows if r["file"].startswith("test_r")]
    assert min(r["start"] for r in real) >= installed_at
    spans = {
        name: (
            min(r["start"] for r in real if r["file"] == name),
            max(r["end"] for r in real if r["file"] == name),
        )
        for name in ("test_r1", "test_r2")
    }
    (s1, e1), (s2, e2) = spans["test_r1"], spans["test_r2"]
    assert e1 <= s2 or e2 <= s1, f"the real-engine files overlapped: {spans}"
    outcomes = [r for f in claims.glob("tests-*.json") for r in json.loads(f.read_text())]
    assert sorted(r["outcome"] for r in outcomes) == ["passed"] * 18
