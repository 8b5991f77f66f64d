"""Tests for the simulated engine's presets (YAML data) and its roofline step clock (TP, MoE, precision)."""

from __future__ import annotations

import dataclasses

import pytest

from loadtest.sim.clock import (
    allreduce_time_s,
    decode_step_time_s,
    expert_fraction_touched,
    prefill_time_s,
    step_cost,
    step_time_s,
    t_fixed_s,
)
from loadtest.sim.presets import (
    B200,
    DEEPSEEK_R1,
    GB300,
    GPT_OSS_120B,
    H100_SXM,
    H200_SXM,
    LLAMA_2_70B,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B,
    LLAMA_3_1_405B,
    QWEN3_VL_235B_A22B,
    EngineConfig,
    GpuSpec,
    _make,
    get_gpu,
    get_model,
    list_gpus,
    list_models,
)
from loadtest.tokens.tokenizer import get_tokenizer

CFG = EngineConfig(gpu=H100_SXM, model=LLAMA_3_1_8B)


# ---- presets -----------------------------------------------------------------------------------
def test_every_preset_loads_with_a_source_and_its_aliases_resolve() -> None:
    gpus, models = list_gpus(), list_models()
    assert {"H100-SXM", "H200-SXM", "B200", "GB300"} <= {g.name for g in gpus}
    assert {
        "Llama-3.1-8B",
        "Llama-2-70B",
        "Llama-3.1-70B",
        "Llama-3.1-405B",
        "DeepSeek-R1",
        "GPT-OSS-120B",
        "Qwen3-VL-235B-A22B",
    } <= {m.name for m in models}
    for g in gpus:
        assert len(g.source) > 40 and g.bf16_tflops > 0 and g.hbm_bw_tbs > 0 and g.nvlink_gbs > 0
        assert g.fp8_tflops == pytest.approx(2 * g.bf16_tflops, rel=0.01)
        for name in (g.name, g.name.lower(), g.name.upper(), *g.aliases):
            assert get_gpu(name) is g
        assert g.summary().startswith(g.name)
    for m in models:
        assert len(m.source) > 40 and "config.json" in m.source
        for name in (m.name, m.name.lower(), m.name.upper(), *m.aliases):
            assert get_model(name) is m
        get_tokenizer(m.tokenizer)  # the server loads it: every family must be bundled
        assert 0 < m.active_params_b <= m.params_b
        if m.is_moe:
            # Active ≈ dense part + k/E of the routed experts (active counts leave out the embedding
            # lookup for some models: within 15%).
            est = m.dense_params_b + m.experts_per_token / m.n_experts * m.expert_params_b
            assert est == pytest.approx(m.active_params_b, rel=0.15)
        else:
            assert m.expert_params_b == 0 and m.dense_params_b == m.params_b
        assert m.summary().startswith(m.name)


def test_names_are_case_insensitive_with_aliases() -> None:
    assert get_gpu("h200") is H200_SXM
    assert get_gpu("H200-SXM") is H200_SXM
    assert get_gpu("h200 sxm") is H200_SXM
    assert get_gpu("b200") is B200
    assert get_gpu("Blackwell-Ultra") is GB300
    assert get_model("meta-llama/Llama-3.1-8B-Instruct") is LLAMA_3_1_8B
    assert get_model("llama3.1-8b") is LLAMA_3_1_8B
    assert get_model("LLAMA2-70B") is LLAMA_2_70B
    assert get_model("meta-llama/Llama-3.1-405B-Instruct") is LLAMA_3_1_405B
    assert get_model("deepseek-ai/DeepSeek-R1") is DEEPSEEK_R1
    assert get_model("openai/gpt-oss-120b") is GPT_OSS_120B
    assert get_model("Qwen/Qwen3-VL-235B-A22B-Instruct") is QWEN3_VL_235B_A22B
    fp8 = get_model("meta-llama/Llama-3.1-405B-Instruct-FP8")
    assert fp8.n_layers == LLAMA_3_1_405B.n_layers and fp8.bytes_per_param == 1 and fp8.precision == "fp8"
    thinking = get_model("Qwen/Qwen3-VL-235B-A22B-Thinking")
    assert thinking.reasoning and not QWEN3_VL_235B_A22B.reasoning
    assert thinking.n_experts == QWEN3_VL_235B_A22B.n_experts


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError) as e:
        get_gpu("tpu-v9")
    for g in list_gpus():
        assert g.name in str(e.value)
    assert "h200" in str(e.value)
    with pytest.raises(ValueError) as e:
        get_model("gpt-5")
    for m in list_models():
        assert m.name in str(e.value)


