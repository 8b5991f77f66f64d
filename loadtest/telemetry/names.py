"""Each engine's Prometheus names for the common telemetry series, and engine detection from the names."""

from __future__ import annotations

import re
from dataclasses import dataclass

SERIES = (
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "preemptions",
    "prefix_cache_hit_rate",
    "generation_tokens_per_s",
    "prompt_tokens_per_s",
    "gpu_utilization",
    "gpu_power_w",
    "gpu_memory_used_mib",
    "gpu_sm_clock_mhz",
)


@dataclass(frozen=True)
class Gauge:
    """A level read each tick; ``fraction`` levels (0..1) and ``mean`` levels (clocks) are averaged
    across sources, counts summed; ``scale`` converts the exposed unit (percent: 0.01)."""

    name: str
    fraction: bool = False
    mean: bool = False
    scale: float = 1.0


@dataclass(frozen=True)
class Delta:
    """A counter: its increase in each interval (``per_s``: divided by the interval's seconds)."""

    name: str
    per_s: bool = False


@dataclass(frozen=True)
class Ratio:
    """Increase of ``num`` over the increase of the sum of ``den`` counters in each interval (0..1)."""

    num: str
    den: tuple[str, ...]


Source = Gauge | Delta | Ratio

# Candidates per series, first present wins. Sample names as exposed (counters with `_total`,
# histogram sums with `_sum`). Sources: vLLM vllm/v1/metrics/loggers.py; SGLang
# sglang/srt/metrics/collector.py; TensorRT-LLM tensorrt_llm/metrics/collector.py; Dynamo
# docs/observability/metrics.md (frontend `dynamo_frontend_*`, worker `dynamo_component_kvstats_*`).
ENGINE_SERIES: dict[str, dict[str, list[Source]]] = {
    "vllm": {
        "requests_running": [Gauge("vllm:num_requests_running")],
        "requests_waiting": [Gauge("vllm:num_requests_waiting")],
        "kv_cache_usage": [Gauge("vllm:kv_cache_usage_perc", True), Gauge("vllm:gpu_cache_usage_perc", True)],
        "preemptions": [Delta("vllm:num_preemptions_total")],
        "prefix_cache_hit_rate": [
            Ratio("vllm:prefix_cache_hits_total", ("vllm:prefix_cache_queries_total",)),
            Ratio("vllm:gpu_prefix_cache_hits_total", ("vllm:gpu_prefix_cache_queries_total",)),
            Gauge("vllm:gpu_prefix_cache_hit_rate", True),
        ],
        "generation_tokens_per_s": [Delta("vllm:generation_tokens_total", True)],
        "prompt_tokens_per_s": [Delta("vllm:prompt_tokens_total", True)],
    },
    "sglang": {
        "requests_running": [Gauge("sglang:num_running_reqs")],
        "requests_waiting": [Gauge("sglang:num_queue_reqs")],
        "kv_cache_usage": [Gauge("sglang:token_usage", True)],
        "preemptions": [Delta("sglang:num_retracted_requests_total")],  # SGLang calls preemption retraction
        "prefix_cache_hit_rate": [Gauge("sglang:cache_hit_rate", True)],
        "generation_tokens_per_s": [Delta("sglang:generation_tokens_total", True)],
        "prompt_tokens_per_s": [Delta("sglang:prompt_tokens_total", True)],
    },
    "trtllm": {
        "requests_running": [Gauge("trtllm_num_requests_running")],
        "requests_waiting": [Gauge("trtllm_num_requests_waiting")],
        "kv_cache_usage": [Gauge("trtllm_kv_cache_utilization", True)],
        "prefix_cache_hit_rate": [
            Ratio(
                "trtllm_kv_cache_reused_blocks_total",
                ("trtllm_kv_cache_reused_blocks_total", "trtllm_kv_cache_missed_blocks_total"),
            ),
            Gauge("trtllm_kv_cache_hit_rate", True),
        ],
        "generation_tokens_per_s": [Delta("trtllm_generation_tokens_total", True)],
        "prompt_tokens_per_s": [Delta("trtllm_prompt_tokens_total", True)],
    },
    "dynamo": {
        "requests_running": [Gauge("dynamo_frontend_inflight_requests")],
        "requests_waiting": [Gauge("dynamo_frontend_queued_requests")],
        "kv_cache_usage": [Gauge("dynamo_component_kvstats_gpu_cache_usage_percent", True)],
        "prefix_cache_hit_rate": [
            Gauge("dynamo_component_kvstats_gpu_prefix_cache_hit_rate", True),
            Ratio("dynamo_frontend_cached_tokens_sum", ("dynamo_frontend_input_sequence_tokens_sum",)),
        ],
        "generation_tokens_per_s": [
            Delta("dynamo_frontend_output_tokens_total", True),
            Delta("dynamo_frontend_output_sequence_tokens_sum", True),
        ],
        "prompt_tokens_per_s": [Delta("dynamo_frontend_input_sequence_tokens_sum", True)],
    },
}
# Finished requests per instance (run.json telemetry.replicas[].requests), first present wins: vLLM's
# vllm:request_success_total (by finished_reason), SGLang's, Dynamo's frontend, loadtest's live metrics.
REQUEST_COUNTERS = (
    "vllm:request_success_total",
    "sglang:num_requests_total",
    "dynamo_frontend_requests_total",
    "loadtest_requests_total",
)
# The embedded engine (loadtest/sim/prom.py) speaks vLLM's names.
ENGINE_SERIES["loadtest-sim"] = ENGINE_SERIES["vllm"]

