"""Rack presets and wide expert parallelism: GB300 NVL72 as a 72-GPU system and four of them over
InfiniBand, expert weights spread over the GPUs, an all-to-all each MoE layer on the right link."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from loadtest.sim.clock import alltoall_time_s, step_cost
from loadtest.sim.presets import GB, EngineConfig, get_gpu, get_model, get_system
from tests.conftest import read_lines, run_cli, write_profile

R1 = get_model("deepseek-r1")
GB300 = get_gpu("gb300")


def _config(system: str, ep: int) -> EngineConfig:
    return EngineConfig(gpu=GB300, model=R1, ep=ep, system=get_system(system))


def test_the_systems_are_listed_with_their_sources() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loadtest.sim", "--list-presets"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "GB300-NVL72: 72 × GB300, NVLink domains of 72, 100 GB/s per GPU between them" in out.stdout
    assert "GB300-NVL72x4: 288 × GB300" in out.stdout
    four = get_system("4xnvl72")
    assert (four.gpus, four.domains, four.gpu) == (288, 4, "GB300")
    assert "InfiniBand" in four.source and "800 Gb/s" in four.source


def test_wide_ep_spreads_the_experts_and_pays_an_all_to_all_on_the_link_it_crosses() -> None:
    one = _config("GB300-NVL72", 1)
    wide = _config("GB300-NVL72", 72)
    # Each GPU holds the dense weights and 1/72 of the routed experts.
    assert wide.weight_bytes_per_gpu == R1.dense_weight_bytes + R1.expert_weight_bytes / 72
    assert wide.weight_bytes_per_gpu < one.weight_bytes_per_gpu / 10
    assert wide.kv_capacity_tokens > 72 * one.kv_capacity_tokens  # more room on each of 72 GPUs
    # The all-to-all of 72 × 64 decode tokens: dispatch (1 B) + combine (2 B) of d_model to 8 experts
    # each, 71/72 of it off the GPU, over half of NVLink's 1.8 TB/s at eta_link, each MoE layer.
    n = 72 * 64
    per_gpu = n / 72 * 8 * 7168 * 3 * 71 / 72
    expect = 61 * (2 * 10e-6 + per_gpu / (0.7 * 900 * GB))
    assert abs(alltoall_time_s(wide, n) - expect) < 1e-9
    assert alltoall_time_s(one, n) == 0.0
    # Past one rack the all-to-all crosses InfiniBand (100 GB/s a GPU): 9x slower per byte.
    cross = _config("GB300-NVL72x4", 144)
    assert cross.a2a_link_bw == 100 * GB
    in_rack = _config("GB300-NVL72x4", 72)
    assert in_rack.a2a_link_bw == 900 * GB
    per_gpu_cross = 2 * n / 144 * 8 * 7168 * 3 * 143 / 144
    assert abs(alltoall_time_s(cross, 2 * n) - 61 * (2 * 10e-6 + per_gpu_cross / (0.7 * 100 * GB))) < 1e-9
    assert alltoall_time_s(cross, 2 * n) > 4 * alltoall_time_s(in_rack, n)
    # Per GPU, a wide-EP decode step at 64 requests a GPU serves several times the tokens of one GPU
    # holding all the weights at the same batch a GPU.
    items = [(1, 2000)] * 64
    narrow_tps = 64 / step_cost(one, items).total_s
    wide_tps = 72 * 64 / step_cost(wide, items * 72).total_s / 72
    assert wide_tps > 3 * narrow_tps, (wide_tps, narrow_tps)


def test_a_run_on_the_rack_preset_serves_at_the_modelled_step_time(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        model="deepseek-r1",
        output_tokens={"dist": "fixed", "value": 48},
        load={"concurrency": 4},
        duration_s=3,
        engine={"model": "deepseek-r1", "system": "GB300-NVL72", "ep": 8},
    )
    res = run_cli(["run", "--profile", str(prof), "--engine-speedup", "4", "--out", str(tmp_path / "r")])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "8×GB300 of GB300-NVL72" in res.stdout
    engine = json.loads((tmp_path / "r" / "run.json").read_text())["endpoint"]["engine"]
    assert (engine["gpu"], engine["ep"], engine["system"]) == ("GB300", 8, "GB300-NVL72")
    recs = [r for r in read_lines([tmp_path / "r" / "records.jsonl"]) if r["outcome"] == "ok"]
    assert recs
    # Four streams decoding together: each token is one step of 4 items over ~the prompt's context.
    cfg = _config("GB300-NVL72", 8)
    prompt = recs[0]["usage_prompt_tokens"]
    step = step_cost(cfg, [(1, prompt + 24)] * 4).total_s / 4
    tpot = statistics.median(r["tpot_us"] for r in recs) / 1e6
    assert 0.8 * step < tpot < 1.5 * step + 0.001, (tpot, step)


def test_a_layout_that_does_not_fit_is_a_usage_error(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml")
    res = run_cli(["run", "--profile", str(prof), "--engine-ep", "8", "--out", str(tmp_path / "a")])
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "mixture-of-experts" in line and "--engine-ep" in line, line
    res = run_cli(
        ["run", "--profile", str(prof), "--engine-model", "deepseek-r1", "--engine-system", "gb300-nvl72"]
        + ["--engine-ep", "144", "--out", str(tmp_path / "b")]
    )
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "144 GPUs" in line and "GB300-NVL72's 72 GPUs" in line, line
