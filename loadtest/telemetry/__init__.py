"""Server telemetry: the endpoint's Prometheus metrics polled each second into run.json series."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadtest.telemetry.names import ENGINE_SERIES, SERIES, detect_engine
from loadtest.telemetry.poller import TelemetryPoller
from loadtest.telemetry.scrape import parse
from loadtest.telemetry.warm import assess


def metrics_urls(host: str | Sequence[str], override: str | None, server: dict[str, Any] | None) -> list[str]:
    """``--metrics-url`` (comma-separated), else the URLs the launcher recorded, else HOST/metrics for
    each endpoint (replicas are summed); a base URL given with its ``/v1`` polls the server's root."""
    if override:
        return [u.strip() for u in override.split(",") if u.strip()]
    if server and server.get("metrics_urls"):
        return list(server["metrics_urls"])
    hosts = [host] if isinstance(host, str) else list(host)
    return [h.rstrip("/").removesuffix("/v1") + "/metrics" for h in hosts]


def start_for_run(
    host: str | Sequence[str],
    *,
    override: str | None = None,
    server: dict[str, Any] | None = None,
    embedded: bool = False,
    api_key: str | None = None,
) -> TelemetryPoller:
    """A started poller for a run against ``host`` (the embedded engine is named loadtest-sim)."""
    hint = "loadtest-sim" if embedded else (server or {}).get("engine")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return TelemetryPoller(metrics_urls(host, override, server), engine_hint=hint, headers=headers).start()


def attach(
    doc: dict[str, Any], poller: TelemetryPoller | None, run_started_epoch: float | None = None
) -> None:
    """Stop ``poller`` and put its series and server-side latency into run.json ``doc`` (or one line in
    ``notes``); ``t`` counts from ``run_started_epoch`` when given. Then the run's prefix-cache hit rate
    (``prefix_cache``, from the poller, else from the records' cached tokens; also without a poller)
    and, for a warm run of a profile without shared prefixes, a note."""
    prefix = None
    if poller is not None:
        poller.stop()
        window = (doc.get("judged") or {}).get("window")
        result = poller.result(run_started_epoch, window)
        if result is not None:
            doc["telemetry"] = result
            prefix = poller.prefix_cache()
        elif poller.note:
            doc.setdefault("notes", []).append(poller.note)
    assess(doc, prefix)


__all__ = ["ENGINE_SERIES", "SERIES", "TelemetryPoller", "attach", "detect_engine", "parse", "start_for_run"]
