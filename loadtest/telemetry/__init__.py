"""Server telemetry: the endpoint's Prometheus metrics polled each second into run.json series."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.client.http import Endpoint
from loadtest.client.network import NetworkPolicy
from loadtest.telemetry.energy import energy_block
from loadtest.telemetry.names import ENGINE_SERIES, SERIES, detect_engine
from loadtest.telemetry.poller import TelemetryPoller
from loadtest.telemetry.scrape import parse
from loadtest.telemetry.warm import prefix_cache_block


def metrics_urls(host: str | Sequence[str], override: str | None, server: dict[str, Any] | None) -> list[str]:
    """``--metrics-url`` (comma-separated), else the URLs the launcher recorded, else HOST/metrics for
    each endpoint (replicas are summed); a base URL given with its ``/v1`` polls the server's root."""
    if override:
        return [u.strip() for u in override.split(",") if u.strip()]
    if server and server.get("metrics_urls"):
        return list(server["metrics_urls"])
    hosts = [host] if isinstance(host, str) else list(host)
    return [_default_metrics_url(h) for h in hosts]


def _default_metrics_url(host: str) -> str:
    """HOST/metrics: under the host's base path (its ``/v1`` left out); a host whose URL names a full
    API path or a query string polls its origin's /metrics."""
    ep = Endpoint.parse(host)
    if ep.fixed_path or ep.query:
        return f"{ep.origin}/metrics"
    return host.rstrip("/").removesuffix("/v1") + "/metrics"


def start_for_run(
    host: str | Sequence[str],
    *,
    override: str | None = None,
    server: dict[str, Any] | None = None,
    embedded: bool = False,
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    metrics_api_key: str | None = None,
    network: NetworkPolicy | None = None,
    gpu_urls: Sequence[str] = (),
) -> TelemetryPoller:
    """A started poller for a run against ``host`` (the embedded engine is named loadtest-sim);
    ``gpu_urls``: dcgm-exporter endpoints polled with it (GPU utilization, power, memory, clocks).

    The endpoint's credentials (``headers``: the profile's auth scheme; else ``api_key`` as a Bearer
    token) go only to metrics URLs on an endpoint's own origin; a URL elsewhere gets
    ``metrics_api_key`` as a Bearer token, or nothing (docs/network.md). ``network``: proxies, CA, TLS."""
    hint = "loadtest-sim" if embedded else (server or {}).get("engine")
    own = (
        dict(headers) if headers is not None else {"Authorization": f"Bearer {api_key}"} if api_key else None
    )
    other = {"Authorization": f"Bearer {metrics_api_key}"} if metrics_api_key else None
    hosts = [host] if isinstance(host, str) else list(host)
    gpu = [u for u in gpu_urls if u]
    urls = metrics_urls(host, override, server) + gpu
    return TelemetryPoller(
        urls,
        engine_hint=hint,
        headers=own or None,
        bare_urls=frozenset(gpu),
        origins=tuple(Endpoint.parse(h).origin for h in hosts),
        other_headers=other,
        network=network,
    ).start()


@dataclass
class TelemetryFindings:
    """What the server's telemetry adds to run.json: ``telemetry`` (series, server-side latency),
    ``prefix_cache``, and notes (no metrics recorded, a warm prefix cache), each None or empty if none."""

    telemetry: dict[str, Any] | None = None
    prefix_cache: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def findings(
    doc: Mapping[str, Any], poller: TelemetryPoller | None, run_started_epoch: float | None = None
) -> TelemetryFindings:
    """Stop ``poller`` and read its series and server-side latency for the run.json ``doc`` built so far
    (its judged window), or the line that says why there are none; ``t`` counts from
    ``run_started_epoch`` when given. Then the run's prefix-cache hit rate (from the poller, else from
    the records' cached tokens; also without a poller) and, for a warm run of a profile without shared
    prefixes, a note."""
    out = TelemetryFindings()
    prefix = None
    if poller is not None:
        poller.stop()
        window = (doc.get("judged") or {}).get("window")
        result = poller.result(run_started_epoch, window)
        if result is not None:
            energy = energy_block(doc, result)  # GPU power polled (dcgm-exporter): J per output token
            if energy is not None:
                result["energy"] = energy
            out.telemetry = result
            prefix = poller.prefix_cache()
            if poller.mixed_note is not None:
                out.notes.append(poller.mixed_note)
        elif poller.note:
            out.notes.append(poller.note)
    out.prefix_cache = prefix_cache_block(doc, prefix)
    if out.prefix_cache is not None and "warning" in out.prefix_cache:
        out.notes.append(out.prefix_cache["warning"])
    return out


def attach(
    doc: dict[str, Any], poller: TelemetryPoller | None, run_started_epoch: float | None = None
) -> None:
    """``findings`` put into run.json ``doc``: ``telemetry``, ``prefix_cache`` and the notes."""
    found = findings(doc, poller, run_started_epoch)
    if found.telemetry is not None:
        doc["telemetry"] = found.telemetry
    if found.notes:
        doc.setdefault("notes", []).extend(found.notes)
    if found.prefix_cache is not None:
        doc["prefix_cache"] = found.prefix_cache


__all__ = [
    "ENGINE_SERIES",
    "SERIES",
    "TelemetryFindings",
    "TelemetryPoller",
    "attach",
    "detect_engine",
    "findings",
    "parse",
    "start_for_run",
]
