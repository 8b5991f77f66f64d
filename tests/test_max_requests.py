"""--max-requests N (loadtest run and master): exactly N units are issued, split over the processes, they
finish, and the run ends then, long before its --duration; closed loop, open loop and --processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import read_lines, run_cli, write_profile  # noqa: E402

from loadtest.locust.context import unit_share  # noqa: E402


@pytest.mark.parametrize(
    ("load", "processes", "n"),
    [(["--concurrency", "4"], 1, 30), (["--rate", "40"], 1, 30), (["--concurrency", "4"], 2, 31)],
    ids=["closed", "open", "processes2"],
)
def test_the_run_ends_after_exactly_n_requests(
    tmp_path: Path, load: list[str], processes: int, n: int
) -> None:
    prof = write_profile(tmp_path / "p.yaml")
    out = tmp_path / "out"
    res = run_cli(
        ["run", "--profile", str(prof), "--duration", "120", "--max-requests", str(n), *load]
        + ["--processes", str(processes), "--engine-speedup", "5", "--progress", "0", "--out", str(out)],
        timeout=150,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"or {n} requests" in res.stdout
    lines = read_lines(sorted(out.glob("records*.jsonl")))
    assert len(lines) == n and all(ln["outcome"] == "ok" for ln in lines)
    doc = json.loads((out / "run.json").read_text())
    assert doc["metrics"]["requests"]["completed"] == n
    assert doc["status"] == "completed" and doc["metrics"]["window"]["duration_s"] < 60


def test_shares_add_up() -> None:
    for total in (1, 7, 30, 31):
        for n in (1, 2, 3, 8):
            shares = [unit_share(total, i, n) for i in range(n)]
            assert sum(s or 0 for s in shares) == total and max(shares) - min(shares) <= 1  # type: ignore[operator]
    assert unit_share(None, 0, 2) is None


def test_max_requests_must_be_positive(tmp_path: Path) -> None:
    res = run_cli(["run", "--max-requests", "0", "--out", str(tmp_path / "o")])
    assert res.returncode == 2 and "--max-requests" in res.stderr and "at least 1" in res.stderr