def test_a_preset_without_source_or_with_unknown_fields_is_rejected() -> None:
    base = {"bf16_tflops": 1.0, "fp8_tflops": 2.0, "hbm_bw_tbs": 1.0, "hbm_gb": 1.0}
    with pytest.raises(ValueError, match="no source"):
        _make(GpuSpec, "X", base)
    with pytest.raises(ValueError, match="unknown fields"):
        _make(GpuSpec, "X", {**base, "source": "datasheet", "tflops": 3})


def test_model_shapes_from_config_json() -> None:
    r1 = DEEPSEEK_R1
    assert (r1.n_layers, r1.n_experts, r1.experts_per_token, r1.n_shared_experts) == (61, 256, 8, 1)
    assert r1.reasoning and r1.precision == "fp8" and r1.weight_bytes == pytest.approx(671.03e9)
    # MLA: the cache holds the 512 + 64 latent per token and layer, not 2·128 heads·192.
    assert r1.kv_bytes_per_token(2) == 61 * (512 + 64) * 2
    assert r1.kv_bytes_per_token(1) == 61 * 576
    oss = GPT_OSS_120B
    assert (oss.n_layers, oss.n_heads, oss.n_kv_heads, oss.head_dim) == (36, 64, 8, 64)
    assert (oss.n_experts, oss.experts_per_token, oss.tokenizer) == (128, 4, "o200k_harmony")
    assert oss.reasoning and oss.precision == "mxfp4"
    q = QWEN3_VL_235B_A22B
    assert (q.n_layers, q.n_heads, q.n_kv_heads, q.head_dim, q.n_experts, q.experts_per_token) == (
        94,
        64,
        4,
        128,
        128,
        8,
    )
    l405 = LLAMA_3_1_405B
    assert (l405.n_layers, l405.d_model, l405.n_heads, l405.n_kv_heads, l405.ffn) == (
        126,
        16384,
        128,
        8,
        53248,
    )
    l2 = LLAMA_2_70B
    assert (l2.n_layers, l2.d_model, l2.n_heads, l2.n_kv_heads, l2.ffn) == (80, 8192, 64, 8, 28672)
    assert l2.params_b == pytest.approx(69, rel=0.01)
    # Dense models keep the old property semantics.
    assert LLAMA_3_1_8B.d_attn == 4096 and LLAMA_3_1_8B.kv_bytes_per_token(2) == 131072
    assert LLAMA_3_1_8B.weight_bytes == pytest.approx(8.03e9 * 2, rel=1e-12)


def test_gpt_oss_120b_fits_one_h100() -> None:
    # MXFP4 experts at 4.25 bits + bf16 rest ≈ the 60.8 GiB checkpoint of the model card.
    w = GPT_OSS_120B.weight_bytes
    assert w < 80e9
    assert w == pytest.approx(114.66e9 * 4.25 / 8 + (116.83 - 114.66) * 1e9 * 2)
    assert w / 2**30 == pytest.approx(60.8, rel=0.02)
    assert EngineConfig(model=GPT_OSS_120B).num_kv_blocks > 0


# ---- the docs/sources.md §3 formula, by hand -------------------------------------------------------------
def test_batch1_decode_llama8b_h100_by_hand() -> None:
    # L=32, d_attn=32·128=4096, kv_B=2·32·8·128·2=131072 B, W=8.03e9·2 B; F=989e12, BW=3.35e12.
    t_fixed = 32 * 32e-6 + 126e-6  # 1.150 ms
    flops = 2 * 8.03e9 + 4 * 32 * 4096 * (2000 + 1)  # one token over 2000 cached
    nbytes = 16.06e9 + 131072 * 2001  # 16.322 GB
    mem = nbytes / (0.8 * 3.35e12)  # 6.090 ms
    assert flops / (0.55 * 989e12) < mem
    want = t_fixed + 4e-6 + mem
    assert want == pytest.approx(7.244e-3, rel=1e-3)
    assert decode_step_time_s(CFG, 1, 2000) == pytest.approx(want, rel=1e-12)
    assert t_fixed_s(CFG) == pytest.approx(t_fixed)


def test_itl_at_batch_256_with_2k_contexts_by_hand() -> None:
    b, c = 256, 2048
    flops = 2 * 8.03e9 * b + 4 * 32 * 4096 * b * (c + 1)  # 4.11e12 + 2.75e11
    nbytes = 16.06e9 + 131072 * b * (c + 1)  # 16.06 GB weights + 68.75 GB KV
    compute, mem = flops / (0.55 * 989e12), nbytes / (0.8 * 3.35e12)
    assert compute < mem  # still bandwidth-bound: 8.06 ms vs 31.65 ms
    want = 32 * 32e-6 + 126e-6 + 4e-6 * b + mem
    assert want == pytest.approx(33.82e-3, rel=1e-3)
    assert decode_step_time_s(CFG, b, c) == pytest.approx(want, rel=1e-12)


