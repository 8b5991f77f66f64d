"""run.json as typed structures: every section a msgspec struct, the version migration, read and write.

The document is described field by field in docs/run-json.md. Unknown fields are refused, so a writer
that adds a key must add it here first and a reader never meets a key it does not know. Sections whose
content is an echo of something with its own schema (the resolved profile, the engine's settings, a
trace's description, the server's telemetry series) are kept as JSON objects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

SCHEMA_VERSION = 2
RUN_FILE = "run.json"
JsonObject = dict[str, Any]


class RunDocumentError(ValueError):
    """A run.json that cannot be read; the message names the file, the field and the fix."""


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A run.json section: fields in the order they are written, unknown fields refused."""


class _OptionalSection(_Section, omit_defaults=True):
    """A section whose optional fields (default None) are left out when absent."""


# ---- config --------------------------------------------------------------------------------------
class LoadConfig(_Section):
    mode: str
    concurrency: int | None
    rate: float | None
    arrival: str | None
    cv: float | None
    stages: list[JsonObject] | None
    trace: JsonObject | None
    description: str


class ScenarioConfig(_Section):
    name: str
    kind: str
    weight: float


class RunSalt(_Section):
    mode: str
    nonce: str | None


class Timeouts(_Section):
    connect_s: float | None
    read_s: float | None
    total_s: float | None


class StartRamp(_Section):
    """A closed loop's start (locust/ramp.py): the ramp planned (0: at once), what starting every stream
    took, and whether ``--ramp-up`` / ``load.ramp_up_s`` set it (``set``) or the default did; ``held_s``:
    how long a default ramp's batches waited for the host's CPU."""

    planned_s: float
    took_s: float
    source: str
    held_s: float = 0.0


class JudgingConfig(_Section):
    warmup_s: float | str | None
    warmup_source: str
    cooldown_s: float | None
    generator_health_startup_s: float | None
    generator_health: str
    smoke: bool = False
    ramp: StartRamp | None = None  # a closed loop's start; absent for other loads and older runs


class SeedSetRecord(_Section):
    """``--seed-set``: the file (and its sha256), the cohort and set, and the seeds it gave."""

    file: str
    sha256: str
    cohort: str
    set: str
    scheduler_rng_seed: int
    sample_index_rng_seed: int
    model_seed: int


class RunConfig(_OptionalSection):
    profile: str
    profile_path: str | None
    profile_resolved: JsonObject
    load: LoadConfig
    scenarios: list[ScenarioConfig]
    tokenizer: str
    run_salt: RunSalt
    duration_s: float | None
    seed: int
    processes: int
    model: str | None
    api: str
    api_key_env: str | None
    api_key_file: str | None
    timeouts: Timeouts
    retries: JsonObject | None
    tls_verify: bool
    judging: JudgingConfig | None = None
    slos: dict[str, float | None] | None = None
    seed_set: SeedSetRecord | None = None
    network: JsonObject | None = None  # proxies, CA bundle, TLS verification (client/network.describe)


# ---- endpoint ------------------------------------------------------------------------------------
class Hardware(_Section):
    gpu_kind: str
    gpu_count: int | None


class Endpoint(_OptionalSection):
    url: str
    embedded: bool
    models: list[str]
    engine: JsonObject | None
    max_model_len: int | None = None
    server: JsonObject | None = None
    replicas: list[str] | None = None
    balance: str | None = None
    hardware: Hardware | None = None
    price: JsonObject | None = None
    name: str | None = None


# ---- metrics -------------------------------------------------------------------------------------
class Summary(_Section):
    """One distribution: count, min, max, mean, standard deviation and percentiles (ms, or tokens/s)."""

    count: int
    min: float | None
    max: float | None
    mean: float | None
    stddev: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    p99_9: float | None


class Requests(_Section):
    completed: int
    ok: int
    failed: int
    cancelled: int
    error_rate: float
    skipped_arrivals: int
    by_outcome: dict[str, int]


