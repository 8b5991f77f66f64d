"""Speculative decoding in the engine: several tokens a chunk at the configured acceptance, vLLM's
spec-decode counters agreeing with the ground truth, and the options that turn it on."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from loadtest.sim import SimProcess
from loadtest.sim.spec_decode import SpecDecode
from tests.conftest import read_lines, run_cli, write_profile

K, A = 3, 0.7
OUTPUT = 96


def _profile(tmp_path: Path, name: str) -> Path:
    return write_profile(
        tmp_path / f"{name}.yaml",
        output_tokens={"dist": "fixed", "value": OUTPUT},
        load={"concurrency": 4},
        duration_s=3,
    )


def _counters(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _run(tmp_path: Path, name: str, extra: list[str]) -> tuple[list[dict], dict[str, dict], dict[str, float]]:
    """A run against a standalone engine: ok records, the engine's truth by request id, its /metrics."""
    prof = _profile(tmp_path, name)
    with SimProcess(speedup=4, extra_args=extra) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / name)])
        assert res.returncode == 0, res.stderr[-2000:]
        truth = {t["request_id"]: t for t in sim.truth()}
        metrics = _counters(sim.metrics())
    recs = [r for r in read_lines([tmp_path / name / "records.jsonl"]) if r["outcome"] == "ok"]
    assert len(recs) >= 20, len(recs)
    return recs, truth, metrics


def test_chunks_carry_several_tokens_at_the_configured_acceptance(tmp_path: Path) -> None:
    recs, truth, metrics = _run(tmp_path, "spec", ["--spec-decode", f"{K}:{A}"])
    spec = SpecDecode(K, A)
    ok = [t for t in truth.values() if t["outcome"] == "ok"]
    drafts = sum(t["draft_tokens"] for t in ok)
    accepted = sum(t["accepted_tokens"] for t in ok)
    # Drafts shrink only in a stream's last k tokens; the rest are full-length, so the measured rate
    # (vLLM's accepted ÷ draft tokens) is the model's Σ a^i / k within a few hundredths.
    assert drafts > 2000, drafts
    assert abs(accepted / drafts - spec.expected_acceptance_rate()) < 0.05, (accepted / drafts, spec)
    # vLLM's counters are the truth's sums (every request of the run finished before the scrape).
    assert metrics["vllm:spec_decode_num_draft_tokens_total"] == drafts
    assert metrics["vllm:spec_decode_num_accepted_tokens_total"] == accepted
    steps = metrics["vllm:spec_decode_num_drafts_total"]
    assert drafts / K <= steps <= drafts, (steps, drafts)
    # Each step's tokens reach the client as one chunk: the client's chunks are the engine's writes.
    per_chunk = []
    for r in recs:
        t = truth[r["wire_id"]]
        assert r["output_tokens"] == OUTPUT == t["completion_tokens"]
        assert len(r["chunks_us"]) == len(set(t["token_ns"])), r["wire_id"]
        per_chunk.append(OUTPUT / len(r["chunks_us"]))
    # Tokens a step: (1 − a^(k+1)) / (1 − a) = 2.53 for full drafts; the last tokens draft fewer.
    mean = statistics.fmean(per_chunk)
    assert 0.85 * spec.expected_tokens_per_step() < mean <= spec.expected_tokens_per_step() + 0.1, mean
    # run.json: the client's tokens a chunk, and the acceptance the telemetry read from the counters.
    run = json.loads((tmp_path / "spec" / "run.json").read_text())
    tpc = run["metrics"]["tokens_per_chunk"]
    assert tpc["chunks"] == sum(len(r["chunks_us"]) for r in recs)
    assert tpc["tokens"] == OUTPUT * len(recs)
    assert tpc["mean"] == round(tpc["tokens"] / tpc["chunks"], 4)
    told = run["telemetry"]["spec_decode"]
    assert abs(told["acceptance_rate"] - accepted / drafts) < 0.02, (told, accepted / drafts)
    assert abs(told["mean_acceptance_length"] - (1 + accepted / steps)) < 0.05, told
    # The server's ITL histogram counts one gap a chunk, as vLLM observes one a step.
    gaps = sum(len(set(t["token_ns"])) - 1 for t in truth.values() if t["token_ns"])
    assert metrics["vllm:inter_token_latency_seconds_count"] == gaps
    # Without drafts every chunk is one token and the spec-decode counters stay at zero.
    plain, plain_truth, plain_metrics = _run(tmp_path, "plain", [])
    assert all(len(r["chunks_us"]) == r["output_tokens"] for r in plain)
    assert plain_metrics["vllm:spec_decode_num_draft_tokens_total"] == 0
    plain_run = json.loads((tmp_path / "plain" / "run.json").read_text())
    assert plain_run["metrics"]["tokens_per_chunk"]["mean"] == 1.0
    assert "spec_decode" not in plain_run["telemetry"]
    assert all(t["draft_tokens"] == 0 for t in plain_truth.values())
    # Verifying 4 tokens costs about one decode step at this small batch: the time per output token
    # falls to about 1/2.5 (a generous bound: the machine may be busy).
    tpot_spec = statistics.median(r["tpot_us"] for r in recs)
    tpot_plain = statistics.median(r["tpot_us"] for r in plain)
    assert tpot_spec < 0.8 * tpot_plain, (tpot_spec, tpot_plain)


def test_the_run_option_and_the_profile_turn_it_on(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        output_tokens={"dist": "fixed", "value": 32},
        duration_s=2,
        engine={"spec_decode": "2:0.9"},
    )
    res = run_cli(["run", "--profile", str(prof), "--engine-speedup", "4", "--out", str(tmp_path / "a")])
    assert res.returncode == 0, res.stderr[-2000:]
    engine = json.loads((tmp_path / "a" / "run.json").read_text())["endpoint"]["engine"]
    assert (engine["num_speculative_tokens"], engine["spec_acceptance"]) == (2, 0.9)
    recs = [r for r in read_lines([tmp_path / "a" / "records.jsonl"]) if r["outcome"] == "ok"]
    assert recs and all(len(r["chunks_us"]) < r["output_tokens"] for r in recs)
    # The command line wins over the profile.
    res = run_cli(
        ["run", "--profile", str(prof), "--engine-spec-decode", "1:0.5", "--engine-speedup", "4"]
        + ["--out", str(tmp_path / "b")]
    )
    assert res.returncode == 0, res.stderr[-2000:]
    engine = json.loads((tmp_path / "b" / "run.json").read_text())["endpoint"]["engine"]
    assert (engine["num_speculative_tokens"], engine["spec_acceptance"]) == (1, 0.5)


def test_a_bad_setting_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", engine={"spec_decode": "3:1.5"})
    res = run_cli(["run", "--profile", str(prof), "--out", str(tmp_path / "a")])
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "engine.spec_decode" in line and "3:1.5" in line and "K:A" in line, line
    res = run_cli(
        ["run", "--profile", str(prof), "--engine-spec-decode", "three", "--out", str(tmp_path / "b")]
    )
    assert res.returncode == 2 and "--engine-spec-decode" in res.stderr, res.stderr