def test_prefill_time_against_prompt_length() -> None:
    # Compute-bound: ~2·P per token plus the quadratic attention term.
    def by_hand(t: int) -> float:
        flops = 2 * 8.03e9 * t + 4 * 32 * 4096 * t * (t + 1) / 2
        nbytes = 16.06e9 + 131072 * t
        return 32 * 32e-6 + 126e-6 + 4e-6 + max(flops / (0.55 * 989e12), nbytes / (0.8 * 3.35e12))

    for t in (1024, 2048, 4096, 8192):
        assert prefill_time_s(CFG, t) == pytest.approx(by_hand(t), rel=1e-12)
    # Linear-ish: doubling the prompt costs a little more than double (attention), less than 2.3×.
    for t in (1024, 2048, 4096):
        ratio = prefill_time_s(CFG, 2 * t) / prefill_time_s(CFG, t)
        assert 1.9 < ratio < 2.3
    # Above the 8192-token budget the prompt is chunked; later chunks attend over earlier ones.
    assert CFG.max_num_batched_tokens == 8192
    assert prefill_time_s(CFG, 20000) == pytest.approx(
        step_time_s(CFG, [(8192, 0)]) + step_time_s(CFG, [(8192, 8192)]) + step_time_s(CFG, [(3616, 16384)])
    )
    assert prefill_time_s(CFG, 16384) > 2 * prefill_time_s(CFG, 8192)


# ---- tensor parallelism -------------------------------------------------------------------------
def test_tp4_70b_decode_by_hand() -> None:
    cfg = EngineConfig(gpu=H100_SXM, model=LLAMA_3_1_70B, tp=4)
    b, c = 8, 1000
    t_fixed = 32 * 80 * 1e-6 + 126e-6 + 4e-6 * b
    flops = 2 * 70.6e9 * b + 4 * 80 * 8192 * b * (c + 1)
    kv_b = 2 * 80 * 8 * 128 * 2  # 8 KV heads split 2 per GPU: all of them across the group
    nbytes = 70.6e9 * 2 + kv_b * b * (c + 1)
    roof_1 = max(flops / (0.55 * 989e12), nbytes / (0.8 * 3.35e12))  # one GPU doing it all
    roof_4 = max(flops / (0.55 * 989e12 * 4), nbytes / (0.8 * 3.35e12 * 4))  # each GPU a quarter
    # 2 all-reduces per layer of b·8192·2 bytes; ring moves 2·3/4 of it at 0.7 of 450 GB/s one way.
    msg = b * 8192 * 2
    ar = 2 * 80 * (5e-6 + 2 * 3 / 4 * msg / (0.7 * 450e9))
    assert ar == pytest.approx(2 * 80 * 5e-6 + 160 * 1.5 * 131072 / 315e9)
    want = t_fixed + roof_4 + ar
    got = decode_step_time_s(cfg, b, c)
    assert got == pytest.approx(want, rel=1e-12)
    assert allreduce_time_s(cfg, b) == pytest.approx(ar, rel=1e-12)
    assert step_cost(cfg, [(1, c)] * b).allreduce_s == pytest.approx(ar, rel=1e-12)
    assert got < t_fixed + roof_1
    assert allreduce_time_s(EngineConfig(model=LLAMA_3_1_70B), b) == 0.0