class Window(_Section):
    first_scheduled: float | None
    last_done: float | None
    duration_s: float


class Throughput(_Section):
    output_tokens_per_s: float
    input_tokens_per_s: float
    requests_per_s: float
    tps_per_user: float | None


class TokenTotals(_Section):
    counted_by: str | None
    counted_output_total: int
    counted_input_total: int
    output_total: int
    input_total: int
    reasoning_total: int
    usage_reports: int
    usage_output_total: int | None
    usage_input_total: int | None
    usage_cached_total: int | None
    mismatched_requests: int
    input_mismatched_requests: int = 0


class GeneratorFigures(_Section):
    cpu_samples: int
    cpu_p50_percent: float | None
    cpu_p90_percent: float | None
    cpu_max_percent: float | None
    schedule_lag_p99_ms: float | None
    host_cpu_p90_percent: float | None = None  # a master's local processes together, per core they may use


class SloLive(_Section):
    judged: int
    good: int
    good_output_tokens: int


class EndpointRow(_Section):
    index: int
    url: str
    requests: int
    share: float
    ok: int
    failed: int
    error_rate: float
    by_outcome: dict[str, int]
    output_tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    e2e_p99_ms: float | None


class PerEndpoint(_Section):
    balance: str
    endpoints: list[EndpointRow]
    imbalance: float | None


class Embeddings(_Section):
    requests_ok: int
    inputs_total: int
    inputs_per_s: float
    input_tokens_total: int
    latency_ms: dict[str, float | None]


class Rerank(_Section):
    requests: int
    requests_ok: int
    documents_total: int
    documents_per_s: float
    input_tokens_total: int
    latency_ms: dict[str, float | None]


class Samples(_Section):
    """KServe v2 inference requests: queries (requests), samples and samples/s (run/providers.py)."""

    requests: int
    requests_ok: int
    samples_total: int
    samples_per_s: float
    input_tokens_total: int
    latency_ms: dict[str, float | None]


class ItlMerged(_Section):
    """Token gaps left out of ITL: their event arrived in one read with another (docs/metrics.md)."""

    gaps: int
    share: float | None
    # Streams with enough token events to judge how they were delivered, and those delivered merged
    # (metrics/delivery.py; docs/metrics.md "Merged delivery"); 0 in a run.json written before them.
    streams: int = 0
    merged_streams: int = 0
    # Burst gaps left out of ITL and the streams delivered in bursts (docs/metrics.md "Burst delivery");
    # 0 in a run.json written before them.
    burst_gaps: int = 0
    burst_streams: int = 0
    # Of the burst streams, those re-sent whole (their gaps stay in ITL); 0 in a run.json written before.
    whole_streams: int = 0


class TokensPerChunk(_Section):
    """The ok streamed answers' counted output tokens over their output-bearing chunks (docs/metrics.md)."""

    tokens: int
    chunks: int
    mean: float | None


class Connections(_Section):
    """How the requests reached the server (run/connections.py): new and kept-alive connections, each
    opening's phases and the time to the response headers, in ms ({p50, p99, max})."""

    requests: int
    opened: int
    reused: int
    dns_ms: dict[str, float | None]
    connect_ms: dict[str, float | None]
    tunnel_ms: dict[str, float | None]
    tls_ms: dict[str, float | None]
    headers_ms: dict[str, float | None]


class Metrics(_OptionalSection):
    requests: Requests
    window: Window
    throughput: Throughput
    tokens: TokenTotals
    latency_ms: dict[str, Summary]
    itl_merged: ItlMerged
    output_tps_per_request: Summary
    series: dict[str, list[float]]
    error_samples: dict[str, list[str]]
    generator: GeneratorFigures
    slo_live: SloLive | None
    per_endpoint: PerEndpoint | None = None
    embeddings: Embeddings | None = None
    rerank: Rerank | None = None
    samples: Samples | None = None
    connections: Connections | None = None
    tokens_per_chunk: TokensPerChunk | None = None  # absent in a run.json written before it


