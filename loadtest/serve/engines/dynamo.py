"""NVIDIA Dynamo: `python -m dynamo.frontend` plus `dynamo.vllm` / `dynamo.sglang` / `dynamo.trtllm` workers."""

from __future__ import annotations

from loadtest.serve.engines import sglang, trtllm, vllm
from loadtest.serve.plan import (
    LaunchOptions,
    LaunchPlan,
    ProcSpec,
    Worker,
    assign_gpus,
    disagg_workers,
    gpu_env,
    local_url,
    plan_fields,
    program,
)
from loadtest.serve.presets import Instance, Layout, Preset

BACKENDS = ("vllm", "sglang", "trtllm")
VERSION_CODE = "import importlib.metadata as m; print(m.version('ai-dynamo'))"
SYSTEM_PORT_OFFSET = 1  # worker i serves /health and /metrics on DYN_SYSTEM_PORT = port + 1 + i


def worker_argv(
    preset: Preset, inst: Instance, role: str, opts: LaunchOptions, index: int, files: dict[str, str]
) -> list[str]:
    """One worker; ``role`` is server (aggregated), prefill or decode."""
    py = program(opts, [opts.python])
    backend = opts.dynamo_backend
    if backend == "vllm":
        argv = [*py, "-m", "dynamo.vllm", "--model", preset.model] + vllm.engine_flags(preset, inst)
    elif backend == "sglang":
        argv = [*py, "-m", "dynamo.sglang", "--model-path", preset.model, "--served-model-name", preset.model]
        argv += sglang.engine_flags(preset, inst)
        if role != "server":
            argv += ["--disaggregation-transfer-backend", "nixl"]
            argv += ["--disaggregation-bootstrap-port", str(opts.port + sglang.BOOTSTRAP_PORT_OFFSET + index)]
    else:
        fname = f"{role}_engine_args.yaml" if role != "server" else "engine_args.yaml"
        files[fname] = trtllm.dump(trtllm.llm_api_options(preset, inst, role, full=True))
        argv = [*py, "-m", "dynamo.trtllm", "--model-path", preset.model, "--served-model-name", preset.model]
        argv += ["--extra-engine-args", str(opts.workdir / fname)]
    if role != "server":
        argv += ["--disaggregation-mode", role]  # this worker only prefills, or only decodes
    return argv + opts.extra_args


def build(preset: Preset, layout: Layout, opts: LaunchOptions) -> LaunchPlan:
    if opts.dynamo_backend not in BACKENDS:
        raise ValueError(f"--dynamo-backend {opts.dynamo_backend!r}: one of {', '.join(BACKENDS)}")
    gpu_sets = assign_gpus(layout, opts.gpu_ids)
    url = local_url(opts.host, opts.port)
    files: dict[str, str] = {}
    workers = (
        [Worker(0, "server", "worker", layout.instance, gpu_sets[0])]
        if layout.instance
        else disagg_workers(layout, gpu_sets)
    )
    procs: list[ProcSpec] = []
    for w in workers:
        system_port = opts.port + SYSTEM_PORT_OFFSET + w.index
        env = {**gpu_env(w.gpus), "DYN_SYSTEM_PORT": str(system_port)}
        if opts.dynamo_backend == "vllm" and w.role != "server":
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(vllm.NIXL_SIDE_CHANNEL_BASE + 16 * w.index)
        wurl = local_url("127.0.0.1", system_port)
        argv = worker_argv(preset, w.inst, w.role, opts, w.index, files)
        procs.append(ProcSpec(w.name, "worker" if w.role == "server" else w.role, argv, env, system_port, None,
                              wurl + "/metrics", w.gpus))  # fmt: skip
    # The frontend: OpenAI HTTP API, tokenization, routing to the registered workers (round robin by
    # default; `--router-args "--router-mode kv"` routes by KV-cache overlap).
    front = [*program(opts, [opts.python]), "-m", "dynamo.frontend", "--http-port", str(opts.port)]
    front += opts.router_args
    procs.insert(0, ProcSpec("frontend", "frontend", front, {}, opts.port, url + "/health", url + "/metrics"))
    common = plan_fields("dynamo", preset, layout, url, program(opts, [opts.python, "-c", VERSION_CODE]))
    common["layout"]["backend"] = opts.dynamo_backend
    return LaunchPlan(
        processes=procs,
        metrics_urls=[p.metrics_url for p in procs if p.metrics_url],
        files=files,
        ready="models",  # the frontend answers /health before any worker has registered
        notes=[
            f"backend {opts.dynamo_backend}; workers register with the frontend through Dynamo's discovery "
            "(etcd + NATS on releases that need them: start those first)",
            "the frontend binds all interfaces",
        ],
        **common,
    )
