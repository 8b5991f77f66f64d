"""The calibration table (tools/calibrate_mlperf.py): the engine's tokens/s per GPU on GB300 NVL72 within
25 % of MLPerf v6.0's DeepSeek-R1 and Llama 3.1 405B figures, and the steady state it evaluates."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import calibrate_mlperf as cal  # noqa: E402

from loadtest.sim.presets import EngineConfig, get_gpu, get_model, get_system  # noqa: E402


def test_the_table_prints_both_benchmarks_within_a_quarter_of_the_published_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "calibrate_mlperf.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = [
        line
        for line in out.stdout.splitlines()
        if line.startswith("| DeepSeek") or line.startswith("| Llama")
    ]
    assert len(rows) == 2, out.stdout
    gaps = [int(g) for g in re.findall(r"\(([+-]\d+)%\)", out.stdout)]
    assert len(gaps) == 4, out.stdout
    assert all(abs(g) <= 25 for g in gaps), out.stdout
    assert "8,064" in out.stdout and "9,821" in out.stdout and "259" in out.stdout and "271" in out.stdout


def test_the_steady_state_trades_tpot_for_throughput() -> None:
    case = cal._llama_case()
    cfg = EngineConfig(
        gpu=get_gpu("gb300"), model=get_model(case.model), tp=case.tp, system=get_system("GB300-NVL72")
    )
    small_tps, small_tpot = cal.steady(cfg, 2, case)
    big_tps, big_tpot = cal.steady(cfg, 32, case)
    assert big_tps > 1.5 * small_tps and big_tpot > small_tpot
    server = cal.table(case, "GB300-NVL72")
    assert 0 < server["server"] <= server["offline"] * 1.0001
