"""vLLM-named Prometheus metrics for the simulated server (rendered by prometheus_client)."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)  # fmt: skip
# request_latency_buckets: e2e, and the queue/prefill/decode/inference phase histograms
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class Hist:
    """A cheap cumulative histogram (bisect per observation, no locks: one event loop writes)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.total += v

    def observe_many(self, values: Iterable[float]) -> None:
        for v in values:
            self.observe(v)

    def buckets(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            acc += n
            out.append((bound, acc))
        return out


def engine_counter(engine: Any, name: str) -> float | None:
    """A counter of the engine's ``counters`` by name; None where the engine keeps none."""
    v = getattr(getattr(engine, "counters", None), name, None)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def engine_value(engine: Any, name: str) -> float:
    """An engine counter or gauge by name (on the engine or its counters), 0 where absent."""
    for obj in (engine, getattr(engine, "counters", None)):
        v = getattr(obj, name, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return 0.0


# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py, docs/sources.md §25): name,
# help, the engine counter behind it.
_SPEC_COUNTERS = (
    ("vllm:spec_decode_num_drafts", "Speculative decode steps (drafts verified).", "spec_drafts"),
    ("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", "spec_draft_tokens"),
    ("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", "spec_accepted_tokens"),
)


class SimMetrics(Collector):
    """Server-observed counters and histograms plus engine gauges read at scrape time. The latency
    histograms use vLLM's names and bounds and observe the engine's true times (arrival at the HTTP
    handler, each token handed to the transport); queue and prefill times are not exposed. The token
    counters advance per engine step, as vLLM's do (generation tokens as they are sampled, a prompt at
    its first token), so a server tokens/s series moves while long requests run; an engine without
    such counters falls back to the totals of finished requests."""

    prompt_per_step = (
        True  # the engine's counters.prompt_tokens is vLLM's (whole prompts at their first token)
    )

    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: Counter[str] = Counter()
        self.ttft = Hist(TTFT_BUCKETS)
        self.itl = Hist(ITL_BUCKETS)
        self.e2e = Hist(E2E_BUCKETS)
        self.decode = Hist(E2E_BUCKETS)
        self.tpot = Hist(ITL_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def finished(self, rec: Any, submitted: bool) -> None:
        """Account one finished request from its truth record (times in perf_counter_ns)."""
        if submitted:
            self.prompt_tokens += rec.prompt_tokens
        self.generation_tokens += rec.completion_tokens
        if rec.first_token_ns is not None:
            self.ttft.observe((rec.first_token_ns - rec.arrival_ns) / 1e9)
        ns = rec.token_ns
        # one gap per step's output, as vLLM observes it: tokens written together (one chunk) add none
        self.itl.observe_many((b - a) / 1e9 for a, b in zip(ns, ns[1:], strict=False) if b != a)
        if rec.finish_reason is not None and rec.done_ns is not None:
            self.success[rec.finish_reason] += 1
            self.e2e.observe((rec.done_ns - rec.arrival_ns) / 1e9)
            if rec.first_token_ns is not None and ns:
                decode = (ns[-1] - rec.first_token_ns) / 1e9  # vLLM: last token - first token
                self.decode.observe(decode)
                if len(ns) > 1:
                    self.tpot.observe(decode / (len(ns) - 1))  # vLLM: decode time / (tokens - 1)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([self.model_name], value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self.model_name], value)
        return c

    def _hist(self, name: str, doc: str, h: Hist) -> HistogramMetricFamily:
        m = HistogramMetricFamily(name, doc, labels=["model_name"])
        m.add_metric([self.model_name], h.buckets(), h.total)
        return m

    def _pools(self, e: Any) -> Iterator[Any]:
        """Per-pool queue and batch gauges and the KV transfers of disaggregated serving."""
        for name, doc, read in (
            ("loadtest_sim:pool_requests_waiting", "Requests waiting in a pool.", e.pool_waiting),
            ("loadtest_sim:pool_requests_running", "Requests in a pool's running batches.", e.pool_running),
        ):
            g = GaugeMetricFamily(name, doc, labels=["model_name", "pool"])
            for pool in ("prefill", "decode"):
                g.add_metric([self.model_name, pool], read(pool))
            yield g
        yield self._gauge(
            "loadtest_sim:kv_transfers_in_flight",
            "Prompts' KV on the way to decode.",
            e.kv_transfers_in_flight,
        )
        yield self._counter("loadtest_sim:kv_transfers", "Prompts' KV sent to decode.", e.kv_transfers)
        yield self._counter("loadtest_sim:kv_transfer_bytes", "KV bytes sent to decode.", e.kv_transfer_bytes)

    def _parts(self) -> tuple[list[str], list[tuple[list[str], Any]]]:
        """The label names and, per instance, its label values and engine: the engine alone (no label
        beyond the model), or each replica behind a router (``replica``: the whole is their sum)."""
        replicas = getattr(self.engine, "replicas", None)
        if isinstance(replicas, list) and len(replicas) > 1:
            return ["model_name", "replica"], [([self.model_name, str(i)], r) for i, r in enumerate(replicas)]
        return ["model_name"], [([self.model_name], self.engine)]

    def _engine_families(self) -> Iterator[Any]:
        """The engine's gauges and counters (vLLM names), one sample per instance."""
        labels, parts = self._parts()
        whole = len(parts) == 1

        def family(kind: type[Any], name: str, doc: str, read: Any) -> Any:
            m = kind(name, doc, labels=labels)
            for values, e in parts:
                m.add_metric(values, read(e))
            return m

        def token_counter(e: Any, name: str, finished: int, per_step: bool = True) -> float:
            v = engine_counter(e, name) if per_step else None
            return float(finished) if v is None and whole else (v or 0.0)

        G, C = GaugeMetricFamily, CounterMetricFamily
        yield family(
            G, "vllm:num_requests_running", "Requests in the running batch.", lambda e: e.num_running
        )
        yield family(
            G, "vllm:num_requests_waiting", "Requests waiting to be scheduled.", lambda e: e.num_waiting
        )
        yield family(
            G, "vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).", lambda e: engine_value(e, "kv_usage")
        )
        yield family(
            C, "vllm:num_preemptions", "Cumulative preemptions.", lambda e: engine_value(e, "preemptions")
        )
        yield family(
            C,
            "vllm:prefix_cache_queries",
            "Prefix-cache queried tokens.",
            lambda e: engine_value(e, "prefix_queries"),
        )
        yield family(
            C, "vllm:prefix_cache_hits", "Prefix-cache hit tokens.", lambda e: engine_value(e, "prefix_hits")
        )
        yield family(
            C,
            "vllm:prompt_tokens",
            "Prefill tokens processed.",
            lambda e: token_counter(e, "prompt_tokens", self.prompt_tokens, self.prompt_per_step),
        )
        yield family(
            C,
            "vllm:generation_tokens",
            "Generation tokens served.",
            lambda e: token_counter(e, "generated_tokens", self.generation_tokens),
        )
        for name, doc, field in _SPEC_COUNTERS:
            yield family(C, name, doc, lambda e, f=field: engine_value(e, f))

    def _router(self, e: Any) -> Iterator[Any]:
        """The router's decisions per replica: requests sent, prompt blocks found cached there."""
        policy = e.policy.name
        for name, doc, counts in (
            ("loadtest_sim:router_requests", "Requests the router sent to a replica.", e.routed),
            (
                "loadtest_sim:router_prefix_blocks_matched",
                "Prompt blocks the chosen replica held cached when the router picked it.",
                e.matched_blocks,
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=["model_name", "replica", "policy"])
            for i, n in enumerate(counts):
                c.add_metric([self.model_name, str(i), policy], n)
            yield c

    def collect(self) -> Iterator[Any]:
        e = self.engine
        yield from self._engine_families()
        if hasattr(e, "routed"):  # replicas behind a router (sim/replicas.py)
            yield from self._router(e)
        if hasattr(e, "pool_waiting"):  # disaggregated pools (sim/disagg.py)
            yield from self._pools(e)
        ok = CounterMetricFamily(
            "vllm:request_success", "Finished requests.", labels=["model_name", "finished_reason"]
        )
        for reason in sorted({"stop", "length", *self.success}):
            ok.add_metric([self.model_name, reason], self.success[reason])
        yield ok
        yield self._hist("vllm:time_to_first_token_seconds", "Time to first token.", self.ttft)
        yield self._hist("vllm:inter_token_latency_seconds", "Inter-token latency.", self.itl)
        yield self._hist(
            "vllm:request_time_per_output_token_seconds", "Mean time per output token per request.", self.tpot
        )
        yield self._hist("vllm:e2e_request_latency_seconds", "End-to-end request latency.", self.e2e)
        yield self._hist(
            "vllm:request_decode_time_seconds", "Decode phase: first to last token.", self.decode
        )
