"""SGLang: `python -m sglang.launch_server`, or prefill/decode servers behind `sglang_router`."""

from __future__ import annotations

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

BOOTSTRAP_PORT_OFFSET = 100  # prefill i listens for KV bootstrap on port + 100 + i (default 8998 would clash)
VERSION_CODE = "import importlib.metadata as m; print(m.version('sglang'))"


def engine_flags(preset: Preset, inst: Instance) -> list[str]:
    """SGLang server arguments for one instance (also what `python -m dynamo.sglang` takes)."""
    s = preset.serving
    f = [
        "--tp", str(inst.tp),  # tensor-parallel GPUs of the instance
        "--max-running-requests", str(s.max_num_seqs),  # most requests decoding at once
        "--chunked-prefill-size", str(s.max_num_batched_tokens),  # prefill chunk (token budget)
        # weights + KV pool as a share of GPU memory; SGLang counts activations apart, hence 0.05 less
        "--mem-fraction-static", f"{max(0.05, s.gpu_memory_utilization - 0.05):.2f}",
        "--enable-metrics",  # Prometheus /metrics (off by default)
    ]  # fmt: skip
    if inst.ep:
        f += ["--ep-size", str(inst.tp)]  # MoE experts split over the instance's GPUs
    if not s.prefix_caching:
        f.append("--disable-radix-cache")  # the radix (prefix) cache is on by default
    if s.kv_cache_dtype != "auto":
        f += ["--kv-cache-dtype", "fp8_e4m3" if s.kv_cache_dtype == "fp8" else s.kv_cache_dtype]
    if preset.max_model_len:
        f += ["--context-length", str(preset.max_model_len)]
    if parser := preset.reasoning_parser.get("sglang"):
        f += ["--reasoning-parser", parser]
    return f + preset.engine_args.get("sglang", [])


def build(preset: Preset, layout: Layout, opts: LaunchOptions) -> LaunchPlan:
    server = program(opts, [opts.python, "-m", "sglang.launch_server"])
    gpu_sets = assign_gpus(layout, opts.gpu_ids)
    url = local_url(opts.host, opts.port)
    common = plan_fields("sglang", preset, layout, url, program(opts, [opts.python, "-c", VERSION_CODE]))
    if layout.instance is not None:
        argv = [*server, "--model-path", preset.model, "--host", opts.host, "--port", str(opts.port)]
        argv += engine_flags(preset, layout.instance) + opts.extra_args
        proc = server_proc(argv, gpu_sets[0], opts.port, url)
        return LaunchPlan(
            processes=[proc], metrics_urls=[url + "/metrics"],
            version_urls=[url + "/version", url + "/get_server_info"], **common,
        )  # fmt: skip
    procs: list[ProcSpec] = []
    router = [*program(opts, [opts.python, "-m", "sglang_router.launch_router"]), "--pd-disaggregation"]
    for w in disagg_workers(layout, gpu_sets):
        port = opts.port + 1 + w.index
        wurl = local_url("127.0.0.1", port)
        argv = [*server, "--model-path", preset.model, "--host", "127.0.0.1", "--port", str(port)]
        argv += engine_flags(preset, w.inst)
        argv += ["--disaggregation-mode", w.role, "--disaggregation-transfer-backend", "nixl"]
        if w.role == "prefill":
            bootstrap = opts.port + BOOTSTRAP_PORT_OFFSET + w.index
            argv += ["--disaggregation-bootstrap-port", str(bootstrap)]  # decode fetches KV via this port
            router += ["--prefill", wurl, str(bootstrap)]
        else:
            router += ["--decode", wurl]
        argv += opts.extra_args
        procs.append(
            ProcSpec(w.name, w.role, argv, gpu_env(w.gpus), port, wurl + "/health", wurl + "/metrics", w.gpus)
        )
    router += ["--host", opts.host, "--port", str(opts.port)] + opts.router_args
    procs.append(ProcSpec("router", "router", router, {}, opts.port, url + "/health"))
    first = local_url("127.0.0.1", procs[0].port or 0)
    return LaunchPlan(
        processes=procs,
        metrics_urls=[p.metrics_url for p in procs if p.metrics_url],
        version_urls=[first + "/version", first + "/get_server_info"],
        ready="models",
        notes=["router: sglang-router (pip install sglang-router); KV moves over NIXL (pip install nixl)"],
        **common,
    )
