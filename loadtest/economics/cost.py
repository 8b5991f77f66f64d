"""Per-GPU throughput and cost per million tokens of one run, computed from its run.json alone."""

from __future__ import annotations

from typing import Any


def _get(doc: Any, *keys: str) -> Any:
    for k in keys:
        doc = doc.get(k) if isinstance(doc, dict) else None
    return doc


def judged_throughput(run: dict[str, Any]) -> tuple[float, float, str]:
    """(output tokens/s, input tokens/s, basis) over the judged window when there is one."""
    judged = _get(run, "judged", "metrics")
    m = judged if isinstance(judged, dict) else (run.get("metrics") or {})
    thr = m.get("throughput") or {}
    basis = "judged window" if isinstance(judged, dict) else "whole run"
    return float(thr.get("output_tokens_per_s") or 0.0), float(thr.get("input_tokens_per_s") or 0.0), basis


def cost_per_second(price: dict[str, Any], gpus: int | None, out_tps: float, in_tps: float) -> float | None:
    """What serving this load costs per second: GPUs × price per GPU-hour / 3600, or tokens × token prices."""
    if price.get("per_gpu_hour") is not None:
        return None if not gpus else float(price["per_gpu_hour"]) * gpus / 3600.0
    if price.get("per_m_input") is not None and price.get("per_m_output") is not None:
        return (in_tps * float(price["per_m_input"]) + out_tps * float(price["per_m_output"])) / 1e6
    return None


def _sig(x: float) -> float:
    """Six significant digits: a cost of $0.0346 keeps its precision as well as one of $34.6."""
    return float(f"{x:.6g}")


def _per_m(cost_s: float | None, tps: float) -> float | None:
    return None if cost_s is None or tps <= 0 else _sig(cost_s / tps * 1e6)


def run_economics(run: dict[str, Any]) -> dict[str, Any] | None:
    """Token economics of a run (docs/economics.md); None when neither a GPU count nor a price is known.

    Every cost is the whole cost of serving the measured load divided by a token count: per million
    output tokens, per million input tokens, and blended (per million tokens of either kind, so in the
    profile's own input/output mix). A GPU-hour price and a per-token price thus compare directly."""
    hw = _get(run, "endpoint", "hardware") or {}
    price = _get(run, "endpoint", "price") or None
    gpus = hw.get("gpu_count")
    if not gpus and not price:
        return None
    out_tps, in_tps, basis = judged_throughput(run)
    total = out_tps + in_tps
    doc: dict[str, Any] = {
        "basis": basis,
        "gpu_kind": hw.get("gpu_kind") or "unknown",
        "gpu_count": gpus,
        "output_tokens_per_s": out_tps,
        "input_tokens_per_s": in_tps,
        "input_share": round(in_tps / total, 6) if total > 0 else None,
        "output_tokens_per_s_per_gpu": round(out_tps / gpus, 3) if gpus else None,
        "input_tokens_per_s_per_gpu": round(in_tps / gpus, 3) if gpus else None,
        "price": price,
        "currency": (price or {}).get("currency") or "USD",
        "cost_per_hour": None,
        "cost_per_m_output": None,
        "cost_per_m_input": None,
        "cost_per_m_blended": None,
    }
    if price:
        cost_s = cost_per_second(price, gpus, out_tps, in_tps)
        doc["cost_per_hour"] = None if cost_s is None else _sig(cost_s * 3600.0)
        doc["cost_per_m_output"] = _per_m(cost_s, out_tps)
        doc["cost_per_m_input"] = _per_m(cost_s, in_tps)
        doc["cost_per_m_blended"] = _per_m(cost_s, total)
    return doc


def endpoint_record(spec: Any) -> dict[str, Any]:
    """run.json ``endpoint.hardware`` / ``endpoint.price`` from an EndpointSpec (price omitted when none)."""
    out: dict[str, Any] = {"hardware": spec.hardware.model_dump()}
    if spec.price is not None:
        out["price"] = {**spec.price.model_dump(), "kind": spec.price.kind}
    if spec.name:
        out["name"] = spec.name
    return out
