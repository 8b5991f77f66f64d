"""The engine's output tokens/s per GPU for MLPerf v6.0's DeepSeek-R1 and Llama 3.1 405B on GB300 NVL72, and for
v5.1's DeepSeek-R1 as that round ran it, beside the published figures: the step clock at steady state
(docs/engine.md, "Calibration")."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from loadtest.sim.clock import draft_time_s, step_cost
from loadtest.sim.presets import EngineConfig, ModelSpec, get_gpu, get_model, get_system
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
    round: str = "v6.0"  # the MLPerf Inference round of the published figures
    nvfp4_experts: bool = False  # the routed experts in NVFP4 (the preset's otherwise)
    kv_bytes: int = 2  # bytes a KV element: 2 (bf16, the engine's default), 1 (an FP8 KV cache)


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


# MLPerf Inference v5.1, NVIDIA's GB300 NVL72 DeepSeek-R1 submission (docs/sources.md §29): its Server log's
# completed samples/s, mean latency and mean time per output token.
V51_SERVER_SAMPLES_S = 56.95
V51_SERVER_MEAN_LATENCY_S = 233.104690927
V51_SERVER_MEAN_TPOT_S = 0.063719543
NVFP4_BYTES = 0.5625  # 4-bit values with one FP8 scale per 16 (models.yaml, Llama-3.1-405B-NVFP4)


def _deepseek_v51_case() -> Case:
    """DeepSeek-R1 as v5.1 ran it: 8-GPU instances (attention data-parallel, experts over the 8), NVFP4
    experts, FP8 KV cache, no MTP, aggregated; 2,907 / 5,842 tokens/s per GPU (docs/sources.md §29)."""
    return dataclasses.replace(
        _deepseek_case(SpecDecode()),
        ep=8,
        server_published=2907.0,
        offline_published=5842.0,
        round="v5.1",
        nvfp4_experts=True,
        kv_bytes=1,
    )


def v51_server_load(gpus: int = 72) -> float:
    """Requests in flight a GPU during v5.1's Server run (Little's law on its log: completed samples/s ×
    mean latency ÷ GPUs)."""
    return V51_SERVER_SAMPLES_S * V51_SERVER_MEAN_LATENCY_S / gpus


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


def model_of(case: Case) -> ModelSpec:
    """The case's model preset; with ``nvfp4_experts`` its routed experts in NVFP4 at the GPU's FP4 peak
    (the dense layers keep the preset's bytes)."""
    model = get_model(case.model)
    if case.nvfp4_experts:
        model = dataclasses.replace(model, expert_bytes_per_param=NVFP4_BYTES, weight_dtype="nvfp4")
    return model


def config(case: Case, system: str) -> EngineConfig:
    return EngineConfig(
        gpu=get_gpu(get_system(system).gpu),
        model=model_of(case),
        tp=case.tp,
        ep=case.ep,
        system=get_system(system),
        spec=case.spec,
        kv_bytes_per_elem=case.kv_bytes,
    )


def table(case: Case, system: str) -> dict[str, float]:
    """Offline: the most requests a GPU the KV cache holds (at most 1,024 a group); Server: the
    most tokens/s whose TPOT stays within the limit."""
    cfg = config(case, system)
    kv_per_gpu = cfg.kv_capacity_tokens / cfg.gpus
    limit = max(1, min(1024 // case.tp, int(kv_per_gpu / (case.input_mean + case.output_mean))))
    offline, _ = steady(cfg, limit, case)
    server = 0.0
    for b in range(1, limit + 1):
        tps, tpot = steady(cfg, b, case)
        if tpot <= case.tpot_limit_s:
            server = max(server, tps)
    return {"server": server, "offline": offline, "batch_limit": float(limit)}


def _layout(case: Case, mtp: str) -> str:
    parts = [f"tp {case.tp}", f"ep {case.ep}"]
    parts.append(f"MTP {mtp}" if case.spec.enabled else "no MTP")
    if case.nvfp4_experts:
        parts.append("NVFP4 experts")
    if case.kv_bytes == 1:
        parts.append("FP8 KV")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--system", default="GB300-NVL72")
    p.add_argument("--mtp", default="3:0.7", help="DeepSeek-R1's multi-token prediction K:A (0:0 for off)")
    p.add_argument(
        "--deepseek-nvfp4",
        action="store_true",
        help="the v6.0 DeepSeek-R1 row at v5.1's precision (NVFP4 experts, FP8 KV) instead of the FP8 preset's",
    )
    args = p.parse_args(argv)
    k, _, a = args.mtp.partition(":")
    deepseek = _deepseek_case(SpecDecode(int(k), float(a or 0)))
    if args.deepseek_nvfp4:
        deepseek = dataclasses.replace(deepseek, nvfp4_experts=True, kv_bytes=1)
    cases = [deepseek, _llama_case(), _deepseek_v51_case()]
    print(
        f"| benchmark on {args.system} | round | engine Server | MLPerf Server | engine Offline | MLPerf Offline |"
    )
    print("|---|---|---|---|---|---|")
    for case in cases:
        r = table(case, args.system)
        gap_s = r["server"] / case.server_published - 1
        gap_o = r["offline"] / case.offline_published - 1
        print(
            f"| {case.name} ({_layout(case, args.mtp)}) | {case.round} "
            f"| {r['server']:,.0f} ({gap_s:+.0%}) | {case.server_published:,.0f} "
            f"| {r['offline']:,.0f} ({gap_o:+.0%}) | {case.offline_published:,.0f} |"
        )
    v51 = cases[-1]
    load = v51_server_load(get_system(args.system).gpus)
    tps, tpot = steady(config(v51, args.system), round(load), v51)
    print()
    print(
        f"v5.1 Server at its own load ({load:.0f} requests a GPU: {V51_SERVER_SAMPLES_S} samples/s x "
        f"{V51_SERVER_MEAN_LATENCY_S:.1f} s mean latency / {get_system(args.system).gpus} GPUs): engine TPOT "
        f"{tpot * 1e3:.1f} ms, {tps:,.0f} tokens/s a GPU; the run's mean TPOT {V51_SERVER_MEAN_TPOT_S * 1e3:.1f} ms, "
        f"{v51.server_published:,.0f} tokens/s a GPU: its step took {V51_SERVER_MEAN_TPOT_S / tpot:.2f}x the clock's"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
