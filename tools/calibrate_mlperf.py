"""The engine's output tokens/s per GPU for MLPerf v6.0's DeepSeek-R1 and Llama 3.1 405B on GB300 NVL72,
beside the published figures: the step clock at steady state (docs/engine.md, "Calibration")."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from loadtest.sim.clock import draft_time_s, step_cost
from loadtest.sim.presets import EngineConfig, get_gpu, get_model, get_system
from loadtest.sim.spec_decode import SpecDecode

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    """One benchmark: model, layout on the rack, mean lengths, the Server TPOT limit, published figures."""

    name: str
    model: str
    tp: int
    ep: int
    input_mean: float
    output_mean: float
    tpot_limit_s: float
    server_published: float
    offline_published: float
    spec: SpecDecode = SpecDecode()


def _lognormal_mean(dist: dict[str, float]) -> float:
    return float(dist["median"]) * math.exp(float(dist["sigma"]) ** 2 / 2)


def _deepseek_case(spec: SpecDecode) -> Case:
    prof = yaml.safe_load((ROOT / "traffic_profiles" / "mlperf-deepseek-r1-server.yaml").read_text())
    return Case(
        "DeepSeek-R1",
        "deepseek-r1",
        tp=1,
        ep=72,
        input_mean=_lognormal_mean(prof["input_tokens"]),
        output_mean=3886.0,  # MLPerf's reference mean output (docs/sources.md §1)
        tpot_limit_s=0.080,  # Server p99 TPOT (docs/sources.md §1)
        server_published=8064.0,
        offline_published=9821.0,
        spec=spec,
    )


def _llama_case() -> Case:
    return Case(
        "Llama 3.1 405B",
        "llama-3.1-405b-nvfp4",
        tp=8,
        ep=1,
        input_mean=9400.0,  # estimate: no shipped profile; MLPerf's long-context tasks
        output_mean=685.0,  # MLPerf's reference mean output (docs/sources.md §1)
        tpot_limit_s=0.175,
        server_published=259.0,
        offline_published=271.0,
    )


def steady(cfg: EngineConfig, per_gpu: int, case: Case) -> tuple[float, float]:
    """(output tokens/s per GPU, TPOT s) of a steady batch of ``per_gpu`` requests a GPU at the mean
    context (input + half the output), with the prompts of the requests that finish each step
    prefilled in that step (chunked prefill), and the drafts of speculative decoding."""
    n = per_gpu * cfg.gpus
    ctx = int(case.input_mean + case.output_mean / 2)
    per_step = case.spec.expected_tokens_per_step() if case.spec.enabled else 1.0
    items = [(1 + case.spec.k, ctx)] * n
    prefill = int(n * per_step / case.output_mean * case.input_mean)
    if prefill:
        items.append((prefill, 0))
    t = step_cost(cfg, items).total_s + draft_time_s(cfg, [ctx] * n)
    return n * per_step / t / cfg.gpus, t / per_step


def table(case: Case, system: str) -> dict[str, float]:
    """Offline: the most requests a GPU the KV cache holds (at most 1,024 a group); Server: the
    most tokens/s whose TPOT stays within the limit."""
    cfg = EngineConfig(
        gpu=get_gpu(get_system(system).gpu),
        model=get_model(case.model),
        tp=case.tp,
        ep=case.ep,
        system=get_system(system),
        spec=case.spec,
    )
    kv_per_gpu = cfg.kv_capacity_tokens / cfg.gpus
    limit = max(1, min(1024 // case.tp, int(kv_per_gpu / (case.input_mean + case.output_mean))))
    offline, _ = steady(cfg, limit, case)
    server = 0.0
    for b in range(1, limit + 1):
        tps, tpot = steady(cfg, b, case)
        if tpot <= case.tpot_limit_s:
            server = max(server, tps)
    return {"server": server, "offline": offline, "batch_limit": float(limit)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--system", default="GB300-NVL72")
    p.add_argument("--mtp", default="3:0.7", help="DeepSeek-R1's multi-token prediction K:A (0:0 for off)")
    args = p.parse_args(argv)
    k, _, a = args.mtp.partition(":")
    cases = [_deepseek_case(SpecDecode(int(k), float(a or 0))), _llama_case()]
    print(
        f"| benchmark on {args.system} | engine Server | MLPerf v6.0 Server | engine Offline | MLPerf v6.0 Offline |"
    )
    print("|---|---|---|---|---|")
    for case in cases:
        r = table(case, args.system)
        gap_s = r["server"] / case.server_published - 1
        gap_o = r["offline"] / case.offline_published - 1
        print(
            f"| {case.name} (tp {case.tp}, ep {case.ep}{', MTP ' + args.mtp if case.spec.enabled else ''}) "
            f"| {r['server']:,.0f} ({gap_s:+.0%}) | {case.server_published:,.0f} "
            f"| {r['offline']:,.0f} ({gap_o:+.0%}) | {case.offline_published:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
