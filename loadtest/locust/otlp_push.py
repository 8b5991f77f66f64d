"""The run's live metrics pushed over OTLP/HTTP (protobuf) to an OpenTelemetry collector: at the start,
every interval and once more at the end (``--otlp``, ``--otlp-endpoint``; docs/telemetry.md).

Each push is one snapshot of the very families ``--prometheus-port`` renders (``LiveCollector.collect``),
translated by loadtest/locust/otlp_data.py into the SDK's public metrics data (``MetricsData`` of
``opentelemetry.sdk.metrics.export``) and handed to ``OTLPMetricExporter.export``, the exporter's
documented entry point: its encoding, retries with backoff, TLS and compression settings and its
reading of the ``OTEL_EXPORTER_OTLP_*HEADERS`` variables are the library's, and nothing here touches
its internals. The SDK's instruments are not used: OpenTelemetry's API has no asynchronous
histogram, and the run's HDR histograms already hold the figures, so they are handed over as they are
rather than aggregated a second time. A collector that is down, slow or refusing never stops the run:
the push runs in its own greenlet, the first failure is one warning (the reason, never a header), and
run.json's notes count the failed pushes."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import gevent
import gevent.lock

from loadtest.errors import UsageError
from loadtest.locust.otlp_data import metrics_data

if TYPE_CHECKING:
    from loadtest.locust.prometheus import LiveCollector

log = logging.getLogger(__name__)

SIGNAL_PATH = "/v1/metrics"  # OTLP/HTTP's path for metrics (docs/sources.md §15)
DEFAULT_BASE = "http://localhost:4318"  # the spec's default endpoint for OTLP/HTTP
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
INSTALL_HINT = "pip install 'loadtest[otlp]'"
EXPORTER_LOGGER = "opentelemetry.exporter"  # the exporter's own log lines: folded into one warning
FAILED_LAST_S = 1.0  # the final push's bound when the collector is not answering
PUSH_MAX_S = 5.0  # one push's bound, retries included (shorter when the interval is)


@dataclass(frozen=True)
class OtlpTarget:
    """Where and how often to push: ``endpoint`` the metrics URL (resolved), ``headers`` those given on
    the command line (the exporter adds the ``OTEL_EXPORTER_OTLP_*HEADERS`` ones)."""

    endpoint: str
    interval_s: float
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def timeout_s(self) -> float:
        """One push's bound, retries included: within the interval, at most ``PUSH_MAX_S``."""
        return min(self.interval_s, PUSH_MAX_S)


