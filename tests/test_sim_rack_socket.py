"""A socket-level run on the GB300-NVL72 rack preset: `loadtest run` over real sockets against DeepSeek-R1 at
`--engine-ep 72` with MTP, its output tokens/s per GPU against what the step clock predicts for that batch."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from loadtest.sim.clock import draft_time_s, step_cost
from loadtest.sim.presets import EngineConfig, get_gpu, get_model, get_system
from loadtest.sim.spec_decode import SpecDecode
from tests.conftest import read_lines, run_cli, write_profile

STREAMS = 16
OUTPUT = 128
SPEEDUP = 2.0
GPUS = 72
SPEC = SpecDecode(3, 0.7)
# The run's figure within this share of the clock's: a closed loop loses a little at each request's start
# (the next request is sent after the last byte) and at the run's edges; a busy machine slows the client.
TOLERANCE = 0.25


def predicted_tokens_per_s_per_gpu(prompt: int) -> float:
    """The step clock's output tokens/s per GPU for ``STREAMS`` requests decoding together on one ep-72
    instance (at speed-up 1): each step verifies 1 + k tokens a request at the mean context and emits the
    expected tokens a step; the prompts of the requests that finish in a step are prefilled in it."""
    cfg = EngineConfig(
        gpu=get_gpu("gb300"),
        model=get_model("deepseek-r1"),
        ep=GPUS,
        system=get_system("GB300-NVL72"),
        spec=SPEC,
    )
    per_step = SPEC.expected_tokens_per_step()
    ctx = prompt + OUTPUT // 2
    items = [(1 + SPEC.k, ctx)] * STREAMS
    prefill = round(STREAMS * per_step / OUTPUT * prompt)
    step = step_cost(cfg, [*items, (prefill, 0)]).total_s + draft_time_s(cfg, [ctx] * STREAMS)
    # A request's steps: its prefill step (one token) and the decode steps for the rest.
    steps = 1 + (OUTPUT - 1) / per_step
    return STREAMS * OUTPUT / (steps * step) / GPUS


def test_a_closed_loop_on_the_rack_serves_what_the_step_clock_predicts(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        model="deepseek-r1",
        input_tokens={"dist": "fixed", "value": 128},
        output_tokens={"dist": "fixed", "value": OUTPUT},
        load={"concurrency": STREAMS},
        duration_s=4,
    )
    res = run_cli(
        ["run", "--profile", str(prof), "--engine-system", "GB300-NVL72", "--engine-model", "deepseek-r1"]
        + ["--engine-ep", str(GPUS), "--engine-spec-decode", f"{SPEC.k}:{SPEC.acceptance}"]
        + ["--engine-speedup", str(SPEEDUP), "--out", str(tmp_path / "r")]
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{GPUS}×GB300 of GB300-NVL72" in res.stdout, res.stdout[-2000:]
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    engine = run["endpoint"]["engine"]
    assert (engine["ep"], engine["system"], engine["num_speculative_tokens"]) == (GPUS, "GB300-NVL72", SPEC.k)
    recs = [r for r in read_lines([tmp_path / "r" / "records.jsonl"]) if r["outcome"] == "ok"]
    assert len(recs) >= 3 * STREAMS, len(recs)
    assert all(r["usage_completion_tokens"] == OUTPUT for r in recs)
    assert run["metrics"]["tokens_per_chunk"]["mean"] > 1.5, run["metrics"]["tokens_per_chunk"]
    prompt = round(statistics.median(r["usage_prompt_tokens"] for r in recs))
    # The run's output tokens/s, back at the clock's speed (÷ the speed-up), per GPU of the instance.
    measured = run["metrics"]["throughput"]["output_tokens_per_s"] / SPEEDUP / GPUS
    predicted = predicted_tokens_per_s_per_gpu(prompt)
    assert abs(measured / predicted - 1) <= TOLERANCE, (measured, predicted)
