"""The shipped traffic profiles in traffic_profiles/: they validate, build, carry the MLPerf limits, and run."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from loadtest.metrics.run_length import (
    drain_timeout_for,
    evidence_duration_s,
    evidence_requests,
    judged_seconds_for,
    longest_output,
)
from loadtest.metrics.slo import Slo, parse_slos
from loadtest.profile.loader import load_profile, shipped_profiles
from loadtest.sim.presets import EngineConfig, get_gpu, get_model
from loadtest.workload.builder import Workload
from tests.conftest import failed_only_on_delivery, run_cli

# The profiles this file is about (others may ship more; every shipped one is validated below).
SHIPPED = [
    "long-context-agent",
    "reasoning",
    "offline-max-throughput",
    "mlperf-llama2-70b-server",
    "mlperf-llama2-70b-interactive",
    "mlperf-llama3.1-8b-server",
    "mlperf-llama3.1-8b-interactive",
    "mlperf-deepseek-r1-server",
    "mlperf-deepseek-r1-interactive",
    "mlperf-gpt-oss-120b-server",
    "mlperf-gpt-oss-120b-interactive",
    "chat-agent-mix",
    "multi-turn-chat",
    "shared-prefix-chat",
    "vision-chat",
    "sharegpt-chat",
    "agentic-kimi-k3",
    "agentic-qwen3.6-35b-a3b",
    "mlperf-llama3.1-405b-server",
    "mlperf-llama3.1-405b-offline",
    "mlperf-qwen3-vl-235b-server",
    "mlperf-qwen3-vl-235b-offline",
]
# The MLPerf Inference v6.0 systems' profiles (docs/sources.md §21-§24) and the engine speedup a short
# smoke run of each takes: a fast MoE's tokens merge in the client's reads when sped up too far.
V6_RUNS = {
    "mlperf-llama3.1-405b-server": 20,
    "mlperf-llama3.1-405b-offline": 20,
    "mlperf-qwen3-vl-235b-server": 20,
    "mlperf-qwen3-vl-235b-offline": 1,
    "mlperf-dlrmv3-server": 1,
    "mlperf-dlrmv3-offline": 1,
    "mlperf-dlrmv3-server-grpc": 1,  # KServe v2 over gRPC: the engine serves its gRPC service too
    "mlperf-wan2.2-singlestream": 100,
    "mlperf-wan2.2-offline": 100,
}

# docs/sources.md §1: p99 TTFT / p99 TPOT limits in ms (Server, Interactive) and max output tokens.
MLPERF_LIMITS_MS = {
    "llama2-70b": {"server": (2000, 200), "interactive": (450, 40), "max_out": 1024},
    "llama3.1-8b": {"server": (2000, 100), "interactive": (500, 30), "max_out": 128},
    "deepseek-r1": {"server": (2000, 80), "interactive": (1500, 15), "max_out": 20000},
    "gpt-oss-120b": {"server": (3000, 80), "interactive": (2000, 15), "max_out": 10240},
}
# docs/sources.md §1 reference mean output lengths (llama3.1-8b has none there).
MLPERF_MEAN_OUT = {"llama2-70b": 294, "deepseek-r1": 3886, "gpt-oss-120b": 1278}
MLPERF = [(b, s) for b in MLPERF_LIMITS_MS for s in ("server", "interactive")]

_UNIT_MS = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0, "": 1000.0}


def slo_ms(value: float | str) -> float:
    """An SLO latency as milliseconds (a bare number is seconds)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(us|µs|ms|s)?\s*", str(value))
    assert m, value
    return float(m.group(1)) * _UNIT_MS[m.group(2) or ""]


