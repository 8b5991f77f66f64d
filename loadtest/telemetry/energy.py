"""Energy per output token and output tokens/s per watt from the GPUs' power (dcgm-exporter) during a run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def energy_block(doc: Mapping[str, Any], telemetry: Mapping[str, Any]) -> dict[str, Any] | None:
    """run.json ``telemetry.energy``: the mean of the polled GPU power (summed over the GPUs scraped)
    over the load, times the load's duration, per counted output token; and output tokens/s per watt.
    None when no power was polled or no output token counted."""
    power = [v for v in (telemetry.get("series") or {}).get("gpu_power_w", []) if v is not None]
    metrics = doc.get("metrics") or {}
    duration = (metrics.get("window") or {}).get("duration_s")
    tokens = (metrics.get("tokens") or {}).get("counted_output_total")
    tps = (metrics.get("throughput") or {}).get("output_tokens_per_s")
    if not power or not duration or not tokens:
        return None
    mean_w = sum(power) / len(power)
    if mean_w <= 0:
        return None
    energy_j = mean_w * float(duration)
    return {
        "power_w_mean": round(mean_w, 3),
        "power_samples": len(power),
        "duration_s": round(float(duration), 3),
        "energy_j": round(energy_j, 3),
        "output_tokens": int(tokens),
        "j_per_output_token": round(energy_j / float(tokens), 6),
        "output_tokens_per_s_per_w": round(float(tps) / mean_w, 6) if tps else None,
        "source": "DCGM_FI_DEV_POWER_USAGE summed over the GPUs, mean of the polls",
    }
