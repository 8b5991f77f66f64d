"""What a command asks of a run, as typed values: each command reads its command line into these (None:
the profile's, or the default) and hands them to ``prepare``, ``open_endpoint``, ``execute`` and
``finalize``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from loadtest.client.preflight import CHECK_MODELS
from loadtest.sim.start import EngineOverrides

GeneratorHealthOption = Literal["fail", "warn"]


@dataclass(frozen=True, slots=True)
class RunOptions:
    """The run's inputs: profile, load, seed, duration, judging, SLOs, API key, client policy, folder."""

    profile: str = "interactive-chat"  # shipped name or YAML path
    processes: int = 1
    processes_option: str = "--processes"  # the option that set ``processes`` (named when it is < 1)
    concurrency: int | None = None
    rate: float | None = None
    ramp_up: str | None = None  # --ramp-up: seconds like 30s or 0 over the profile's load.ramp_up_s
    seed: int | None = None
    seed_set: str | None = None  # --seed-set FILE:COHORT[:SET] (workload/seed_set.py)
    duration: str | None = None  # 90, 90s, 5m, 1h; None: a self-ending schedule's length, else the profile's
    tokenizer: str | None = None
    dataset: str | None = None  # --dataset: a prompt file sent instead of the profile's scenarios
    slo: str | None = None  # merged over the profile's SLOs
    warmup: str | None = None  # seconds like 30s, 0, or auto
    cooldown: str | None = None
    generator_health: GeneratorHealthOption | None = None
    smoke: bool = False  # --smoke: the profile's minimums reported, not applied (judging.smoke)
    progress_s: float = 0.0  # --progress: a console line every this many seconds (0: none)
    max_requests: int | None = None  # --max-requests: issue this many units, then end the load
    api_key_env: str | None = None  # the name of the variable holding the key
    api_key_file: str | None = None
    verify_tls: bool = True
    ca_bundle: str | None = None  # --ca-bundle: the CAs every request trusts (client/network.py)
    connect_timeout: float | None = None
    read_timeout: float | None = None
    total_timeout: float | None = None
    retries: int | None = None
    session_header: str | None = (
        None  # --session-header NAME or none, over the profile's request.session_header
    )
    capture: int | None = None  # --capture N: the first N requests into capture.jsonl
    capture_rate: float | None = None  # --capture-rate R: a seeded sample of them
    out: str | None = None  # the run folder (default: reports/<timestamp>-<profile>/)
    force: bool = False  # the run folder may hold an earlier run: its files are replaced


@dataclass(frozen=True, slots=True)
class EndpointOptions:
    """Where the requests go: the endpoints (none: the embedded engine, with ``engine`` over the
    profile's preset), how they share the load, what is checked before the run, and the hardware and
    price behind them (economics ``OPTION_FIELDS`` and ``--endpoint-file``)."""

    hosts: tuple[str, ...] = ()  # --host, each replica in order
    hosts_file: str | None = None  # more replicas, one base URL a line
    balance: str = "round-robin"
    model: str | None = None
    endpoint_check: str = CHECK_MODELS
    server_info: str | None = None  # server.json of the server under test
    engine: EngineOverrides = field(default_factory=EngineOverrides)
    hardware: Mapping[str, Any] = field(default_factory=dict)  # OPTION_FIELDS name → value given
    endpoint_file: str | None = None


@dataclass(frozen=True, slots=True)
class TelemetryOptions:
    """Polling the endpoint's Prometheus /metrics during the load (docs/telemetry.md)."""

    enabled: bool = True
    metrics_url: str | None = None  # comma-separated; default: HOST/metrics of each endpoint
    metrics_api_key_env: str | None = None  # the variable holding a key for metrics URLs on another origin
    gpu_metrics_url: str | None = None  # --dcgm-url: NVIDIA dcgm-exporter's /metrics, comma-separated
    prometheus_port: int | None = None  # --prometheus-port: serve the run's live metrics there
    prometheus_bind: str = "127.0.0.1"
    prometheus_hold_s: float = 0.0  # after the run, until one scrape read the final figures, at most this
    otlp: bool = False  # --otlp / --otlp-endpoint: push the live metrics to an OTLP/HTTP collector
    otlp_endpoint: str | None = None  # None: OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT, else localhost:4318
    otlp_interval_s: float = 10.0
    otlp_headers: tuple[tuple[str, str], ...] = ()  # --otlp-header K=V (the OTEL_* headers: the exporter's)


@dataclass(frozen=True, slots=True)
class MasterOptions:
    """``loadtest master``: the workers are started anywhere and connect to this process."""

    port: int
    bind_host: str = "127.0.0.1"
    wait_s: float = 120.0  # how long to wait for them