def test_every_shipped_profile_validates() -> None:
    names = shipped_profiles()
    assert set(SHIPPED) <= set(names)
    proc = run_cli(["profiles", "validate", *(str(p) for p in names.values())], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == len(names)


@pytest.mark.parametrize("name", SHIPPED)
def test_profile_builds_units_and_first_requests(name: str) -> None:
    profile, path = load_profile(name)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), "a shipped profile starts with a comment header"
    assert profile.name == name
    if name.startswith("mlperf-"):  # at least LoadGen's minimum (docs/sources.md §1)
        assert profile.duration_s >= profile.judging.min_duration_s == 600
    percentiles = [s.p for s in parse_slos(profile.slos or {}) if isinstance(s, Slo)]
    if profile.load.rate is not None and percentiles:
        # An open loop's default run proves its strictest percentile: the arrivals, 2 σ below their
        # mean count, still give early stopping its minimum (closed loops: measured, docs/profiles.md).
        cv = profile.load.cv if profile.load.arrival == "gamma" else 1.0
        need = evidence_duration_s(max(percentiles), profile.load.rate, cv, profile.judging.warmup_s)
        assert profile.duration_s >= need, (name, profile.duration_s, need)
    # The engine preset exists and the model fits: weights leave room for a KV cache.
    cfg = EngineConfig(
        gpu=get_gpu(profile.engine.gpu), model=get_model(profile.engine.model), tp=profile.engine.tp
    )
    assert cfg.kv_capacity_tokens > 100_000, (name, cfg.kv_capacity_tokens)
    w = Workload(profile)
    names = {s.name for s in profile.scenarios}
    for i in range(20):
        req = w.request(i)
        assert req.prompt_tokens > 0
        assert req.scenario in names
        step = w.unit(i).next(None)
        assert step is not None
        assert step.request.prompt_tokens > 0
        assert step.request.body == req.body  # unit i is a function of the seed alone
    if profile.load.rate is not None:
        offsets = list(itertools.islice(w.arrival_offsets(), 20))
        assert offsets == sorted(offsets) and offsets[0] >= 0


@pytest.mark.parametrize(("bench", "scenario"), MLPERF)
def test_mlperf_profiles_carry_the_reference_limits(bench: str, scenario: str) -> None:
    profile, _ = load_profile(f"mlperf-{bench}-{scenario}")
    ttft, tpot = MLPERF_LIMITS_MS[bench][scenario]
    assert set(profile.slos) == {"ttft_p99", "tpot_p99"}
    assert slo_ms(profile.slos["ttft_p99"]) == ttft
    assert slo_ms(profile.slos["tpot_p99"]) == tpot
    assert profile.load.rate is not None and profile.load.arrival == "poisson"
    # LoadGen's minimums: mlperf.conf *.Server.min_duration = 600000 ms, TestSettings min_query_count = 100.
    assert (profile.judging.min_duration_s, profile.judging.min_queries) == (600, 100)
    assert profile.judging.warmup_s == 0 and profile.judging.smoke is False
    (sc,) = profile.scenarios
    assert sc.salt is True
    assert sc.output_tokens is not None and sc.output_tokens.max == MLPERF_LIMITS_MS[bench]["max_out"]
    assert sc.reasoning is (bench in ("deepseek-r1", "gpt-oss-120b"))
    if bench in MLPERF_MEAN_OUT:
        w = Workload(profile)
        outs = [w.request(i).requested_output_tokens or 0 for i in range(1500)]
        assert max(outs) <= MLPERF_LIMITS_MS[bench]["max_out"]
        mean = sum(outs) / len(outs)
        assert abs(mean - MLPERF_MEAN_OUT[bench]) / MLPERF_MEAN_OUT[bench] < 0.08, mean


def test_mix_shares_match_weights() -> None:
    profile, _ = load_profile("chat-agent-mix")
    w = Workload(profile)
    counts = Counter(w.scenario_for(i).name for i in range(2000))
    total = sum(s.weight for s in profile.scenarios)
    assert {s.name: s.kind for s in profile.scenarios} == {
        "chat": "chat",
        "multi-turn-chat": "multi_turn",
        "agent": "agent",
    }
    for s in profile.scenarios:
        assert abs(counts[s.name] / 2000 - s.weight / total) <= 0.03, (s.name, counts)


