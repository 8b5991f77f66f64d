"""TensorRT-LLM: `trtllm-serve` (PyTorch backend), or context/generation servers behind `trtllm-serve disaggregated`."""

from __future__ import annotations

from typing import Any

import yaml

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

VERSION_CODE = "import importlib.metadata as m; print(m.version('tensorrt_llm'))"
METRICS_PATH = "/prometheus/metrics"  # trtllm-serve's Prometheus endpoint


def llm_api_options(preset: Preset, inst: Instance, role: str, full: bool = False) -> dict[str, Any]:
    """The LLM-API options file (`--extra_llm_api_options`, or Dynamo's `--extra-engine-args` with
    ``full``: then parallelism and batch limits are in it too, since there are no CLI flags for them)."""
    s = preset.serving
    kv: dict[str, Any] = {
        "free_gpu_memory_fraction": s.gpu_memory_utilization,  # share of free memory for the KV cache
        "enable_block_reuse": s.prefix_caching,  # prefix (block) reuse across requests
    }
    if s.kv_cache_dtype != "auto":
        kv["dtype"] = s.kv_cache_dtype
    opts: dict[str, Any] = {
        "return_perf_metrics": True,  # request metrics on /prometheus/metrics
        "enable_iter_perf_stats": True,  # iteration metrics (running/waiting requests, KV use) there too
        "kv_cache_config": kv,
    }
    if full:
        opts.update(
            backend="pytorch",
            tensor_parallel_size=inst.tp,
            max_batch_size=s.max_num_seqs,
            max_num_tokens=s.max_num_batched_tokens,
        )
        if inst.ep:
            opts["moe_expert_parallel_size"] = inst.tp
        if preset.max_model_len:
            opts["max_seq_len"] = preset.max_model_len
    if role in ("prefill", "decode"):
        # KV cache transfer between context and generation servers (DEFAULT picks NIXL/UCX)
        opts["cache_transceiver_config"] = {
            "backend": "DEFAULT",
            "max_tokens_in_buffer": s.max_num_batched_tokens,
        }
    if role == "prefill":
        opts["disable_overlap_scheduler"] = True  # not supported on context servers
    return opts


def serve_flags(preset: Preset, inst: Instance) -> list[str]:
    s = preset.serving
    f = [
        "--backend", "pytorch",  # the PyTorch flow: no engine build step
        "--tp_size", str(inst.tp),  # tensor-parallel GPUs of the instance
        "--max_batch_size", str(s.max_num_seqs),  # most requests in flight in a step
        "--max_num_tokens", str(s.max_num_batched_tokens),  # token budget of a step
        "--kv_cache_free_gpu_memory_fraction", f"{s.gpu_memory_utilization:g}",
    ]  # fmt: skip
    if inst.ep:
        f += ["--ep_size", str(inst.tp)]  # MoE experts split over the instance's GPUs
    if preset.max_model_len:
        f += ["--max_seq_len", str(preset.max_model_len)]
    if parser := preset.reasoning_parser.get("trtllm"):
        f += ["--reasoning_parser", parser]
    return f + preset.engine_args.get("trtllm", [])


def dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def build(preset: Preset, layout: Layout, opts: LaunchOptions) -> LaunchPlan:
    serve = program(opts, ["trtllm-serve"])
    gpu_sets = assign_gpus(layout, opts.gpu_ids)
    url = local_url(opts.host, opts.port)
    common = plan_fields("trtllm", preset, layout, url, program(opts, [opts.python, "-c", VERSION_CODE]))
    files: dict[str, str]
    if layout.instance is not None:
        files = {"llm_api_options.yaml": dump(llm_api_options(preset, layout.instance, "server"))}
        argv = [*serve, preset.model, "--host", opts.host, "--port", str(opts.port)]
        argv += serve_flags(preset, layout.instance)
        argv += ["--extra_llm_api_options", str(opts.workdir / "llm_api_options.yaml")] + opts.extra_args
        proc = server_proc(argv, gpu_sets[0], opts.port, url, METRICS_PATH)
        return LaunchPlan(processes=[proc], metrics_urls=[url + METRICS_PATH], files=files, **common)
    procs: list[ProcSpec] = []
    files = {}
    servers: dict[str, list[str]] = {"prefill": [], "decode": []}
    for w in disagg_workers(layout, gpu_sets):
        port = opts.port + 1 + w.index
        wurl = local_url("127.0.0.1", port)
        fname = "ctx_llm_api_options.yaml" if w.role == "prefill" else "gen_llm_api_options.yaml"
        files[fname] = dump(llm_api_options(preset, w.inst, w.role))
        argv = [*serve, preset.model, "--host", "127.0.0.1", "--port", str(port)] + serve_flags(
            preset, w.inst
        )
        argv += ["--extra_llm_api_options", str(opts.workdir / fname)] + opts.extra_args
        servers[w.role].append(f"127.0.0.1:{port}")
        procs.append(
            ProcSpec(
                w.name, w.role, argv, gpu_env(w.gpus), port, wurl + "/health", wurl + METRICS_PATH, w.gpus
            )
        )
    files["disagg_config.yaml"] = dump(
        {
            "hostname": opts.host,
            "port": opts.port,
            "backend": "pytorch",
            "context_servers": {"num_instances": len(servers["prefill"]), "urls": servers["prefill"]},
            "generation_servers": {"num_instances": len(servers["decode"]), "urls": servers["decode"]},
        }
    )
    router = [*serve, "disaggregated", "-c", str(opts.workdir / "disagg_config.yaml")] + opts.router_args
    procs.append(ProcSpec("router", "router", router, {}, opts.port, url + "/health"))
    return LaunchPlan(
        processes=procs,
        metrics_urls=[p.metrics_url for p in procs if p.metrics_url],
        files=files,
        ready="models",
        notes=[
            "context (prefill) and generation (decode) servers; the disaggregated server routes between them"
        ],
        **common,
    )