# loadtest's own live metrics (a master's or a run's --prometheus-port, loadtest/locust/prometheus.py):
# one name for each, shared by the exporter and this parser (docs/telemetry.md, "Live metrics").
LIVE_REQUESTS = "loadtest_requests_total"  # counter, by outcome
LIVE_OUTPUT_TOKENS = "loadtest_output_tokens_total"
LIVE_INPUT_TOKENS = "loadtest_input_tokens_total"
LIVE_OUTPUT_TPS = "loadtest_output_tokens_per_second"  # gauge: output tokens over the load so far
LIVE_IN_FLIGHT = "loadtest_requests_in_flight"
LIVE_SLO_JUDGED = "loadtest_slo_judged_total"
LIVE_SLO_GOOD = "loadtest_slo_good_total"
LIVE_SLO_ATTAINMENT = "loadtest_slo_attainment"  # gauge: good / judged
LIVE_FINISHED = "loadtest_run_finished"  # gauge: 1 once the load and the drain are over (final figures)
LIVE_HISTOGRAMS = {m: f"loadtest_{m}_seconds" for m in ("ttft", "itl", "tpot", "e2e")}
# Conversations (sessions: multi-turn chats, agents, recorded agent sessions), the whole run's.
LIVE_CONVERSATIONS_STARTED = "loadtest_conversations_started_total"
LIVE_CONVERSATIONS_COMPLETED = "loadtest_conversations_completed_total"
LIVE_CONVERSATIONS_JUDGED = "loadtest_conversations_judged_total"  # completed or failed
LIVE_CONVERSATIONS_GOOD = "loadtest_conversations_good_total"  # completed, every call within the SLOs
LIVE_CONVERSATION_SECONDS = "loadtest_conversation_seconds"  # histogram: first send to last call's end
LIVE_NAMES = (
    LIVE_REQUESTS,
    LIVE_OUTPUT_TOKENS,
    LIVE_INPUT_TOKENS,
    LIVE_OUTPUT_TPS,
    LIVE_IN_FLIGHT,
    LIVE_SLO_JUDGED,
    LIVE_SLO_GOOD,
    LIVE_SLO_ATTAINMENT,
    LIVE_FINISHED,
    LIVE_CONVERSATIONS_STARTED,
    LIVE_CONVERSATIONS_COMPLETED,
    LIVE_CONVERSATIONS_JUDGED,
    LIVE_CONVERSATIONS_GOOD,
)
ENGINE_SERIES["loadtest"] = {
    "requests_running": [Gauge(LIVE_IN_FLIGHT)],
    "generation_tokens_per_s": [Delta(LIVE_OUTPUT_TOKENS, True)],
    "prompt_tokens_per_s": [Delta(LIVE_INPUT_TOKENS, True)],
}

# NVIDIA dcgm-exporter's GPU gauges (one label set per GPU), read from any source next to any engine's:
# utilization in percent (averaged over the GPUs), power in W and framebuffer used in MiB (summed),
# SM clock in MHz (averaged). Names: DCGM's field identifiers, docs/sources.md §11.
GPU_SERIES: dict[str, list[Source]] = {
    "gpu_utilization": [Gauge("DCGM_FI_DEV_GPU_UTIL", fraction=True, scale=0.01)],
    "gpu_power_w": [Gauge("DCGM_FI_DEV_POWER_USAGE")],
    "gpu_memory_used_mib": [Gauge("DCGM_FI_DEV_FB_USED")],
    "gpu_sm_clock_mhz": [Gauge("DCGM_FI_DEV_SM_CLOCK", mean=True)],
}
DETECT_ORDER = ("dynamo", "trtllm", "sglang", "vllm", "loadtest")
PREFIX = {
    "dynamo": "dynamo_",
    "trtllm": "trtllm_",
    "sglang": "sglang:",
    "vllm": "vllm:",
    "loadtest": "loadtest_",
}