def test_shared_prefix_requests_in_a_group_start_alike() -> None:
    profile, _ = load_profile("shared-prefix-chat")
    (sc,) = profile.scenarios
    assert sc.prefix is not None and (sc.prefix.groups, sc.prefix.tokens) == (8, 2048)
    w = Workload(profile)
    groups = [w.prefixes.group_text(g, sc.prefix.tokens) for g in range(sc.prefix.groups)]
    members: dict[int, list[str]] = {}
    for i in range(40):
        user = w.request(i).body["messages"][-1]["content"]
        hits = [g for g, text in enumerate(groups) if user.startswith(text)]
        assert len(hits) == 1, i
        members.setdefault(hits[0], []).append(user)
    assert len(members) > 1  # several groups are in use
    shared = [m for m in members.values() if len(m) >= 2]
    assert shared
    for m in shared:
        lead = len(groups[0]) // 2
        assert len({u[:lead] for u in m}) == 1  # same group: identical leading text
        assert len(set(m)) == len(m)  # but the requests differ after it
    # Different groups differ at the start.
    assert len({g[:200] for g in groups}) == len(groups)


def _seed_with_all_scenarios_early(w: Workload, within_s: float) -> int:
    """A seed whose units arriving in the first ``within_s`` seconds include every scenario."""
    names = {s.name for s in w.scenarios}
    for seed in range(200):
        ws = Workload(w.profile, seed=seed, tokenizer=w.profile.tokenizer)
        seen = set()
        for i, t in enumerate(ws.arrival_offsets()):
            if t > within_s:
                break
            seen.add(ws.scenario_for(i).name)
        if seen == names:
            return seed
    raise AssertionError("no seed found")


def test_mix_runs_against_the_embedded_engine(tmp_path: Path) -> None:
    profile, _ = load_profile("chat-agent-mix")
    seed = _seed_with_all_scenarios_early(Workload(profile), within_s=2.0)
    out = tmp_path / "mix"
    proc = run_cli(
        [
            "run",
            "--profile",
            "chat-agent-mix",
            "--duration",
            "4",
            "--engine-speedup",
            "8",
            "--seed",
            str(seed),
            "--out",
            str(out),
        ],
        timeout=90,
    )
    run = json.loads((out / "run.json").read_text())
    # The mix carries SLOs: a 4-second run cannot prove a p99, so the verdict decides the exit code.
    assert run["status"] == "completed"
    assert proc.returncode == run["verdict"]["exit_code"] in (0, 10, 11), (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )
    names = {"chat", "multi-turn-chat", "agent"}
    assert set(run["scenarios"]) == names
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line]
    assert records
    assert {r["scenario"] for r in records} <= names
    assert {r["scenario"] for r in records} == names


@pytest.mark.parametrize("smoke", [False, True], ids=["compliant", "smoke"])
def test_a_short_mlperf_run_is_invalid_unless_a_smoke_run_and_then_says_so(
    tmp_path: Path, smoke: bool
) -> None:
    out = tmp_path / "out"
    args = ["run", "--profile", "mlperf-llama3.1-8b-server", "--duration", "20", "--rate", "4"]
    args += ["--engine-speedup", "20", "--out", str(out)] + (["--smoke"] if smoke else [])
    proc = run_cli(args, timeout=240)
    doc = json.loads((out / "run.json").read_text())
    checks = {c["name"]: c for c in doc["verdict"]["checks"]}
    assert checks["min_duration"]["passed"] is False and checks["min_duration"]["limit"] == 600
    summary = (out / "mlperf_log_summary.txt").read_text()
    assert "Result is : INVALID" in summary and "Min duration satisfied : NO" in summary
    verdict_line = proc.stdout.strip().splitlines()[-1]
    if not smoke:
        assert proc.returncode == 11 and doc["verdict"]["status"] == "invalid", verdict_line
        assert checks["min_duration"]["blocking"] is True
        assert "smoke" not in verdict_line
        return
    # A smoke run is judged on everything else, and every output says it is not a compliant result.
    assert checks["min_duration"]["blocking"] is False and checks["min_queries"]["blocking"] is False
    assert checks["early_stopping.ttft_p99"]["blocking"] is False  # 20 s cannot prove a p99: reported
    assert proc.returncode == 0 and doc["verdict"]["status"] == "pass", verdict_line
    assert "[smoke run: not a compliant result]" in verdict_line
    assert doc["config"]["judging"]["smoke"] is True and doc["notes"][0].startswith("smoke run (--smoke)")
    assert "smoke run (--smoke)" in summary and "smoke run (--smoke)" in (out / "report.html").read_text()