# ---- the sections a finished run adds ------------------------------------------------------------
class Tool(_Section):
    name: str
    version: str


class DatasetInfo(_Section):
    """A dataset scenario's file as the run used it (docs/datasets.md)."""

    file: str  # the file's name (where it lies is not part of the workload)
    sha256: str  # of its content (a save_to_disk folder: of its Arrow files)
    rows: int  # conversations or rows read
    conversations: int  # used, after the filters and the sample
    requests: int  # in those conversations (a multi-turn one counts each user turn)


class Workload(_OptionalSection):
    fingerprint: str
    datasets: dict[str, DatasetInfo] | None = None  # by scenario, when the profile has dataset scenarios


class Files(_Section):
    records: list[str]
    report: str


class TokenizerInfo(_Section):
    name: str
    source: str
    detail: str
    guessed: bool
    template: str | None


class EndpointsTokens(_Section):
    """The MLPerf Endpoints output count against the server's usage (metrics/endpoints.UsageAgreement)."""

    counted_by: str
    answers_with_usage: int
    endpoints_output_total: int
    usage_output_total: int
    differing_answers: int
    relative_difference: float | None


class Tokens(_Section):
    counted_by: str | None
    description: str
    tokenizer: TokenizerInfo
    requests_without_usage: int
    endpoints: EndpointsTokens | None = None  # absent in runs written before it


class JudgedWindow(_Section):
    start: float
    end: float
    duration_s: float
    warmup_s: float
    cooldown_s: float
    automatic: bool


class Judged(_Section):
    window: JudgedWindow
    metrics: Metrics


class GeneratorHealth(_Section):
    startup_s: float
    requests: int
    schedule_lag_p99_ms: float | None
    whole_run_schedule_lag_p99_ms: float | None
    mean_in_flight: float | None = None  # over a steady span of MIN_IN_FLIGHT_SPAN_S or more
    in_flight_ok_share: float | None = None


class GoodputRule(_Section):
    ttft_ms: float | None
    tpot_ms: float | None


class GoodputFigures(_Section):
    judged: int
    good: int
    attainment: float | None
    good_requests_per_s: float
    good_output_tokens_per_s: float


class Goodput(GoodputFigures, omit_defaults=True):
    rule: GoodputRule
    series: dict[str, list[int]]
    scenarios: dict[str, GoodputFigures] | None = None


class Check(_Section):
    name: str
    kind: str
    passed: bool
    blocking: bool
    value: float | None
    limit: float | None
    detail: str


class Verdict(_Section):
    status: str
    exit_code: int
    reasons: list[str]
    checks: list[Check]


class Economics(_Section):
    basis: str
    gpu_kind: str
    gpu_count: int | None
    output_tokens_per_s: float
    input_tokens_per_s: float
    input_share: float | None
    output_tokens_per_s_per_gpu: float | None
    input_tokens_per_s_per_gpu: float | None
    price: JsonObject | None
    currency: str
    cost_per_hour: float | None
    cost_per_m_output: float | None
    cost_per_m_input: float | None
    cost_per_m_blended: float | None


class SpecDecodeFigures(_Section):
    """Speculative decoding as the server counted it between the first and the last scrape."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float


class Telemetry(_OptionalSection):
    url: str
    engine: str
    interval_s: float
    t: list[float]
    series: dict[str, list[float | None]]
    server_latency: JsonObject | None = None
    energy: JsonObject | None = None  # GPU power polled (dcgm-exporter): telemetry/energy.py
    mixed_instances: int | None = None  # ticks whose counters went down: replicas behind one URL
    replicas: list[JsonObject] | None = None  # each polled replica's own figures: telemetry/replicas.py
    spec_decode: SpecDecodeFigures | None = None  # vLLM's spec-decode counters: telemetry/spec_decode.py


class PrefixCache(_OptionalSection):
    hit_rate: float | None
    hit: float
    queried: float
    source: str
    threshold: float
    expected_reuse: str | None
    warm: bool
    system_prompt_tokens: int | None = None
    warning: str | None = None


class QualityCheck(_Section):
    """One answer check over the run's ok answers."""

    failed: int
    pass_rate: float | None
    first_failed: str | None  # the record id of the first request that failed it


