"""Poll server metrics once per interval during a run (a thread, a greenlet under gevent) into series."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from loadtest.client.network import NetworkPolicy, same_origin
from loadtest.telemetry import histograms as hist
from loadtest.telemetry.names import SERIES, Delta, Gauge, Ratio, Source, candidates, source_names
from loadtest.telemetry.replicas import ReplicaView, fraction, gauge_value, increase
from loadtest.telemetry.scrape import Scrape, ScrapeError, scrape
from loadtest.telemetry.spec_decode import spec_decode_summary

log = logging.getLogger(__name__)
BASELINE_TRIES = 5  # ticks to get a first answer from a URL before it is given up (404 at once)
# A server restarts once in a while; counters that go backwards this many times in one run are several
# instances answering in turn behind one URL (a router or load balancer over replicas).
MIXED_INSTANCES_TICKS = 2
TRTLLM_PATH = "/prometheus/metrics"


def combine(scrapes: list[Scrape]) -> Scrape:
    """Several endpoints (prefill and decode workers, a frontend): totals add, means weigh by label sets."""
    if len(scrapes) == 1:
        return scrapes[0]
    engines = [s.engine for s in scrapes if s.engine != "unknown"]
    out = Scrape(engine=engines[0] if engines else "unknown")
    if "dynamo" in engines:
        out.engine = "dynamo"
    for s in scrapes:
        for name, total in s.total.items():
            n_old, n_new = out.groups.get(name, 0), s.groups[name]
            out.mean[name] = (out.mean.get(name, 0.0) * n_old + s.mean[name] * n_new) / (n_old + n_new)
            out.total[name] = out.total.get(name, 0.0) + total
            out.groups[name] = n_old + n_new
        for name, b in s.buckets.items():
            acc = out.buckets.setdefault(name, {})
            for le, n in b.items():
                acc[le] = acc.get(le, 0.0) + n
    return out


def went_backwards(prev: Scrape, cur: Scrape) -> bool:
    """Whether a counter of ``prev`` is lower in ``cur``: the engine's token and request counters
    (``*_total``) only rise, unless the process behind the URL changed."""
    return any(
        name.endswith("_total") and name in prev.total and value < prev.total[name] - 1e-9
        for name, value in cur.total.items()
    )


def value_of(src: Source, prev: Scrape, cur: Scrape, dt: float) -> float | None:
    if isinstance(src, Gauge):
        return gauge_value(src, cur) if src.name in cur.total else None
    if isinstance(src, Delta):
        d = increase(prev, cur, src.name)
        if d is None:
            return None
        return round(d / dt, 3) if src.per_s else round(d, 3)
    num = increase(prev, cur, src.num)
    dens = [increase(prev, cur, n) for n in src.den]
    if num is None or any(d is None for d in dens):
        return None
    den = sum(d for d in dens if d is not None)
    return fraction(num / den) if den > 0 else None


class TelemetryPoller:
    """``start()`` before the load, ``stop()`` after; ``result()`` is run.json's ``telemetry`` block (or
    None, with ``note`` saying why). Each tick has a bounded timeout and is skipped when it fails."""

    def __init__(
        self,
        urls: list[str],
        interval_s: float = 1.0,
        timeout_s: float | None = None,
        engine_hint: str | None = None,
        headers: dict[str, str] | None = None,
        bare_urls: frozenset[str] = frozenset(),
        origins: tuple[str, ...] = (),
        other_headers: dict[str, str] | None = None,
        network: NetworkPolicy | None = None,
    ) -> None:
        self.urls = list(urls)
        self.interval_s = interval_s
        self.timeout_s = timeout_s if timeout_s is not None else min(2.0, 0.8 * interval_s)
        self.engine_hint = engine_hint
        self.headers = headers
        self.bare_urls = set(bare_urls)  # polled without ``headers`` (a GPU exporter never gets the API key)
        # ``headers`` (the endpoint's credentials) go only to URLs on one of ``origins`` (none given: every
        # URL); a URL elsewhere gets ``other_headers`` (its own key, --metrics-api-key-env) or nothing
        self.origins = origins
        self.other_headers = other_headers
        self.network = network or NetworkPolicy()
        self.t: list[float] = []
        self.rows: list[dict[str, float | None]] = []
        self.seen: set[str] = set()
        self.chosen: dict[str, Source] = {}
        self.engine = engine_hint or "unknown"
        self.errors: dict[str, str] = {}
        self.failed_ticks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self.started_epoch = 0.0
        # first and last scrape (the last one taken at stop(), after the load), and every tick's
        # histograms (compact) for a judged window
        self.first: Scrape | None = None
        self.last: Scrape | None = None
        self.snaps: list[tuple[float, hist.Compact]] = []
        self._bounds: dict[str, tuple[float, ...]] = {}
        self._final_taken = False
        self.backwards = 0  # ticks whose counters went down from the tick before
        # each polled URL's own scrapes, for the per-replica figures of several URLs
        self.views: dict[str, ReplicaView] = {}
        self._parts: dict[str, Scrape] = {}

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> TelemetryPoller:
        self._t0, self.started_epoch = time.monotonic(), time.time()
        self._thread = threading.Thread(target=self._run, name="loadtest-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling, then take one last scrape (once) so the histograms cover the whole load."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s * max(1, len(self.urls)) + 2.0)
            if self._thread.is_alive() or self._final_taken or self.first is None:
                return
            self._final_taken = True
            cur = self._scrape_all()
            if cur is not None:
                self._keep(cur, time.monotonic() - self._t0)

    def _keep(self, cur: Scrape, t: float) -> None:
        for url, part in self._parts.items():
            self.views.setdefault(url, ReplicaView(url)).keep(part, t)
        if self.first is None:
            self.first = cur
        self.last = cur
        if cur.buckets:
            self.snaps.append((round(t, 3), hist.compact(cur, self._bounds)))

    # ---- polling -------------------------------------------------------------------------------
    def _scrape_all(self) -> Scrape | None:
        got = []
        for url in self.urls:
            try:
                got.append(scrape(url, self.timeout_s, self._headers(url), self.network))
            except ScrapeError as e:
                self.errors[url] = str(e)
                return None
            except Exception as e:  # a malformed exposition: skip the tick, never break the run
                self.errors[url] = f"unreadable metrics: {e}"
                return None
        self._parts = dict(zip(self.urls, got, strict=True))
        return combine(got)

    def _baseline(self) -> Scrape | None:
        """The first answer of every URL. A URL that answers 404 is dropped at once (trying TensorRT-LLM's
        /prometheus/metrics in place of /metrics first), one that does not answer in BASELINE_TRIES ticks
        too; the others must answer in the same tick."""
        misses: dict[str, int] = {}
        tick = 0
        while not self._stop.is_set() and self.urls:
            got, keep = [], []
            for url in self.urls:
                try:
                    got.append(scrape(url, self.timeout_s, self._headers(url), self.network))
                except ScrapeError as e:
                    self.errors[url] = str(e)
                    misses[url] = misses.get(url, 0) + 1
                    if e.status == 404 and url.endswith("/metrics") and not url.endswith(TRTLLM_PATH):
                        keep.append(url.removesuffix("/metrics") + TRTLLM_PATH)
                        if url in self.bare_urls:
                            self.bare_urls.add(keep[-1])
                    elif e.status != 404 and misses[url] < BASELINE_TRIES:
                        keep.append(url)
                    continue
                except Exception as e:  # not a Prometheus exposition
                    self.errors[url] = f"unreadable metrics: {e}"
                    continue
                keep.append(url)
            if keep == self.urls and len(got) == len(keep):
                self._parts = dict(zip(keep, got, strict=True))
                return combine(got)
            self.urls = keep
            tick += 1
            if not any(u.endswith(TRTLLM_PATH) and u not in misses for u in keep):
                self._stop.wait(self._next_tick(tick))
        return None

    def _headers(self, url: str) -> dict[str, str] | None:
        if url in self.bare_urls:
            return None
        if not self.origins or any(same_origin(url, o) for o in self.origins):
            return self.headers
        return self.other_headers

    def _next_tick(self, k: int) -> float:
        return max(0.0, self._t0 + k * self.interval_s - time.monotonic())

    def _run(self) -> None:
        prev = self._baseline()
        if prev is None:
            return
        if not self.engine_hint and prev.engine != "unknown":
            self.engine = prev.engine
        prev_t = time.monotonic()
        self._keep(prev, prev_t - self._t0)
        k = max(1, round((prev_t - self._t0) / self.interval_s) + 1)
        while not self._stop.wait(self._next_tick(k)):
            k = max(k + 1, int((time.monotonic() - self._t0) / self.interval_s) + 1)
            cur = self._scrape_all()
            now = time.monotonic()
            if cur is None:
                self.failed_ticks += 1
                continue
            self._record(prev, cur, now - prev_t, now - self._t0)
            self.backwards += went_backwards(prev, cur)
            self._keep(cur, now - self._t0)
            prev, prev_t = cur, now

    def _record(self, prev: Scrape, cur: Scrape, dt: float, t: float) -> None:
        row: dict[str, float | None] = {}
        for series, srcs in candidates(self.engine).items():
            src = self.chosen.get(series)
            if src is None:
                src = next((s for s in srcs if all(n in cur.total for n in source_names(s))), None)
                if src is None:
                    continue
                self.chosen[series] = src
            self.seen.add(series)
            row[series] = value_of(src, prev, cur, dt)
        self.t.append(round(t, 3))
        self.rows.append(row)

    # ---- result --------------------------------------------------------------------------------
    @property
    def mixed_note(self) -> str | None:
        """The line saying that several instances answer behind the metrics URL, when they seem to."""
        if self.backwards < MIXED_INSTANCES_TICKS:
            return None
        return (
            f"server telemetry: the counters at {','.join(self.urls)} went backwards {self.backwards} times "
            "during the run: several server instances answer behind it in turn (a router or load "
            "balancer over replicas), so its figures (token rates, prefix-cache hit rate, server "
            "latency) mix them; give --metrics-url once per replica (docs/telemetry.md)"
        )

    @property
    def note(self) -> str | None:
        if self.t or (self.last is not None and self.last is not self.first):
            return None
        why = "; ".join(f"{u}: {e}" for u, e in self.errors.items()) or "no answer during the run"
        return f"server telemetry: no metrics recorded ({why})"

    def result(
        self, run_started_epoch: float | None = None, window: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """run.json ``telemetry``: url, engine, interval_s, t, series, and when the server has latency
        histograms ``server_latency`` (whole run; ``judged`` within it for a judged ``window`` with
        epoch ``start``/``end``). ``t`` counts seconds from ``run_started_epoch`` (the load's start)
        when given, else from the poller's start; points before the load started are dropped."""
        shift = self.started_epoch - run_started_epoch if run_started_epoch else 0.0
        lat = self.server_latency(shift, window)
        if not self.t and lat is None:
            return None
        keep = [i for i, t in enumerate(self.t) if t + shift >= 0]
        series = {s: [self.rows[i].get(s) for i in keep] for s in SERIES if s in self.seen}
        out: dict[str, Any] = {
            "url": ",".join(self.urls),
            "engine": self.engine,
            "interval_s": self.interval_s,
            "t": [round(self.t[i] + shift, 3) for i in keep],
            "series": series,
        }
        if lat is not None:
            out["server_latency"] = lat
        spec = spec_decode_summary(self.first, self.last)
        if spec is not None:
            out["spec_decode"] = spec
        if self.mixed_note is not None:
            out["mixed_instances"] = self.backwards
        replicas = self.replicas()
        if replicas:
            out["replicas"] = replicas
        return out

    def replicas(self) -> list[dict[str, Any]]:
        """Each engine URL's own figures (run.json ``telemetry.replicas``) when more than one is polled
        (replicas given with --metrics-url, or --host per replica); a GPU exporter is not a replica."""
        urls = [u for u in self.urls if u not in self.bare_urls and u in self.views]
        if len(urls) < 2:
            return []
        return [self.views[u].figures() for u in urls]

    def server_latency(
        self, shift: float = 0.0, window: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The server's latency histograms between the first and the last scrape (docs/telemetry.md)."""
        if self.first is None or self.last is None or self.last is self.first or len(self.snaps) < 2:
            return None
        metrics = hist.server_latency(self.first, self.last, self.engine)
        if not metrics:
            return None
        out: dict[str, Any] = {
            "method": hist.METHOD,
            "from_s": round(self.snaps[0][0] + shift, 3),
            "to_s": round(self.snaps[-1][0] + shift, 3),
            "metrics": metrics,
        }
        if window and window.get("start") is not None and window.get("end") is not None:
            t_from = float(window["start"]) - self.started_epoch
            t_to = float(window["end"]) - self.started_epoch
            pair = hist.nearest_snapshots(self.snaps, t_from, t_to)
            if pair is not None:
                (ta, a), (tb, b) = pair
                judged = hist.server_latency(
                    hist.expand(a, self.engine), hist.expand(b, self.engine), self.engine, with_bounds=False
                )
                if judged:
                    out["judged"] = {
                        "from_s": round(ta + shift, 3),
                        "to_s": round(tb + shift, 3),
                        "metrics": judged,
                    }
        return out

    def prefix_cache(self) -> dict[str, Any] | None:
        """The server's prefix-cache hit rate over the run: hit over queried tokens between the first
        and the last scrape, else the mean of the engine's hit-rate gauge; None when it has neither."""
        if self.first is None or self.last is None:
            return None
        last = self.last
        src = self.chosen.get("prefix_cache_hit_rate") or next(
            (
                s
                for s in candidates(self.engine)["prefix_cache_hit_rate"]
                if isinstance(s, Ratio) and all(n in last.total for n in source_names(s))
            ),
            None,
        )
        if src is None:
            return None
        if isinstance(src, Ratio):
            num = increase(self.first, self.last, src.num)
            dens = [increase(self.first, self.last, n) for n in src.den]
            if num is None or any(d is None for d in dens):
                return None
            den = sum(d for d in dens if d is not None)
            if den <= 0:
                return None
            return {
                "hit_rate": fraction(num / den),
                "hit": round(num, 3),
                "queried": round(den, 3),
                "source": f"{src.num} / {' + '.join(src.den)}",
            }
        values = [row.get("prefix_cache_hit_rate") for row in self.rows]
        got = [v for v in values if v is not None]
        if not got:
            return None
        name = src.name if isinstance(src, Gauge) else "prefix_cache_hit_rate"
        return {"hit_rate": round(sum(got) / len(got), 4), "source": f"{name} (mean of the polls)"}
