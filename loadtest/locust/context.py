"""Per-process run state: workload, recorder, record log and clients, attached to the Locust environment."""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import psutil
from locust.env import Environment

from loadtest.client.apis import configure_client
from loadtest.client.balancer import BalancedClient, Balancer
from loadtest.client.openai import OpenAIClient, PreparedRequest, Timeouts
from loadtest.client.quality import failed_checks
from loadtest.client.record import RequestRecord
from loadtest.client.secrets import install_redaction, load_api_key
from loadtest.contracts.messages import InFlight
from loadtest.locust.settings import RunSettings
from loadtest.locust.shipping import ShippedLog
from loadtest.metrics.recorder import Recorder
from loadtest.metrics.slo import RequestSlo, merge_slos
from loadtest.profile.client import RetrySpec
from loadtest.profile.quality import CaptureSpec
from loadtest.results.capture import CaptureLog, share
from loadtest.results.durable import WriteFailure
from loadtest.results.record_log import RecordLog
from loadtest.workload.units import Unit

log = logging.getLogger("loadtest")
_MAX_MESSAGES = 50  # distinct error messages kept per failing streak (bounded memory)
# Closed loop: units built together (next_closed_loop_unit), when one builds in under BLOCK_BUILD_MAX_NS
# (a short prompt's; a long prompt's unit is built alone, in its turn, so a block never holds much memory).
# A block stops at CLOSED_LOOP_BLOCK units or once it has held the event loop BLOCK_SPAN_NS, whichever
# comes first (64 rather than 16: 7 % less CPU a 2-token request, tests/bench/README.md).
CLOSED_LOOP_BLOCK = 64
BLOCK_BUILD_MAX_NS = 200_000
BLOCK_SPAN_NS = 1_000_000


class FailingStreak:
    """Finished requests that failed in a row since the last success, for the early stop.

    The run fails wholesale when at least ``min_failed`` finished requests in a row failed and
    none succeeded for ``min_seconds`` (since the first failure of the streak was scheduled).
    Cancelled requests (stopped by the generator) neither extend nor end a streak.
    """

    def __init__(self, min_failed: int, min_seconds: float) -> None:
        self.min_failed = min_failed
        self.min_seconds = min_seconds
        self.any_ok = False
        self.failed = 0
        self.first_ns = 0
        self.causes: Counter[str] = Counter()

    def add(self, rec: RequestRecord) -> bool:
        """Account one record; True when the run is now failing wholesale."""
        if rec.outcome == "cancelled":
            return False
        if rec.outcome == "ok":
            self.any_ok = True
            self.failed, self.first_ns = 0, 0
            self.causes.clear()
            return False
        if not self.failed:
            self.first_ns = rec.scheduled_ns or time.perf_counter_ns()
        self.failed += 1
        msg = " ".join((rec.error or "").split())[:120]
        key = f"{rec.outcome}: {msg}" if msg else rec.outcome
        if key in self.causes or len(self.causes) < _MAX_MESSAGES:
            self.causes[key] += 1
        return self.min_failed > 0 and self.failed >= self.min_failed and self.seconds() >= self.min_seconds

    def seconds(self) -> float:
        return (time.perf_counter_ns() - self.first_ns) / 1e9 if self.failed else 0.0

    def info(self, worker: int) -> dict[str, Any]:
        """What run.json's ``stopped_early`` records (commonest: the streak's commonest class and message)."""
        return {
            "failed_in_a_row": self.failed,
            "seconds": round(self.seconds(), 3),
            "any_ok": self.any_ok,
            "commonest": self.causes.most_common(1)[0][0] if self.causes else None,
            "worker": worker,
        }


