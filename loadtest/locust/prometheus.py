"""The run's live metrics in Prometheus text on a port of their own (``--prometheus-port``): TTFT, ITL,
TPOT and E2E histograms, tokens, outcomes, requests in flight and SLO attainment, per scenario and
endpoint; the run's conversations (counters and a latency histogram)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import gevent
from gevent.pywsgi import WSGIServer
from hdrh.histogram import HdrHistogram
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from loadtest.metrics import hdr
from loadtest.metrics.conversations import (
    LIVE_COMPLETED,
    LIVE_FAILED,
    LIVE_GOOD,
    LIVE_LATENCY,
    LIVE_STARTED,
)
from loadtest.metrics.recorder import Aggregate, RunAggregates
from loadtest.telemetry.names import (
    LIVE_CONVERSATION_SECONDS,
    LIVE_CONVERSATIONS_COMPLETED,
    LIVE_CONVERSATIONS_GOOD,
    LIVE_CONVERSATIONS_JUDGED,
    LIVE_CONVERSATIONS_STARTED,
    LIVE_FINISHED,
    LIVE_HISTOGRAMS,
    LIVE_IN_FLIGHT,
    LIVE_INPUT_TOKENS,
    LIVE_OUTPUT_TOKENS,
    LIVE_OUTPUT_TPS,
    LIVE_REQUESTS,
    LIVE_SLO_ATTAINMENT,
    LIVE_SLO_GOOD,
    LIVE_SLO_JUDGED,
)

# Bucket upper bounds in seconds: first-token and whole-request times, then per-token gaps (vLLM's
# ranges, a little wider at the top so that an overloaded endpoint's tail stays inside).
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
# A conversation's latency: from a second to a long agent session.
CONVERSATION_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2560.0, 5120.0)
BUCKETS = {"ttft": REQUEST_BUCKETS, "e2e": REQUEST_BUCKETS, "itl": TOKEN_BUCKETS, "tpot": TOKEN_BUCKETS}
LABELS = ("scenario", "endpoint")


@dataclass
class LiveView:
    """What one scrape reads: the merged aggregates so far and the requests in flight."""

    aggregates: RunAggregates
    in_flight: int


def cumulative_buckets(hist: HdrHistogram, bounds: Iterable[float]) -> list[tuple[str, float]]:
    """Prometheus's cumulative ``le`` counts (bounds in seconds) from an HDR histogram of µs; each value
    counts at its HDR bucket's upper edge (within the histogram's 3 significant digits)."""
    bounds = list(bounds)
    counts = hdr.cumulative_at(hist, [b * 1e6 for b in bounds])
    out = [(f"{b:g}", float(c)) for b, c in zip(bounds, counts, strict=True)]
    out.append(("+Inf", float(hist.get_total_count())))
    return out


class LiveCollector(Collector):
    """The metric families of one scrape, read from ``view()`` (None: before the load)."""

    def __init__(self, endpoints: list[str], scenario: str) -> None:
        self.endpoints = endpoints  # the run's endpoints in --host order (a record's endpoint index)
        self.endpoint = endpoints[0] if len(endpoints) == 1 else ",".join(endpoints)
        self.scenario = scenario  # the label of the whole run when the profile has one scenario
        self.view: Callable[[], LiveView | None] = lambda: None
        self.finished = False

    def _parts(self, agg: RunAggregates) -> list[tuple[list[str], Aggregate]]:
        """One series per (scenario, endpoint): their sum is the run."""
        if agg.cells:  # several endpoints: each scenario on each endpoint
            return [
                ([name, self.endpoints[e] if e < len(self.endpoints) else str(e)], a)
                for (name, e), a in sorted(agg.cells.items())
            ]
        if agg.scenarios:  # a mix on one endpoint
            return [([name, self.endpoint], a) for name, a in sorted(agg.scenarios.items())]
        return [([self.scenario, self.endpoint], agg.all)]

    def collect(self) -> Iterator[Any]:
        view = self.view()
        # the run-wide gauges: no labels
        yield GaugeMetricFamily(
            LIVE_FINISHED, "1 once the load and its drain are over", value=1.0 if self.finished else 0.0
        )
        if view is None:
            return
        yield GaugeMetricFamily(LIVE_IN_FLIGHT, "requests sent and not finished", value=float(view.in_flight))
        parts = self._parts(view.aggregates)
        requests = CounterMetricFamily(
            LIVE_REQUESTS.removesuffix("_total"), "finished requests by outcome", labels=[*LABELS, "outcome"]
        )
        out_tok = CounterMetricFamily(
            LIVE_OUTPUT_TOKENS.removesuffix("_total"), "output tokens", labels=LABELS
        )
        in_tok = CounterMetricFamily(LIVE_INPUT_TOKENS.removesuffix("_total"), "input tokens", labels=LABELS)
        tps = GaugeMetricFamily(LIVE_OUTPUT_TPS, "output tokens/s over the load so far", labels=LABELS)
        judged = CounterMetricFamily(
            LIVE_SLO_JUDGED.removesuffix("_total"), "requests judged against the SLOs", labels=LABELS
        )
        good = CounterMetricFamily(
            LIVE_SLO_GOOD.removesuffix("_total"), "judged requests within every SLO", labels=LABELS
        )
        attain = GaugeMetricFamily(LIVE_SLO_ATTAINMENT, "good / judged requests", labels=LABELS)
        hists = {
            m: HistogramMetricFamily(name, f"{m.upper()} in seconds", labels=LABELS)
            for m, name in LIVE_HISTOGRAMS.items()
        }
        for labels, a in parts:
            for outcome, n in sorted(a.outcomes.items()):
                requests.add_metric([*labels, outcome], float(n))
            out_tok.add_metric(labels, float(a.totals.get("output_tokens", 0)))
            in_tok.add_metric(labels, float(a.totals.get("input_tokens", 0)))
            span = (a.last_done or 0.0) - (a.first_scheduled or 0.0)
            tps.add_metric(labels, a.totals.get("output_tokens", 0) / span if span > 0 else 0.0)
            n_judged, n_good = a.totals.get("slo_judged", 0), a.totals.get("slo_good", 0)
            judged.add_metric(labels, float(n_judged))
            good.add_metric(labels, float(n_good))
            if n_judged:
                attain.add_metric(labels, n_good / n_judged)
            for m, family in hists.items():
                h = a.hists[m]
                count = h.get_total_count()
                family.add_metric(
                    labels,
                    cumulative_buckets(h, BUCKETS[m]),
                    sum_value=hdr.total_estimate(h) / 1e6 if count else 0.0,
                )
        yield from (requests, out_tok, in_tok, tps, judged, good, attain, *hists.values())
        yield from conversation_families(view.aggregates.all)


def conversation_families(agg: Aggregate) -> list[Any]:
    """The run's conversation counters and latency histogram (none before a conversation started)."""
    totals = agg.totals
    if not totals.get(LIVE_STARTED):
        return []
    done = totals.get(LIVE_COMPLETED, 0)
    counts = (
        (LIVE_CONVERSATIONS_STARTED, "conversations started", totals.get(LIVE_STARTED, 0)),
        (LIVE_CONVERSATIONS_COMPLETED, "conversations completed as planned", done),
        (LIVE_CONVERSATIONS_JUDGED, "conversations completed or failed", done + totals.get(LIVE_FAILED, 0)),
        (
            LIVE_CONVERSATIONS_GOOD,
            "completed conversations whose every call met the SLOs",
            totals.get(LIVE_GOOD, 0),
        ),
    )
    out: list[Any] = [
        CounterMetricFamily(name.removesuffix("_total"), text, value=float(n)) for name, text, n in counts
    ]
    h = agg.hists[LIVE_LATENCY]
    latency = HistogramMetricFamily(
        LIVE_CONVERSATION_SECONDS, "a conversation's first send to its last call's end, in seconds"
    )
    latency.add_metric(
        [],
        cumulative_buckets(h, CONVERSATION_BUCKETS),
        sum_value=hdr.total_estimate(h) / 1e6 if h.get_total_count() else 0.0,
    )
    return [*out, latency]


