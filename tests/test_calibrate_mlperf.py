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


def _table() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "calibrate_mlperf.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_table_prints_both_benchmarks_within_a_quarter_of_the_published_figures() -> None:
    out = _table()
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| DeepSeek", "| Llama"))]
    assert len(rows) == 3, out.stdout
    v6 = [r for r in rows if "| v6.0 |" in r]
    assert len(v6) == 2, rows
    gaps = [int(g) for g in re.findall(r"\(([+-]\d+)%\)", "\n".join(v6))]
    assert len(gaps) == 4, out.stdout
    assert all(abs(g) <= 25 for g in gaps), out.stdout
    assert "8,064" in out.stdout and "9,821" in out.stdout and "259" in out.stdout and "271" in out.stdout


def test_the_v51_rows_run_that_rounds_layout_and_name_the_gap() -> None:
    out = _table()
    assert out.returncode == 0, out.stderr
    (row,) = [line for line in out.stdout.splitlines() if "| v5.1 |" in line]
    assert "ep 8, no MTP, NVFP4 experts, FP8 KV" in row and "2,907" in row and "5,842" in row, row
    # The engine's figures are the step clock's for that layout, printed with their gap, whatever it is.
    case = cal._deepseek_v51_case()
    figures = cal.table(case, "GB300-NVL72")
    assert f"{figures['server']:,.0f} ({figures['server'] / 2907 - 1:+.0%})" in row, row
    assert f"{figures['offline']:,.0f} ({figures['offline'] / 5842 - 1:+.0%})" in row, row
    # At the v5.1 Server run's own load (Little's law on its log) the clock's step is a fraction of the
    # run's measured time per output token: the line says how much.
    load = cal.v51_server_load()
    assert 180 < load < 190, load
    tps, tpot = cal.steady(cal.config(case, "GB300-NVL72"), round(load), case)
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("v5.1 Server at its own load")]
    assert f"engine TPOT {tpot * 1e3:.1f} ms" in line and "63.7 ms" in line, line
    assert f"{cal.V51_SERVER_MEAN_TPOT_S / tpot:.2f}x the clock's" in line, line
    assert tpot < cal.V51_SERVER_MEAN_TPOT_S, (tpot, line)


def test_nvfp4_experts_and_an_fp8_kv_cache_shrink_the_bytes() -> None:
    case = cal._deepseek_v51_case()
    preset = EngineConfig(
        gpu=get_gpu("gb300"), model=get_model("deepseek-r1"), ep=8, system=get_system("GB300-NVL72")
    )
    v51 = cal.config(case, "GB300-NVL72")
    assert v51.model.expert_weight_bytes == preset.model.expert_weight_bytes * cal.NVFP4_BYTES
    assert v51.model.dense_weight_bytes == preset.model.dense_weight_bytes
    assert v51.kv_bytes_per_token_per_gpu * 2 == preset.kv_bytes_per_token_per_gpu
    assert v51.kv_capacity_tokens > 2 * preset.kv_capacity_tokens


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