class RunContext:
    """What the users of one process share; ``finish`` is the single place a record is accounted."""

    def __init__(
        self,
        settings: RunSettings,
        worker_index: int,
        n_workers: int,
        log_name: str | None,
        reports: bool = False,
    ) -> None:
        """``reports``: this process ships its metrics to a master (the recorder keeps their deltas);
        ``log_name`` None: no record log is opened here (a worker ships its lines: it sets ``log``)."""
        self.settings = settings
        self.worker_index = worker_index
        self.n_workers = max(1, n_workers)
        self.profile, self.profile_path = settings.profile()
        self.workload = settings.workload(self.profile)
        self.balancer: Balancer | None = None  # several endpoints: the one balancer of the process's clients
        self.build_unit: Callable[[int], Unit] = self.workload.unit  # the closed loop's unit of an index
        self.recorder = Recorder(
            per_scenario=len(self.profile.scenarios) > 1,
            per_endpoint=len(settings.hosts or ()) > 1,  # the live metrics' per-endpoint split
            deltas=reports,
        )
        # Per-request SLO (TTFT and TPOT limits) for live attainment and goodput; None without one.
        rule = RequestSlo.from_slos(merge_slos(self.profile.slos, settings.slo))
        self.request_slo = rule if rule.ttft_ms is not None or rule.tpot_ms is not None else None
        # The first run file that could not be written (a full disk); on_write_failed ends the run.
        self.write_failure: WriteFailure | None = None
        self.on_write_failed: Callable[[WriteFailure], None] | None = None
        self.log: RecordLog | ShippedLog = (
            RecordLog(Path(settings.out_dir) / log_name, self._write_failed) if log_name else ShippedLog(None)
        )
        self._api_key = load_api_key(settings.api_key_env, settings.api_key_file)
        install_redaction(self._api_key)
        self.retries = RetrySpec.model_validate(settings.retries or {})
        self._extra_body = dict(self.profile.request.extra_body)  # what the answer checks read with the body
        self.capture_spec = (
            CaptureSpec.model_validate(settings.capture) if settings.capture else self.profile.capture
        )
        self.capture: CaptureLog | None = None  # open_capture: where this process's capture file goes
        self._closed_counter = itertools.count()
        self._closed_ahead: deque[tuple[int, Unit | None]] = deque()  # next_closed_loop_unit's block
        # Where Locust's request event is fired (its statistics, for a web UI): None, not fired.
        self.env: Environment | None = None
        # The requests in flight (keyed by their record's id()): a worker reports them with each report.
        self._sending: dict[int, tuple[RequestRecord, PreparedRequest, int, float]] = {}
        self.stopping = False  # set at the end of the run: issue nothing new, let in-flight requests finish
        # Set when the end-of-run drain ran out with requests still waiting on the endpoint: those are
        # the endpoint's timeouts (errors), not the generator's cancellations.
        self.drain_expired_s: float | None = None
        judging = self.profile.judging
        self.streak = FailingStreak(judging.stop_after_failed, judging.stop_after_failing_s)
        self.failure_backoff_max_s = self.profile.client.failure_backoff_max_s
        # Called once, with FailingStreak.info(), when the run fails wholesale; the runtime ends the
        # run (a worker tells its master). None (the web UI): runs are never stopped early.
        self.on_failing: Callable[[dict[str, Any]], None] | None = None
        # --max-requests: this process's share of the units to issue (None: no bound); on_issued is
        # called once, when the last of them has been issued (the runtime then ends the load).
        self.units_left = unit_share(settings.max_requests, worker_index, self.n_workers)
        # Units taken and units whose run ended: the drain waits for both to agree (an open-loop unit
        # taken but not yet started has no request in flight yet).
        self.units_taken = self.units_ended = 0
        self.on_issued: Callable[[], None] | None = None
        self.failing: dict[str, Any] | None = None
        self._cpu_sampler = gevent.spawn(self._sample_cpu)

    def _sample_cpu(self) -> None:
        """Once a second: this process's CPU use, for the verdict's generator-health check."""
        proc = psutil.Process()
        gevent.sleep(2.0)  # start-up (users spawning, first units built) is not the steady load
        proc.cpu_percent(None)
        while True:
            gevent.sleep(1.0)
            self.recorder.sample_cpu(proc.cpu_percent(None))

    def new_client(self) -> OpenAIClient | BalancedClient:
        """A stream's client: of the endpoint, or over the run's endpoints (one Balancer per process)."""
        s = self.settings
        if not (s.hosts and len(s.hosts) > 1):
            return self.endpoint_client(s.host)
        if self.balancer is None:
            self.balancer = Balancer(len(s.hosts), s.balance)
        return BalancedClient(self.endpoint_client, list(s.hosts), self.balancer)

    def endpoint_client(self, host: str) -> OpenAIClient:
        """A keep-alive client of the endpoint at ``host``."""
        s = self.settings
        client = OpenAIClient(
            host,
            s.model or self.profile.model,
            self.workload.tokenizer,
            api_key=self._api_key,
            timeouts=Timeouts(connect=s.connect_timeout, read=s.read_timeout, total=s.total_timeout),
            worker=self.worker_index,
            network=s.policy(),
        )

        configure_client(client, self.profile)  # the profile's auth scheme, headers and extra body fields
        return client

    def next_closed_loop_index(self) -> int:
        """Global request index for closed loop: workers interleave so indices never collide."""
        return self.worker_index + self.n_workers * next(self._closed_counter)

    def next_closed_loop_unit(self) -> Unit:
        """The closed loop's next unit (``next_closed_loop_index``'s). Units that build fast are built
        up to ``CLOSED_LOOP_BLOCK`` at a time, for ``BLOCK_SPAN_NS`` at most: back to back, a short
        request's build takes less CPU than between two requests (tests/bench/README.md). A unit is the
        same whenever it is built."""
        if self._closed_ahead:
            index, unit = self._closed_ahead.popleft()
            return unit if unit is not None else self.build_unit(index)
        t0 = time.perf_counter_ns()
        unit = self.build_unit(self.next_closed_loop_index())
        if time.perf_counter_ns() - t0 < BLOCK_BUILD_MAX_NS:
            self._build_ahead(t0 + BLOCK_SPAN_NS)
        return unit

    def _build_ahead(self, until_ns: int) -> None:
        """The next units of the block, no more than may still be issued (--max-requests), until
        ``until_ns`` (perf_counter_ns)."""
        more = (
            CLOSED_LOOP_BLOCK - 1 if self.units_left is None else min(CLOSED_LOOP_BLOCK - 1, self.units_left)
        )
        for _ in range(more):
            index = self.next_closed_loop_index()
            try:
                self._closed_ahead.append((index, self.build_unit(index)))
            except Exception:  # noqa: BLE001 - built again in its turn, which raises it there
                self._closed_ahead.append((index, None))
                return
            if time.perf_counter_ns() > until_ns:
                return

    @staticmethod
    def now() -> tuple[int, float]:
        return time.perf_counter_ns(), time.time()

    def take_unit(self) -> bool:
        """Whether another unit may be issued (--max-requests); the last one allowed calls on_issued."""
        left = self.units_left
        if left is None:
            self.units_taken += 1
            return True
        if left <= 0:
            return False
        self.units_left = left - 1
        self.units_taken += 1
        if left == 1 and self.on_issued is not None:
            self.on_issued()
        return True

    def skip_arrival(self) -> None:
        """An open-loop arrival not sent because load.max_in_flight was reached (counted in run.json)."""
        self.recorder.note("skipped_arrivals")

    def open_capture(self, folder: Path, name: str) -> None:
        """Capture into ``folder/name`` when the run captures (``capture`` in the profile, --capture)."""
        if self.capture_spec is not None:
            secrets = (self._api_key,) if self._api_key else ()
            self.capture = CaptureLog(
                folder / name,
                self.capture_spec,
                self.worker_index,
                self.n_workers,
                self.settings.seed,
                secrets,
                self._write_failed,
            )

    def _write_failed(self, failure: WriteFailure) -> None:
        """A run file could not be written: said once, and the run ends (on_write_failed) as on Ctrl-C."""
        if self.write_failure is not None:
            return
        self.write_failure = failure
        if self.on_write_failed is None:  # a worker's own files: what it ships still reaches the master
            log.error("%s: that file is no longer written", failure.describe())
            return
        log.error("%s: stopping the run, counting every finished request it cannot write", failure.describe())
        self.on_write_failed(failure)

    @property
    def in_flight(self) -> int:
        """Requests sent (or about to be) and not yet accounted by ``finish``."""
        return len(self._sending)

    def sending(self, rec: RequestRecord, req: PreparedRequest, sched_ns: int, sched_epoch: float) -> None:
        """``rec`` is about to be sent: in flight until ``finish`` accounts it."""
        self._sending[id(rec)] = (rec, req, sched_ns, sched_epoch)

    def pending(self) -> list[InFlight]:
        """The requests in flight now, as a worker reports them (their sent time once sent)."""
        out = []
        for rec, req, sched_ns, sched_epoch in self._sending.values():
            sent = (rec.sent_ns - sched_ns) // 1000 if rec.sent_ns else None
            out.append(InFlight(req.request_id, req.scenario, req.api, round(sched_epoch, 6), sent))
        return out

    def judge_answer(self, rec: RequestRecord, req: PreparedRequest) -> None:
        """The answer checks of an ok record (client/quality.py): the ones it failed into the record."""
        rec.quality_failed = failed_checks(rec, req, self._extra_body, self.profile.quality) or None

    def finish(self, rec: RequestRecord) -> None:
        """Account one finished (or cancelled) request: metrics, record log, capture, Locust's own stats."""
        self._sending.pop(id(rec), None)
        self.recorder.add(rec)
        if self.request_slo is not None and rec.outcome != "cancelled":
            self.recorder.judge_request(rec, self.request_slo.is_good_record(rec))
        if rec.session is not None:
            slo = self.request_slo
            self.recorder.converse(rec, rec.outcome == "ok" if slo is None else slo.is_good_record(rec))
        self.log.write(rec)
        if self.capture is not None:
            self.capture.offer(rec)
        if (
            self.streak.add(rec)
            and self.failing is None
            and not self.stopping
            and self.on_failing is not None
        ):
            self.failing = self.streak.info(self.worker_index)
            log.error(
                "the endpoint is failing: the last %d requests failed and none succeeded for %.1f s (%s); "
                "stopping the run early",
                self.failing["failed_in_a_row"],
                self.failing["seconds"],
                self.failing["commonest"],
            )
            self.on_failing(self.failing)
        if self.env is not None:
            e2e = ((rec.done_ns or rec.sent_ns or rec.scheduled_ns) - rec.scheduled_ns) / 1e6
            # Locust's Statistics and Charts tabs show this time: the type says it is the E2E latency
            # (from the scheduled time) and the size the output tokens; TTFT, ITL, TPOT are on the LLM views.
            self.env.events.request.fire(
                request_type=_request_type(rec.api),
                name=rec.scenario,
                response_time=e2e,
                response_length=rec.output_tokens,
                exception=None if rec.outcome == "ok" else Exception(f"{rec.outcome}: {rec.error}"),
                context={},
            )

    def close(self) -> None:
        self._cpu_sampler.kill(block=False)
        self.recorder.flush()
        self.log.close()
        if self.capture is not None:
            self.capture.close()


@functools.cache
def _request_type(api: str) -> str:
    """Locust's request type for an API's records (one string per API, not one per request)."""
    return f"{api.upper()} E2E (size: output tokens)"


def unit_share(total: int | None, index: int, n: int) -> int | None:
    """Worker ``index`` of ``n``'s share of ``total`` units (None: no bound); the shares add up to it."""
    return None if total is None else share(total, index, n)