class LiveMetrics:
    """``start()`` serves ``/metrics`` (gevent's WSGI server, in this process's hub; not with ``port``
    None: the figures are then only read, by the OTLP push); ``attach`` says where the figures come
    from; ``final`` marks them final, ``hold`` keeps serving until one scrape has read them or
    ``hold_s`` passed; ``stop`` closes the port."""

    def __init__(self, bind: str, port: int | None, endpoints: list[str], scenario: str) -> None:
        self.bind, self.port = bind, port
        self.collector = LiveCollector(endpoints, scenario)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._app = make_wsgi_app(self.registry)
        self._server: WSGIServer | None = None
        self.scrapes = 0
        self._final_scrapes = 0

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        self.scrapes += 1
        if self.collector.finished:
            self._final_scrapes += 1
        return self._app(environ, start_response)

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}/metrics"

    def start(self) -> LiveMetrics:
        if self.port is None:
            return self
        server = WSGIServer((self.bind, self.port), self._wsgi, log=None, error_log=None)
        try:
            server.start()
        except OSError as e:
            why = os.strerror(e.errno) if e.errno else str(e)
            raise RuntimeError(
                f"cannot serve live metrics on {self.bind}:{self.port}: {why} "
                "(--prometheus-port: another port, or 0 for a free one)"
            ) from e
        self._server = server
        self.port = server.server_port
        print(f"live metrics (Prometheus): {self.url}", flush=True)
        return self

    def attach(self, view: Callable[[], LiveView | None]) -> None:
        self.collector.view = view

    def final(self, aggregates: RunAggregates) -> None:
        """The run's final figures from now on (``loadtest_run_finished`` 1, nothing in flight)."""
        self.collector.view = lambda: LiveView(aggregates, 0)
        self.collector.finished = True

    def hold(self, hold_s: float) -> None:
        """Keep serving until one scrape has read the final figures, at most ``hold_s``."""
        deadline = time.monotonic() + hold_s
        while self._server is not None and self._final_scrapes == 0 and time.monotonic() < deadline:
            gevent.sleep(0.05)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(timeout=1)
            self._server = None