# Server-side latency histograms (Prometheus histograms in seconds: `_bucket{le}`, `_sum`, `_count`),
# candidates per metric, first present wins. vLLM: vllm/v1/metrics/loggers.py (`inter_token_latency`
# replaced `time_per_output_token` in v0.10); SGLang: sglang/srt/metrics/collector.py; TensorRT-LLM:
# tensorrt_llm/metrics/collector.py; Dynamo: the frontend's `dynamo_frontend_*` histograms.
HISTOGRAMS = ("ttft", "itl", "tpot", "e2e", "queue", "prefill", "decode")
ENGINE_HISTOGRAMS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "ttft": ("vllm:time_to_first_token_seconds",),
        "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "tpot": ("vllm:request_time_per_output_token_seconds",),  # per request, as MLPerf's TPOT
        "e2e": ("vllm:e2e_request_latency_seconds",),
        "queue": ("vllm:request_queue_time_seconds",),
        "prefill": ("vllm:request_prefill_time_seconds",),
        "decode": ("vllm:request_decode_time_seconds",),
    },
    "sglang": {
        "ttft": ("sglang:time_to_first_token_seconds",),
        "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "e2e": ("sglang:e2e_request_latency_seconds",),
        "queue": ("sglang:queue_time_seconds",),
    },
    "trtllm": {
        "ttft": ("trtllm_time_to_first_token_seconds",),
        "itl": ("trtllm_time_per_output_token_seconds",),
        "e2e": ("trtllm_e2e_request_latency_seconds",),
        "queue": ("trtllm_request_queue_time_seconds",),
        "prefill": ("trtllm_request_prefill_time_seconds",),
        "decode": ("trtllm_request_decode_time_seconds",),
    },
    "dynamo": {
        "ttft": ("dynamo_frontend_time_to_first_token_seconds",),
        "itl": ("dynamo_frontend_inter_token_latency_seconds",),
        "e2e": ("dynamo_frontend_request_duration_seconds",),
    },
}
ENGINE_HISTOGRAMS["loadtest-sim"] = ENGINE_HISTOGRAMS["vllm"]
ENGINE_HISTOGRAMS["loadtest"] = {m: (name,) for m, name in LIVE_HISTOGRAMS.items()}
HISTOGRAM_BASES = frozenset(n for table in ENGINE_HISTOGRAMS.values() for ns in table.values() for n in ns)


def histogram_candidates(engine: str) -> dict[str, list[str]]:
    """Per latency metric: the engine's own histogram names first, then every other engine's."""
    out: dict[str, list[str]] = {}
    for metric in HISTOGRAMS:
        names = list(ENGINE_HISTOGRAMS.get(engine, {}).get(metric, ()))
        for other in DETECT_ORDER:
            names += [n for n in ENGINE_HISTOGRAMS[other].get(metric, ()) if n not in names]
        out[metric] = names
    return out


def source_names(src: Source) -> tuple[str, ...]:
    if isinstance(src, Ratio):
        return (src.num, *src.den)
    return (src.name,)


def wanted_names() -> frozenset[str]:
    """Every sample name any mapping reads (counters also without `_total`, as older exporters wrote)."""
    names = (
        {
            n
            for table in (*ENGINE_SERIES.values(), GPU_SERIES)
            for srcs in table.values()
            for s in srcs
            for n in source_names(s)
        }
        | set(LIVE_NAMES)
        | set(REQUEST_COUNTERS)
    )
    hists = {h + suffix for h in HISTOGRAM_BASES for suffix in ("_bucket", "_sum", "_count")}
    return frozenset(names | {n.removesuffix("_total") for n in names} | hists)


def detect_engine(text: str) -> str:
    """Which engine exposes these metrics, from the prefixes of its sample names."""
    for engine in DETECT_ORDER:
        if re.search("^" + re.escape(PREFIX[engine]), text, re.MULTILINE):
            return engine
    return "unknown"


def candidates(engine: str) -> dict[str, list[Source]]:
    """Per series: the engine's own names first, then every other engine's (a Dynamo worker port
    also shows its backend's names, for instance)."""
    own = ENGINE_SERIES.get(engine, {})
    out: dict[str, list[Source]] = {}
    for series in SERIES:
        srcs = list(own.get(series, []))
        for other in DETECT_ORDER:
            srcs += [s for s in ENGINE_SERIES[other].get(series, []) if s not in srcs]
        out[series] = srcs + GPU_SERIES.get(series, [])
    return out