def test_kv_per_gpu_under_tp() -> None:
    # KV heads split over TP, replicated when tp > n_kv_heads (Qwen3: 4 KV heads on 8 GPUs).
    assert EngineConfig(model=LLAMA_3_1_70B, tp=4).kv_bytes_per_token_per_gpu == 2 * 80 * 2 * 128 * 2
    q = EngineConfig(model=QWEN3_VL_235B_A22B, tp=8)
    assert q.kv_bytes_per_token_per_gpu == 2 * 94 * 1 * 128 * 2
    # An MLA latent is held whole by every rank.
    r1 = EngineConfig(model=DEEPSEEK_R1, gpu=H200_SXM, tp=8)
    assert r1.kv_bytes_per_token_per_gpu == DEEPSEEK_R1.kv_bytes_per_token(2)
    # KV capacity (docs/sources.md §3): (0.9·HBM − weights/tp − 4 GB) / per-GPU KV bytes, in 16-token blocks.
    assert CFG.num_kv_blocks == int((0.9 * 80e9 - 16.06e9 - 4e9) // 131072) // 16
    assert r1.num_kv_blocks == int((0.9 * 141e9 - 671.03e9 / 8 - 4e9) // (61 * 576 * 2)) // 16
    assert EngineConfig(kv_blocks=100).num_kv_blocks == 100
    assert EngineConfig(model=LLAMA_3_1_405B).num_kv_blocks == 0  # weights do not fit one GPU


# ---- mixture of experts ---------------------------------------------------------------------------
def test_deepseek_r1_expert_bytes() -> None:
    cfg = EngineConfig(gpu=H200_SXM, model=DEEPSEEK_R1, tp=8)
    m = DEEPSEEK_R1
    dense, experts = (m.params_b - m.expert_params_b) * 1e9, m.expert_params_b * 1e9  # fp8: 1 B/param
    one = step_cost(cfg, [(1, 1000)])
    assert one.weight_bytes == pytest.approx(dense + 8 / 256 * experts, rel=1e-9)
    assert one.weight_bytes == pytest.approx(m.active_params_b * 1e9, rel=0.05)  # ≈ active params
    # Batch 512: 1 − (1 − 8/256)^512 ≈ 1 − 9e-8 of the experts are touched.
    big = step_cost(cfg, [(1, 1000)] * 512)
    assert expert_fraction_touched(m, 512) > 0.9999
    assert big.weight_bytes > 0.999 * m.weight_bytes
    # In between, the expected-distinct-experts formula.
    mid = step_cost(cfg, [(1, 1000)] * 16)
    assert mid.weight_bytes == pytest.approx(dense + (1 - (1 - 8 / 256) ** 16) * experts, rel=1e-9)
    # MLA decode attention runs on the absorbed latent: 4·L·128·544 FLOPs per context token.
    assert one.flops == pytest.approx(2 * 37e9 + 4 * 61 * 128 * 544 * 1001)
    assert step_time_s(cfg, [(1, 1000)] * 512) > step_time_s(cfg, [(1, 1000)])


def test_dense_model_bytes_are_all_weights() -> None:
    assert step_cost(CFG, [(1, 0)]).weight_bytes == LLAMA_3_1_8B.weight_bytes
    assert expert_fraction_touched(LLAMA_3_1_8B, 100) == 0.0


# ---- precision and ordering ------------------------------------------------------------------------
def test_flop_rate_follows_weight_precision() -> None:
    assert EngineConfig(model=LLAMA_3_1_8B).peak_flops == 989e12
    assert EngineConfig(model=DEEPSEEK_R1, tp=8).peak_flops == 8 * 1979e12
    assert EngineConfig(model=GPT_OSS_120B, gpu=H100_SXM).peak_flops == 1979e12  # no FP4: FP8 rate
    assert EngineConfig(model=GPT_OSS_120B, gpu=B200).peak_flops == 9000e12
    assert EngineConfig(model=GPT_OSS_120B, gpu=GB300).peak_flops == 15000e12
    assert EngineConfig(model=LLAMA_3_1_8B, gpu=B200).peak_flops == 2250e12


@pytest.mark.parametrize(
    ("model", "tp"), [(LLAMA_3_1_8B, 1), (LLAMA_3_1_70B, 8), (DEEPSEEK_R1, 8), (GPT_OSS_120B, 1)]
)
def test_faster_gpus_decode_faster(model: object, tp: int) -> None:
    def itl(gpu: GpuSpec, batch: int) -> float:
        return decode_step_time_s(EngineConfig(gpu=gpu, model=model, tp=tp), batch, 2048)  # type: ignore[arg-type]

    for batch in (1, 64, 256):
        assert itl(H200_SXM, batch) < itl(H100_SXM, batch)
        assert itl(B200, batch) < itl(H200_SXM, batch)
        assert itl(GB300, batch) <= itl(B200, batch)


# ---- EngineConfig -----------------------------------------------------------------------------------
def test_engine_config_new_fields_and_describe() -> None:
    cfg = EngineConfig()
    assert cfg.gpu_memory_utilization == 0.9 and cfg.kv_blocks is None
    assert cfg.block_size == 16 and cfg.enable_prefix_caching is True
    d = cfg.describe()
    for key in (
        "gpu",
        "model",
        "tp",
        "gpu_memory_utilization",
        "kv_blocks",
        "block_size",
        "enable_prefix_caching",
    ):
        assert key in d
    assert d["gpu_source"] == H100_SXM.source and d["model_source"] == LLAMA_3_1_8B.source
    assert d["kv_blocks"] == cfg.num_kv_blocks
    other = dataclasses.replace(cfg, kv_blocks=64, enable_prefix_caching=False)
    assert other.describe()["kv_blocks"] == 64 and other.describe()["kv_blocks_override"] is True
    for bad in ({"gpu_memory_utilization": 0.0}, {"block_size": 0}, {"kv_blocks": 0}, {"eta_link": 0.0}):
        with pytest.raises(ValueError):
            EngineConfig(**bad)  # type: ignore[arg-type]