class Quality(_Section):
    """The answer checks of the ok answers (docs/quality.md): the share passing every ``gate`` check,
    judged against ``min`` (the quality_min SLO, else the default floor)."""

    checked: int
    passed: int
    pass_rate: float | None
    min: float
    min_source: str  # slo | default
    gate: list[str]
    checks: dict[str, QualityCheck]


class Conversations(_Section):
    """A run with sessions: per-conversation figures over its completed conversations (docs/metrics.md)."""

    started: int
    completed: int
    per_s: float | None
    latency_s: dict[str, float] | None
    calls_per_conversation: dict[str, float] | None
    e2e_interactivity: float | None  # output tokens ÷ the calls' time (tool time excluded), mean
    e2e_interactivity_with_tool_time: float | None  # output tokens ÷ the conversation's latency, mean
    slo_attainment: float | None  # good ÷ judged
    judged: int = 0  # completed or failed (not cut short by the run's end)
    good: int = 0  # completed with every call within the per-request SLOs


class AgenticCalls(_Section):
    """The recorded agent calls the inline accuracy check saw."""

    issued: int  # calls with an expected answer
    answered: int  # with an ok answer
    scored: int  # whose expected answer holds something to score (bash actions, intent codes)
    excluded: int  # whose expected answer holds nothing to score


class AgenticDomain(_Section):
    """One domain's mean score (coding: bash actions; workflow: intent codes)."""

    score: float
    scored: int


class AgenticAccuracy(_Section):
    """The MLPerf Endpoints agentic inline accuracy of a run replaying recorded agent calls with expected
    answers (accuracy/scorers/agentic.py, docs/traces.md): the mean over every scored call."""

    scorer: str
    score: float | None
    calls: AgenticCalls
    domains: dict[str, AgenticDomain]
    target: float | None = None  # agent_trace.accuracy_target: a score below it fails the verdict


class StoppedEarly(_Section):
    """The endpoint failed wholesale and the run was stopped (docs/ci.md)."""

    failed_in_a_row: int
    seconds: float
    any_ok: bool
    commonest: str | None
    worker: int
    reason: str


class ReportingWindow(_Section):
    """The MLPerf Endpoints reporting window (metrics/window.py; docs/sources.md §2): status, verdict,
    bounds on issue time (epoch s) and super-passes, the window's figures."""

    status: str  # windowable | insufficient_duration | insufficient_passes | partial_dataset
    verdict: str  # STEADY STATE | drifting_up | drifting_down | anomaly | not found
    reason: str | None
    dataset_size: int | None
    super_pass_size: int
    super_passes: int
    warmup_super_passes: int
    min_duration_s: float
    start: float | None
    end: float | None
    duration_s: float | None
    first_super_pass: int | None
    passes: int
    requests: int
    output_tokens: int
    system_tps: float | None
    tps_per_user: float | None
    trend: dict[str, str]
    level_shift_at: int | None
    level_shift_pct: float | None


class Lost(_Section):
    """What the run could not keep (docs/durability.md): present only when something was lost."""

    write_failure: str | None  # the first run file that could not be written: what, when, which file
    records_not_written: int  # finished requests counted in the metrics but not in the record log
    in_flight_of_lost_workers: int  # recorded as cancelled: their outcome is unknown
    cut_lines: int  # record-log lines cut mid-way (the last line of a log a crash or full disk cut)
    unreadable_lines: int  # record-log lines that are not record lines


