"""A launch plan: the processes (argv, env additions, ports, health and metrics URLs) and files of a server."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.serve.presets import Instance, Layout, Preset


@dataclass
class LaunchOptions:
    """What the command line adds to a preset."""

    gpus: int | None = None
    mode: str = "aggregated"
    host: str = "127.0.0.1"  # the address the front server binds; workers behind a router bind loopback
    port: int = 8000
    extra_args: list[str] = field(default_factory=list)  # appended to every engine instance's argv
    router_args: list[str] = field(default_factory=list)  # appended to the router / frontend argv
    executable: str | None = None  # replaces the program of every process (a stand-in, or another venv)
    python: str = "python3"  # the interpreter for `python -m ...` engines
    gpu_ids: list[str] | None = None  # physical GPU ids to hand out (default: 0..N-1)
    dynamo_backend: str = "vllm"
    workdir: Path = Path(".")  # where config files and logs go
    model: str | None = None  # replaces the preset's model: a local folder or a hub id
    cpu_cores: str | None = None  # CPU presets: the cores the engine's threads are bound to, e.g. 1 or 0-3


@dataclass
class ProcSpec:
    """One process of a server."""

    name: str  # server, prefill-0, decode-1, router, frontend
    role: str  # server | prefill | decode | router | frontend
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # additions to the launcher's environment
    port: int | None = None
    health_url: str | None = None
    metrics_url: str | None = None
    gpus: list[str] = field(default_factory=list)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


@dataclass
class LaunchPlan:
    """Everything `loadtest serve ENGINE` starts, in start order; ``url`` is the OpenAI endpoint."""

    engine: str
    preset: str
    model: str
    mode: str
    gpus: int
    url: str
    processes: list[ProcSpec]
    metrics_urls: list[str]
    ready: str = "status"  # status: every health URL answers 200; models: and /v1/models lists a model
    files: dict[str, str] = field(default_factory=dict)  # file name in workdir -> content
    version_urls: list[str] = field(default_factory=list)
    version_cmd: list[str] | None = None
    layout: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self, workdir: Path) -> str:
        """The dry-run text: each process as a shell line, then the files it reads."""
        where = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else "CPU"
        lines = [
            f"# {self.engine} {self.preset} ({self.mode}, {where}): {self.model}",
            f"# endpoint {self.url}; metrics {' '.join(self.metrics_urls) or '-'}",
        ]
        lines += [f"# {n}" for n in self.notes]
        for p in self.processes:
            gpu = f", GPUs {','.join(p.gpus)}" if p.gpus else ""
            health = f", health {p.health_url}" if p.health_url else ""
            lines.append(f"# {p.name} ({p.role}{gpu}{health})")
            lines.append(p.shell())
        for name, content in self.files.items():
            lines.append(f"# file {workdir / name}:")
            lines += [f"#   {line}" for line in content.rstrip().splitlines()]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def local_url(host: str, port: int) -> str:
    """The URL this host reaches a server bound to ``host`` at (wildcard binds answer on loopback)."""
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "", "localhost") else host
    if ":" in reach:
        reach = f"[{reach}]"
    return f"http://{reach}:{port}"


def assign_gpus(layout: Layout, gpu_ids: list[str] | None) -> list[list[str]]:
    """GPU ids per instance, in order (aggregated: one; disagg: prefill instances, then decode)."""
    instances: list[Instance] = [layout.instance] if layout.instance else [*layout.prefill, *layout.decode]
    ids = gpu_ids if gpu_ids is not None else [str(i) for i in range(layout.gpus)]
    if len(ids) < layout.gpus:
        raise ValueError(
            f"the layout needs {layout.gpus} GPUs but only {len(ids)} are given ({','.join(ids)})"
        )
    out, at = [], 0
    for inst in instances:
        out.append(ids[at : at + inst.tp])
        at += inst.tp
    return out


def layout_dict(preset: Preset, layout: Layout) -> dict[str, Any]:
    d: dict[str, Any] = {
        "gpus": layout.gpus,
        "mode": layout.mode,
        "fits": list(layout.fits),
        "why": layout.why,
    }
    if layout.instance:
        d["tp"], d["ep"] = layout.instance.tp, layout.instance.ep
    else:
        d["prefill"] = [asdict(i) for i in layout.prefill]
        d["decode"] = [asdict(i) for i in layout.decode]
    d["weights_gb"] = preset.weights_gb
    return d


def program(opts: LaunchOptions, default: list[str]) -> list[str]:
    """The program words of a command: ``--executable`` replaces the first one (`vllm`, `python3`...)."""
    return [opts.executable, *default[1:]] if opts.executable else list(default)


def plan_fields(
    engine: str, preset: Preset, layout: Layout, url: str, version_cmd: list[str]
) -> dict[str, Any]:
    """The LaunchPlan fields every engine fills alike: engine, preset, model, mode, GPUs, URL, version, layout."""
    return {
        "engine": engine,
        "preset": preset.name,
        "model": preset.model,
        "mode": layout.mode,
        "gpus": layout.gpus,
        "url": url,
        "version_cmd": version_cmd,
        "layout": layout_dict(preset, layout),
    }


def gpu_env(gpus: list[str]) -> dict[str, str]:
    """The environment addition that gives a process its GPUs."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}


def server_proc(
    argv: list[str], gpus: list[str], port: int, url: str, metrics_path: str = "/metrics"
) -> ProcSpec:
    """The one process of an aggregated server: on ``gpus``, health and metrics under ``url``."""
    return ProcSpec("server", "server", argv, gpu_env(gpus), port, url + "/health", url + metrics_path, gpus)


@dataclass(frozen=True)
class Worker:
    """One engine instance of a launch, in start order."""

    index: int  # over all instances: prefill ones, then decode ones
    role: str  # prefill | decode (server: an aggregated instance)
    name: str  # prefill-0, decode-1: counted per role
    inst: Instance
    gpus: list[str]


def disagg_workers(layout: Layout, gpu_sets: list[list[str]]) -> list[Worker]:
    """The prefill instances, then the decode ones, each with its GPU ids (``assign_gpus`` order)."""
    roles = ["prefill"] * len(layout.prefill) + ["decode"] * len(layout.decode)
    out = []
    for i, (role, inst, gpus) in enumerate(
        zip(roles, [*layout.prefill, *layout.decode], gpu_sets, strict=True)
    ):
        n = i if role == "prefill" else i - len(layout.prefill)
        out.append(Worker(i, role, f"{role}-{n}", inst, gpus))
    return out