def test_the_run_length_for_a_percentile_follows_early_stopping_and_the_arrivals_spread() -> None:
    assert evidence_requests(0.99) == 459 and evidence_requests(0.9) == 44  # LoadGen, no sample over
    # Poisson at 10/s: 459 + 2·sqrt(~500) more, then the default warm-up (10 %) on top.
    judged = judged_seconds_for(459, 10.0)
    assert 459 / 10 < judged < 53 and evidence_duration_s(0.99, 10.0) == pytest.approx(judged / 0.9, abs=1.5)
    # Burstier arrivals need longer for the same evidence; an explicit warm-up of 0 needs no extra.
    assert judged_seconds_for(459, 10.0, cv=4.0) > 1.25 * judged
    assert evidence_duration_s(0.99, 10.0, warmup=0) == float(int(judged) + 1)


def test_the_drain_lets_an_endpoint_that_meets_the_slos_finish_its_longest_answer() -> None:
    """DeepSeek-R1 answers of up to 20,000 tokens at the 80 ms TPOT limit take ~1,600 s: a 60 s drain
    counted 107 of 603 of them as the endpoint's timeouts in a 600 s default run."""
    r1, _ = load_profile("mlperf-deepseek-r1-server")
    longest = max(longest_output(sc.output_tokens) or 0 for sc in r1.scenarios)
    assert drain_timeout_for(r1) == math.ceil((2.0 + longest * 0.080) * 1.1)
    chat, _ = load_profile("long-context-agent")  # an E2E limit of 15 s: the 60 s floor
    assert drain_timeout_for(chat) == 60.0
    assert drain_timeout_for(load_profile("interactive-chat")[0]) == 60.0  # no latency SLO
    set_by_user = r1.model_copy(update={"client": r1.client.model_copy(update={"drain_timeout_s": 5.0})})
    set_by_user.client.model_fields_set.add("drain_timeout_s")
    assert drain_timeout_for(set_by_user) == 5.0


@pytest.mark.parametrize(("name", "speedup"), V6_RUNS.items())
def test_each_v6_system_profile_runs_against_the_engine_with_a_valid_verdict(
    name: str, speedup: int, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ["run", "--profile", name, "--duration", "4", "--smoke", "--engine-speedup", str(speedup)]
    proc = run_cli([*args, "--out", str(out), "--no-telemetry"], timeout=240)
    run = json.loads((out / "run.json").read_text())
    said = proc.stdout[-1500:] + proc.stderr[-1500:]
    assert proc.returncode == run["verdict"]["exit_code"], said
    checks = {c["name"]: c for c in run["verdict"]["checks"]}
    if run["verdict"]["status"] == "slo_missed":  # nothing else failed: only a latency percentile
        # ... which the engine meets on a quiet machine; a busy one (an engine compiling beside the
        # suite) holds the generator up too, and its own schedule lag says so
        assert run["metrics"]["generator"]["schedule_lag_p99_ms"] > 5, said
    elif (md := checks.get("merged_delivery")) and md["blocking"] and not md["passed"]:  # a generator
        # held up that long reads a stream's events together, and the verdict must say it was the
        # generator, not a proxy; nothing else may fail
        assert md["detail"].startswith("the load generator fell behind"), said
        assert failed_only_on_delivery(run), said
    else:
        assert proc.returncode == 0, said
    assert checks["min_duration"]["limit"] == 600 and checks["min_duration"]["blocking"] is False
    assert run["metrics"]["requests"]["ok"] > 0 and run["metrics"]["requests"]["failed"] == 0
