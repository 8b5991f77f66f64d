"""The run itself: the endpoint's telemetry polled while Locust drives the load (loadtest/locust/runtime.py),
in this process, over local worker processes, or over `loadtest worker` processes started anywhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loadtest.client.apis import auth_headers
from loadtest.client.secrets import KeySourceError, install_redaction, load_api_key
from loadtest.errors import LoadtestError, UsageError
from loadtest.run.endpoint import Endpoint
from loadtest.run.inputs import Prepared
from loadtest.run.options import MasterOptions, TelemetryOptions
from loadtest.telemetry import TelemetryPoller, start_for_run

if TYPE_CHECKING:  # importing locust monkey-patches the process: only where a run happens
    from loadtest.locust.otlp_push import OtlpTarget
    from loadtest.locust.runtime import RunOutcome


def metrics_key(telemetry: TelemetryOptions) -> str | None:
    """The key for metrics URLs on another origin (``--metrics-api-key-env``), redacted from now on."""
    if not telemetry.metrics_api_key_env:
        return None
    try:
        key = load_api_key(telemetry.metrics_api_key_env, None)
    except KeySourceError as e:
        raise UsageError(f"--metrics-api-key-env: {e}") from e
    install_redaction(key)
    return key


@dataclass
class Executed:
    """What the run handed back (records, aggregates, how it ended) and its telemetry poller, stopped."""

    outcome: RunOutcome
    telemetry: TelemetryPoller | None = None
    notes: list[str] = field(default_factory=list)  # for run.json's notes (failed OTLP pushes)


def execute(
    prepared: Prepared,
    endpoint: Endpoint,
    telemetry: TelemetryOptions,
    master: MasterOptions | None = None,
) -> Executed:
    """Run the load with ``prepared.settings`` against ``endpoint``: in this process (one process), as a
    Locust master over ``settings.processes`` local workers, or with ``master`` over that many workers
    that connect from anywhere. The endpoints' /metrics are polled meanwhile unless told not to.
    LoadtestError when the run cannot start or its workers fail to come."""
    from loadtest.locust import master as distributed  # here, not above: Locust monkey-patches the process
    from loadtest.locust import runtime
    from loadtest.locust.otlp_push import OtlpPusher, require_exporter
    from loadtest.locust.prometheus import LiveMetrics

    settings = prepared.settings
    target = None
    if telemetry.otlp:
        require_exporter()
        target = _otlp_target(telemetry)
    live, pusher = None, None
    # the run's own figures, live: served for Prometheus, pushed over OTLP, or both (docs/telemetry.md)
    if telemetry.prometheus_port is not None or telemetry.otlp:
        live = LiveMetrics(
            telemetry.prometheus_bind,
            telemetry.prometheus_port,
            endpoints=list(settings.hosts or [settings.host or endpoint.host]),
            scenario=prepared.profile.scenarios[0].name,
        )
        try:
            live.start()
        except RuntimeError as e:
            raise LoadtestError(str(e)) from e
        if target is not None:  # the same figures pushed to an OTLP collector
            pusher = OtlpPusher(live.collector, target, _resource(prepared)).start()
    poller = None
    if telemetry.enabled:
        poller = start_for_run(
            settings.hosts or endpoint.host,  # every replica's /metrics, summed
            override=telemetry.metrics_url,
            server=endpoint.server,
            embedded=endpoint.engine_info is not None,
            headers=auth_headers(prepared.api_key, prepared.profile),
            metrics_api_key=metrics_key(telemetry),
            network=settings.policy(),
            gpu_urls=[u.strip() for u in (telemetry.gpu_metrics_url or "").split(",")],
        )
    try:
        if master is not None:
            outcome = distributed.run_master(
                settings,
                master.port,
                spawn_local=False,
                expect=settings.processes,
                bind_host=master.bind_host,
                wait_s=master.wait_s,
                live=live,
            )
        elif settings.processes > 1:
            outcome = distributed.run_master(settings, distributed.free_port(), live=live)
        else:
            outcome = runtime.run_local(settings, live=live)
        if live is not None:
            live.final(outcome.aggregates)
            if pusher is not None:
                pusher.finish()
            live.hold(telemetry.prometheus_hold_s)
    except RuntimeError as e:
        raise LoadtestError(str(e)) from e
    finally:
        if poller is not None:
            poller.stop()
        if pusher is not None:
            pusher.stop()
        if live is not None:
            live.stop()
    return Executed(outcome, poller, pusher.notes() if pusher is not None else [])


def _otlp_target(telemetry: TelemetryOptions) -> OtlpTarget:
    from loadtest.locust.otlp_push import OtlpTarget, resolve_endpoint

    endpoint = resolve_endpoint(telemetry.otlp_endpoint)
    return OtlpTarget(endpoint, telemetry.otlp_interval_s, dict(telemetry.otlp_headers))


def _resource(prepared: Prepared) -> dict[str, str]:
    """The OTLP resource: which tool, which run, which profile."""
    from loadtest import __version__

    return {
        "service.name": "loadtest",
        "service.version": __version__,
        "loadtest.run_id": prepared.settings.run_id,
        "loadtest.profile": prepared.profile.name,
    }
