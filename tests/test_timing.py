"""At light load the client's TTFT and ITL agree with the engine's configured timing and its ground truth."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from loadtest.sim import EngineConfig, SimProcess
from loadtest.sim.clock import decode_step_time_s, prefill_time_s
from tests.conftest import read_lines, run_cli, write_profile

PROMPT = 1024
OUTPUT = 48
# Stated tolerances (docs/metrics.md): the client adds sub-millisecond overhead on loopback, and the
# engine's asyncio timers wake up to ~1 ms late.
TTFT_TOL_MS = 2.0
ITL_TOL_MS = 1.0
REL_TOL = 0.10


def test_ttft_and_itl_match_engine_timing_at_light_load(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        input_tokens={"dist": "fixed", "value": PROMPT},
        output_tokens={"dist": "fixed", "value": OUTPUT},
        load={"concurrency": 1},
        duration_s=3,
    )
    with SimProcess(speedup=1) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / "o")])
        truth = {t["request_id"]: t for t in sim.truth()}
    assert res.returncode == 0, res.stderr
    records = [r for r in read_lines([tmp_path / "o" / "records.jsonl"]) if r["outcome"] == "ok"]
    assert len(records) >= 5
    cfg = EngineConfig()
    prompt_tokens = records[0]["prompt_tokens"]
    assert abs(prompt_tokens - PROMPT) <= 0.01 * PROMPT
    expected_ttft_ms = prefill_time_s(cfg, prompt_tokens) * 1e3
    expected_itl_ms = decode_step_time_s(cfg, 1, prompt_tokens + OUTPUT // 2) * 1e3

    ttft = np.array([r["ttft_us"] for r in records]) / 1e3
    gaps = np.concatenate([np.diff(r["chunks_us"]) for r in records]) / 1e3
    assert abs(np.median(ttft) - expected_ttft_ms) <= TTFT_TOL_MS + REL_TOL * expected_ttft_ms, (
        np.median(ttft),
        expected_ttft_ms,
    )
    assert abs(np.median(gaps) - expected_itl_ms) <= ITL_TOL_MS + REL_TOL * expected_itl_ms, (
        np.median(gaps),
        expected_itl_ms,
    )
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert (
        abs(run["metrics"]["latency_ms"]["itl"]["p50"] - expected_itl_ms)
        <= ITL_TOL_MS + REL_TOL * expected_itl_ms
    )

    # Against the engine's ground truth (same monotonic clock on one host): what the client adds.
    added_first: list[float] = []
    added_gap: list[float] = []
    for r in records:
        t = truth[r["wire_id"]]
        base_ns = t["arrival_ns"]
        client_first_rel = (r["ttft_us"] - r["sent_us"]) / 1e3  # ms after the send
        engine_first_rel = (t["first_token_ns"] - base_ns) / 1e6  # ms after the engine saw the request
        added_first.append(client_first_rel - engine_first_rel)
        cg = np.diff(r["chunks_us"]) / 1e3
        tg = np.diff(np.array(t["token_ns"], dtype=np.int64)) / 1e6
        added_gap.extend((cg - tg).tolist())
    assert 0 <= np.median(added_first) < 2.0, np.median(added_first)
    assert abs(np.median(added_gap)) < 0.5, np.median(added_gap)
