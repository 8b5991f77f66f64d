"""Build a ready server from options: device, weights, tokenizer, KV cache, scheduler, engine and app."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loadtest.tokens.tokenizer import Tokenizer
from servers.torch_ref.api import Dispatcher, ServerState
from servers.torch_ref.config import ConfigError, ModelConfig, load_config
from servers.torch_ref.engine import Engine
from servers.torch_ref.kv_cache import SlotKVCache, slots_that_fit
from servers.torch_ref.metrics import TorchRefMetrics
from servers.torch_ref.model import LlamaModel, Weights
from servers.torch_ref.scheduler import Scheduler, SchedulerConfig
from servers.torch_ref.text import end_token_ids, vocab_size, word_vocabulary
from servers.torch_ref.weights import load_hf_checkpoint, random_weights

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GB = 1 << 30


@dataclass(frozen=True)
class ServerOptions:
    config: str | None = (
        None  # preset name, config.json path or checkpoint folder (None: tiny, or the checkpoint's)
    )
    checkpoint: str | None = None  # HF folder (safetensors), a .gguf file, or "smollm2"
    device: str = "cpu"
    dtype: str | None = None  # None: bfloat16 on cuda, float32 on cpu
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.9
    kv_cache_gb: float | None = None  # the KV budget outright (default on cpu: 1 GiB)
    seed: int = 0
    served_model_name: str | None = None
    tokenizer: str | None = None
    output_vocab: str = "auto"  # auto | words | full


def _device(name: str) -> torch.device:
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device {name}: torch {torch.__version__} sees no CUDA device (use --device cpu)"
            )
        return torch.device(name)
    if name != "cpu":
        raise ConfigError(f"--device {name}: use cpu or cuda[:N]")
    return torch.device("cpu")


def _weights(
    opts: ServerOptions, device: torch.device, dtype: torch.dtype
) -> tuple[ModelConfig, Weights, str]:
    """The model config, its weights and where they came from."""
    ckpt = opts.checkpoint
    if ckpt is None:
        cfg = load_config(opts.config or "tiny", opts.tokenizer)
        return cfg, random_weights(cfg, device, dtype, opts.seed), f"random (seed {opts.seed})"
    from servers.torch_ref.gguf import is_gguf, load_gguf

    if is_gguf(ckpt):
        cfg, weights = load_gguf(ckpt, device, dtype, opts.tokenizer)
        return cfg, weights, f"gguf {ckpt}"
    folder = Path(ckpt).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"--checkpoint {ckpt}: not a folder, a .gguf file or 'smollm2'")
    cfg = load_config(opts.config or str(folder), opts.tokenizer)
    return cfg, load_hf_checkpoint(cfg, folder, device, dtype), f"checkpoint {folder}"


def build_state(opts: ServerOptions) -> ServerState:
    t0 = time.perf_counter()
    device = _device(opts.device)
    dtype_name = opts.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if dtype_name not in DTYPES:
        raise ConfigError(f"--dtype {dtype_name}: use one of {', '.join(DTYPES)}")
    dtype = DTYPES[dtype_name]
    torch.manual_seed(opts.seed)
    cfg, weights, source = _weights(opts, device, dtype)
    try:
        tok = Tokenizer(cfg.tokenizer)
    except ValueError as e:
        raise ConfigError(f"tokenizer: {e}") from None
    if vocab_size(tok) > cfg.vocab_size:
        raise ConfigError(
            f"tokenizer {tok.name} has {vocab_size(tok)} tokens, more than the model's vocab_size {cfg.vocab_size}"
        )
    max_len = min(opts.max_model_len, cfg.max_position_embeddings)
    elem = torch.finfo(dtype).bits // 8
    if opts.kv_cache_gb is not None:
        budget = opts.kv_cache_gb * GB
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        act = opts.max_num_batched_tokens * (cfg.hidden_size * 6 + cfg.intermediate_size * 3) * elem
        act += max(opts.max_num_seqs, 64) * cfg.vocab_size * 4 * 3  # logits, float32, a few copies
        budget = free - (1 - opts.gpu_memory_utilization) * total - act - 1 * GB
    else:
        budget = 1 * GB
    slots = slots_that_fit(cfg, max_len, elem, budget, opts.max_num_seqs)
    if slots < 1:
        raise ConfigError(
            f"the KV cache budget ({budget / GB:.2f} GiB) does not hold one sequence of --max-model-len {max_len}: "
            "lower --max-model-len or raise --kv-cache-gb / --gpu-memory-utilization"
        )
    cache = SlotKVCache(cfg, slots, max_len, device, dtype)
    model = LlamaModel(cfg, weights, cache)
    vocab_mode = opts.output_vocab
    if vocab_mode == "auto":
        vocab_mode = "words" if opts.checkpoint is None else "full"
    if vocab_mode not in ("words", "full"):
        raise ConfigError(f"--output-vocab {opts.output_vocab}: use auto, words or full")
    allowed = word_vocabulary(tok, cfg.vocab_size) if vocab_mode == "words" else None
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=opts.max_num_seqs,
            max_num_batched_tokens=opts.max_num_batched_tokens,
            num_slots=slots,
            max_model_len=max_len,
        )
    )
    dispatcher = Dispatcher()
    engine = Engine(
        model, sched, dispatcher.deliver, end_token_ids(tok, cfg.eos_token_ids), allowed, opts.seed
    )
    name = opts.served_model_name or cfg.name
    info: dict[str, Any] = {
        "model": cfg.describe(),
        "weights": source,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": dtype_name,
        "torch": torch.__version__,
        "tokenizer": tok.name,
        "output_vocab": f"{vocab_mode} ({len(allowed)} ids)" if allowed is not None else vocab_mode,
        "max_num_seqs": opts.max_num_seqs,
        "max_num_batched_tokens": opts.max_num_batched_tokens,
        "max_model_len": max_len,
        "kv_slots": slots,
        "kv_cache_gib": round(cache.bytes / GB, 3),
        "startup_s": round(time.perf_counter() - t0, 3),
    }
    metrics = TorchRefMetrics(engine, name)
    return ServerState(engine, dispatcher, tok, name, max_len, metrics, info)
