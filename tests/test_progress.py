"""Live progress of `loadtest run` (locust/progress.py): a line on stderr every --progress seconds with
the requests so far (growing), their rates, TTFT and the requests in flight, and the drain announced;
none with --progress 0; the same from a master whose workers report."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import run_cli, write_profile  # noqa: E402

LINE = re.compile(
    r"^progress (\d+) s / 6 s: (\d+) requests \((\d+) ok, (\d+) failed\), [\d.]+ req/s, [\d,]+ output tok/s, "
    r"(TTFT p50 [\d.,]+ ms p99 [\d.,]+ ms|no first token yet)(, (\d+) in flight)?$"
)


@pytest.mark.parametrize("processes", [1, 2], ids=["local", "master"])
def test_progress_lines_while_the_load_runs_and_the_drain_announced(tmp_path: Path, processes: int) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 4})
    res = run_cli(
        ["run", "--profile", str(prof), "--duration", "6", "--progress", "1.5", "--engine-speedup", "5"]
        + ["--processes", str(processes), "--out", str(tmp_path / "out")]
    )
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("progress ")]
    assert len(lines) >= 2, res.stderr[-2000:]
    parsed = [LINE.match(ln) for ln in lines]
    assert all(parsed), lines
    done = [int(m.group(2)) for m in parsed if m]
    assert done == sorted(done) and done[-1] > 0  # the count grows, and requests were counted
    assert all(int(m.group(2)) == int(m.group(3)) + int(m.group(4)) for m in parsed if m)
    # A local run knows its requests in flight; a master does not (its workers report every 3 s).
    assert all((m.group(7) is not None) == (processes == 1) for m in parsed if m)
    assert any(ln.startswith("load stopped after ") for ln in res.stderr.splitlines()), res.stderr[-2000:]


def test_no_progress_with_progress_0(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml")
    res = run_cli(
        ["run", "--profile", str(prof), "--duration", "3", "--progress", "0", "--out", str(tmp_path / "o")]
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert not [ln for ln in res.stderr.splitlines() if ln.startswith(("progress ", "load stopped"))]