def resolve_endpoint(given: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The metrics URL, as OpenTelemetry's exporter configuration says (docs/sources.md §15): the given
    one (a bare base URL gets ``/v1/metrics``), else ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` as it is,
    else ``OTEL_EXPORTER_OTLP_ENDPOINT`` with ``/v1/metrics``, else ``http://localhost:4318/v1/metrics``."""
    env = os.environ if environ is None else environ
    if given:
        parts = urlsplit(given)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(
                f"--otlp-endpoint {shown(given)!r}: not an http(s) URL; give the collector's OTLP/HTTP "
                "URL, e.g. http://otel-collector:4318 (/v1/metrics is added to a bare base URL)"
            )
        return given.rstrip("/") + SIGNAL_PATH if parts.path in ("", "/") else given
    signal, base = env.get(ENDPOINT_VARS[0]), env.get(ENDPOINT_VARS[1])
    if signal:
        return signal
    return (base or DEFAULT_BASE).rstrip("/") + SIGNAL_PATH


def shown(url: str) -> str:
    """A URL for logs and run.json: scheme, host, port and path only (no user info, no query)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else "(not a URL)"


def require_exporter() -> None:
    """UsageError naming the extra to install when the OTLP exporter is not there."""
    try:
        import opentelemetry.exporter.otlp.proto.http.metric_exporter  # noqa: F401
        import opentelemetry.sdk.metrics.export  # noqa: F401
    except ImportError as e:
        raise UsageError(
            f"--otlp-endpoint/--otlp need the OpenTelemetry OTLP exporter, which is not installed "
            f"({e.name or e}): {INSTALL_HINT}"
        ) from e


def _describe(error: Any) -> str:
    """An exporter error in a few words (its class; never its request)."""
    if isinstance(error, BaseException):
        text = str(error)
        for known in ("Connection refused", "timed out", "Name or service not known"):
            if known in text:
                return f"{type(error).__name__}: {known.lower()}"
        return type(error).__name__
    return str(error) if isinstance(error, str) and len(error) < 80 else "no answer"


def _probe(url: str, timeout_s: float = 1.0) -> str:
    """Why a push got no answer, when the exporter did not say: can the collector's port be reached?"""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            return "no answer in time"
    except OSError as e:
        if isinstance(e, TimeoutError):
            return "connect timed out"
        return (e.strerror or type(e).__name__).lower()


class _Reasons(logging.Handler):
    """The exporter's own warnings and errors, kept as the last failure's reason instead of printed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reset()

    def reset(self) -> None:
        """Before each push."""
        self.last: str | None = None
        self.transient: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        template, args = str(record.msg), record.args if isinstance(record.args, tuple) else ()
        if template.startswith("Transient error") and args:
            self.transient = _describe(args[0])
        elif template.startswith("Failed to export") and "code" in template and len(args) >= 3:
            status, reason = args[1], args[2]
            if status:
                self.last = f"HTTP {status}" + (f" {reason}" if isinstance(reason, str) else "")
            else:
                self.last = _describe(reason)
        elif template.startswith("Failed to export"):
            self.last = f"gave up after retries: {self.transient}" if self.transient else None
        else:
            self.last = "exporter error"


@dataclass
class PushTally:
    """How the pushes went: how many were made, how many failed, the first failure's reason."""

    pushes: int = 0
    failed: int = 0
    taken: int = 0  # pushes the collector took
    first_error: str | None = None
    last_ok: bool = True

    @property
    def answering(self) -> bool:
        """The collector took a push, and the last one."""
        return self.last_ok and self.taken > 0


class OtlpPusher:
    """``start()`` pushes ``collector``'s figures at once and every ``target.interval_s`` from its own greenlet;
    ``finish()`` makes the last push (the final figures, once ``LiveMetrics.final`` set them);
    ``stop()`` ends it all. ``notes()``: run.json's lines about failed pushes."""

    def __init__(self, collector: LiveCollector, target: OtlpTarget, resource: Mapping[str, str]) -> None:
        self.collector, self.target, self.resource = collector, target, dict(resource)
        self.tally = PushTally()
        self._start_ns = time.time_ns()
        self._exporter: Any = None
        self._loop: gevent.Greenlet | None = None
        self._pushing = gevent.lock.Semaphore()
        self._reasons = _Reasons()
        self._logger = logging.getLogger(EXPORTER_LOGGER)
        self._propagate = self._logger.propagate

    def start(self) -> OtlpPusher:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        self._logger.addHandler(self._reasons)
        self._logger.propagate = False
        self._exporter = OTLPMetricExporter(
            endpoint=self.target.endpoint, headers=dict(self.target.headers), timeout=self.target.timeout_s
        )
        self._loop = gevent.spawn(self._every_interval)
        print(
            f"live metrics (OTLP push): {shown(self.target.endpoint)} every {self.target.interval_s:g}s",
            flush=True,
        )
        return self

    def _every_interval(self) -> None:
        """A push at once (the run appears; whether the collector answers is known before the end), then
        one every interval."""
        due = time.monotonic()
        while True:
            self.push()
            due += self.target.interval_s
            gevent.sleep(max(0.0, due - time.monotonic()))

    def push(self) -> bool:
        """One snapshot pushed; False (counted, the first warned about) when the collector did not take it."""
        with self._pushing:  # the loop's push and the final one never overlap
            return self._push()

    def _push(self) -> bool:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        from loadtest import __version__

        data = metrics_data(
            self.collector.collect(), self.resource, self._start_ns, time.time_ns(), __version__
        )
        self.tally.pushes += 1
        self._reasons.reset()
        ok = False
        try:
            result = self._exporter.export(data, timeout_millis=self.target.timeout_s * 1000)
            ok = result == MetricExportResult.SUCCESS
            self.tally.taken += ok
        except gevent.Timeout:  # the final push's bound
            self._reasons.last = "no answer in time"
            raise
        except gevent.GreenletExit:  # cut short at the end of the run: what it had met so far
            self._reasons.last = self._reasons.transient
            raise
        except Exception as e:  # the exporter's own failure must not end the run either
            self._reasons.last = _describe(e)
        finally:
            self.tally.last_ok = ok
            if not ok:
                self._failed(self._reasons.last)
        return ok

    def _failed(self, reason: str | None) -> None:
        self.tally.failed += 1
        if self.tally.first_error is None:
            reason = self.tally.first_error = reason or _probe(self.target.endpoint)
            log.warning(
                "OTLP push to %s failed (%s); the run goes on, pushing every %gs",
                shown(self.target.endpoint),
                reason,
                self.target.interval_s,
            )

    def finish(self) -> None:
        """The last push, of the final figures, once the loop has ended. While the collector answers (it
        took a push, and the last one), a push under way ends first (within its timeout) and the last one
        has the push timeout; otherwise the one under way is cut short (counted as failed) and the last
        one has 1 s, so that a dead collector does not hold the end of the run."""
        answering = self.tally.answering
        if self._pushing.acquire(
            blocking=answering, timeout=self.target.timeout_s + 1 if answering else None
        ):
            self._kill_loop()  # between two pushes: asleep
            self._pushing.release()
        else:
            self._kill_loop()  # the push under way: cut short
        bound = self.target.timeout_s if self.tally.answering else min(self.target.timeout_s, FAILED_LAST_S)
        with gevent.Timeout(bound, False):
            self.push()

    def _kill_loop(self) -> None:
        if self._loop is not None:
            self._loop.kill(block=True, timeout=1)
            self._loop = None

    def stop(self) -> None:
        self._kill_loop()
        if self._exporter is not None:
            self._exporter.shutdown()
            self._exporter = None
        self._logger.removeHandler(self._reasons)
        self._logger.propagate = self._propagate

    def notes(self) -> list[str]:
        """run.json's note when any push failed: how many, and the first reason."""
        t = self.tally
        if not t.failed:
            return []
        return [
            f"OTLP push to {shown(self.target.endpoint)}: {t.failed} of {t.pushes} pushes failed "
            f"(first: {t.first_error}); run.json has the run's figures in full"
        ]