class RunDocument(_OptionalSection):
    """run.json. The sections a finished run adds are None in a document still being built."""

    schema_version: int
    tool: Tool
    run_id: str
    created: str
    status: str
    interrupted_reason: str | None
    config: RunConfig
    endpoint: Endpoint
    workload: Workload
    metrics: Metrics
    scenarios: dict[str, Metrics]
    histograms: dict[str, str]
    files: Files
    notes: list[str]
    # The metric convention of every figure in this file (docs/metrics.md, "Conventions"); absent in runs
    # written before it, whose figures are the same convention.
    metric_convention: str | None = None
    stopped_early: StoppedEarly | None = None
    lost: Lost | None = None
    tokens: Tokens | None = None
    judged: Judged | None = None
    generator_health: GeneratorHealth | None = None
    goodput: Goodput | None = None
    economics: Economics | None = None
    quality: Quality | None = None
    verdict: Verdict | None = None
    telemetry: Telemetry | None = None
    prefix_cache: PrefixCache | None = None
    reporting_window: ReportingWindow | None = None
    conversations: Conversations | None = None
    agentic_accuracy: AgenticAccuracy | None = None

    def judged_metrics(self) -> Metrics:
        """The metrics the verdict judged: the judged window's when there is one, else the whole run's."""
        return self.judged.metrics if self.judged is not None else self.metrics


# ---- versions ------------------------------------------------------------------------------------
def migrate(data: JsonObject, where: Path | str = RUN_FILE) -> JsonObject:
    """A decoded run.json of any known version, brought to SCHEMA_VERSION (docs/run-json.md, Versions).

    Version 1 lacks ``config.judging.generator_health``: its runs judged generator health as a
    failing check, which is ``fail``."""
    version = data.get("schema_version")
    if version == SCHEMA_VERSION:
        return data
    if version == 1:
        judging = (data.get("config") or {}).get("judging")
        if isinstance(judging, dict):
            judging.setdefault("generator_health", "fail")
        return {**data, "schema_version": SCHEMA_VERSION}
    newer = isinstance(version, int) and version > SCHEMA_VERSION
    fix = "read it with a newer loadtest" if newer else "give a run.json written by loadtest"
    raise RunDocumentError(f"{where}: schema_version {version!r} is not one this loadtest reads; {fix}")


_ENCODER = msgspec.json.Encoder()


def from_data(data: Any, where: Path | str = RUN_FILE) -> RunDocument:
    """A run.json document (decoded JSON, any known version) as a RunDocument; RunDocumentError names
    the field that does not fit."""
    if not isinstance(data, dict):
        raise RunDocumentError(f"{where}: not a JSON object; give a run.json written by loadtest")
    try:
        return msgspec.convert(migrate(data, where), RunDocument)
    except msgspec.ValidationError as e:
        raise RunDocumentError(f"{where}: {e}; give a run.json written by this loadtest") from e


def to_data(doc: RunDocument) -> JsonObject:
    """The document as JSON-ready builtins (what run.json holds)."""
    data: JsonObject = msgspec.to_builtins(doc)
    return data


def read_run_document(run_dir: Path) -> RunDocument:
    """``run_dir/run.json`` as a RunDocument (migrated from an older version)."""
    path = run_dir / RUN_FILE
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise RunDocumentError(f"{path}: cannot be read ({e.strerror or e})") from e
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise RunDocumentError(f"{path}: not valid JSON ({e})") from e
    return from_data(data, path)


def write_run_document(run_dir: Path, doc: RunDocument) -> Path:
    """Write ``run_dir/run.json`` atomically: a reader never sees half a file."""
    path = run_dir / RUN_FILE
    tmp = run_dir / ".run.json.tmp"
    try:
        tmp.write_bytes(msgspec.json.format(_ENCODER.encode(doc), indent=2))
        os.replace(tmp, path)
    except OSError:  # a full disk: no half-written file left behind
        tmp.unlink(missing_ok=True)
        raise
    return path
