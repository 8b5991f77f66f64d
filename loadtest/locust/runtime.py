"""Drives a run on Locust's runners: the pieces every mode shares (the load, the stop on a signal, the
drain) and one local process (``run_local``). The distributed modes are ``master.run_master`` and
``worker_session.worker_main``.

Settings travel from the master to each worker when it connects (``loadtest_settings``: the settings,
the profile's content and the workload fingerprint; never the API key, only its variable's name).
Records travel the other way: each report carries the histogram delta and the zlib-compressed record
lines finished since the last report, taken together, so the master's run folder holds exactly the
records its merged histograms count. End of a run: stop issuing, let in-flight requests finish (drain,
bounded), stop the users, and collect every worker's final delta and lines through an explicit
request/reply. An interrupt (Ctrl-C, SIGTERM) skips the drain: in-flight requests are recorded as
cancelled; a process too busy to yield is made to (``Stopper``: within about a second). A run file that
cannot be written (a full disk) stops the run the same way, and what could not be written is counted.
A worker that dies is noticed (process exit, or no heartbeat for ``master.LOST_AFTER_S``); what it
reported is kept, its requests in flight at its last report are recorded as lost, and the run names it
(docs/durability.md).
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import greenlet
from gevent.event import Event
from locust.env import Environment
from locust.runners import Runner

from loadtest.contracts.messages import (
    WireMessage,
    to_data,
)
from loadtest.gc_tuning import tune_gc
from loadtest.locust.context import RunContext
from loadtest.locust.executors import executor_for
from loadtest.locust.host_cpu import HostCpu
from loadtest.locust.progress import ProgressPrinter
from loadtest.locust.prometheus import LiveMetrics, LiveView
from loadtest.locust.ramp import Ramp
from loadtest.locust.settings import RunSettings
from loadtest.metrics.recorder import RunAggregates
from loadtest.metrics.run_length import drain_timeout_for
from loadtest.profile.schema import Profile
from loadtest.results.capture import CAPTURE_FILE
from loadtest.results.durable import Reserve, WriteFailure

log = logging.getLogger("loadtest")

# The master/worker messages are the Structs of contracts/messages.py (Hello, Settings, Ready, Finish,
# Final, Failing; Report rides in each Locust worker report, every WORKER_REPORT_INTERVAL = 3 s); they
# travel as the dict form its to_data / from_data make, through send and from_data only.


@dataclass
class RunOutcome:
    """What the runtime hands back for run.json."""

    aggregates: RunAggregates
    interrupted_reason: str | None = None
    signal: str | None = None  # SIGINT / SIGTERM when a signal ended the run (its exit code: 130 / 143)
    record_files: list[str] = field(default_factory=list)
    records_written: int = 0
    workers_lost: list[int] = field(default_factory=list)
    started_epoch: float = 0.0
    ended_epoch: float = 0.0
    # The run was stopped early because the endpoint failed wholesale: RunContext.failing (None otherwise).
    stopped_early: dict[str, Any] | None = None
    # The first run file that could not be written (a full disk): WriteFailure.describe(); None otherwise.
    write_failure: str | None = None
    records_lost: int = 0  # finished requests counted in the aggregates but not in the record log
    lost_in_flight: int = 0  # lost workers' requests in flight, recorded as cancelled (outcome unknown)
    ramp: Ramp | None = None  # the closed loop's start (locust/ramp.py); None: another load, or stopped first


def send(runner: Runner, msg: WireMessage, client_id: str | None = None) -> None:
    """Send a typed message (to one worker when ``client_id`` is given; a worker sends to its master)."""
    runner.send_message(msg.TYPE, to_data(msg), client_id)


def user_class(profile: Profile) -> type:
    return executor_for(profile.load).user_class


def drive_load(
    runner: Runner, profile: Profile, settings: RunSettings, stopper: Stopper, host: HostCpu
) -> Ramp | None:
    """Start the users and keep the load the profile asks for until the duration ends or a signal comes
    (the profile's executor, locust/executors.py); the closed loop's start ramp, which watches ``host``."""
    return executor_for(profile.load).drive(
        runner, settings.duration_s, settings.processes, stopper.event, host
    )


BUSY_CHECK_S = 0.5  # after a stop: a greenlet that does not yield for this long (to twice it) is ended


class Stopper:
    """Ends the wait early on SIGINT/SIGTERM (or a failed write) and remembers what did it.

    The signal handlers are Python's own, which run between two bytecodes even while a greenlet computes
    without yielding (building a huge unit): the stop is noted at once. Until the run has stopped
    (``stopped``), a timer checks every ``BUSY_CHECK_S`` that the event loop ran since the last check;
    when it did not, the greenlet that holds the process is ended (GreenletExit, as Locust stops its
    users), so the stop takes effect within about a second."""

    def __init__(self) -> None:
        self.event = Event()
        self.reason: str | None = None
        self.failure: WriteFailure | None = None
        self._ticking = False
        self._done = False  # the load has stopped: a later signal changes nothing
        self._loop_ran = True
        self._alarm: Any = None  # SIGALRM's handler before the busy checks

    def install(self) -> None:
        """From now on, for the life of the process (a second Ctrl-C while the results are written changes
        nothing), SIGINT and SIGTERM stop this run."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, sig: int, _frame: Any = None) -> None:
        if self.reason is None:
            self.reason = signal.Signals(sig).name
            log.warning("%s received: stopping the run, keeping every finished request", self.reason)
        self._stop()

    def fail(self, failure: WriteFailure) -> None:
        """A run file could not be written: the run stops as on Ctrl-C (no drain), the failure kept."""
        if self.failure is None:
            self.failure = failure
        self._stop()

    @property
    def interrupted(self) -> bool:
        """A signal or a failed write ended the load: no drain."""
        return self.reason is not None or self.failure is not None

    def _stop(self) -> None:
        gevent.get_hub().loop.run_callback(self.event.set)
        if not self._ticking and not self._done:
            self._ticking = True
            self._alarm = signal.signal(signal.SIGALRM, self._on_tick)
            signal.setitimer(signal.ITIMER_REAL, BUSY_CHECK_S, BUSY_CHECK_S)

    def _on_tick(self, _sig: int, _frame: Any = None) -> None:
        if not self._ticking:
            return
        if self._loop_ran:  # the loop ran since the last check: ask it to say so again
            self._loop_ran = False
            gevent.get_hub().loop.run_callback(self._ran)
            return
        current = greenlet.getcurrent()
        hub = gevent.get_hub()
        if current is not hub and current.parent is not None:  # a greenlet, not the main one
            log.warning("the run is busy: ending the greenlet that did not yield for %gs", BUSY_CHECK_S)
            raise greenlet.GreenletExit

    def _ran(self) -> None:
        self._loop_ran = True

    def stopped(self) -> None:
        """The load has stopped: no more busy checks (SIGALRM's handler as it was)."""
        self._done = True
        if self._ticking:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._alarm if self._alarm is not None else signal.SIG_DFL)
            self._ticking = False


def drain(ctx: RunContext, timeout: float) -> None:
    """Let requests in flight finish, at most ``timeout`` s; those still waiting then are the endpoint's."""
    ctx.stopping = True
    deadline = time.monotonic() + timeout
    while (ctx.in_flight > 0 or ctx.units_ended < ctx.units_taken) and time.monotonic() < deadline:
        gevent.sleep(0.05)
    if ctx.in_flight > 0:
        ctx.drain_expired_s = timeout


def run_local(settings: RunSettings, live: LiveMetrics | None = None) -> RunOutcome:
    """Everything in this process; ``live``: the live metrics read this process's recorder."""
    reserve = Reserve(Path(settings.out_dir))
    stopper = Stopper()
    ctx = RunContext(settings, 0, 1, "records.jsonl")

    def write_failed(failure: WriteFailure) -> None:
        reserve.release()
        stopper.fail(failure)

    ctx.on_write_failed = write_failed
    if live is not None:
        live.attach(lambda: LiveView(ctx.recorder.result(), ctx.in_flight))
    ctx.open_capture(Path(settings.out_dir), CAPTURE_FILE)
    env = Environment(user_classes=[user_class(ctx.profile)], host=settings.host)
    # ctx.env stays None: Locust's statistics feed its web UI, and a local run has none (the `ui`
    # command's runs and workers fire Locust's request event; the run's figures never come from it).
    env.loadtest = ctx  # type: ignore[attr-defined]  # our context rides on locust's Environment
    stopper.install()
    ctx.on_failing = lambda _info: stopper.event.set()  # end the wait; the drain and results follow
    ctx.on_issued = stopper.event.set  # --max-requests: all issued; the drain lets them finish
    runner = env.create_local_runner()
    tune_gc()
    started = time.time()
    progress = ProgressPrinter(
        lambda: ctx.recorder.total, lambda: ctx.in_flight, settings.duration_s, settings.progress_s
    )
    progress.start()
    ramp = None
    try:
        ramp = drive_load(runner, ctx.profile, settings, stopper, HostCpu())
        progress.stop()
        if not stopper.interrupted:
            drain_s = drain_timeout_for(ctx.profile)
            progress.draining(ctx.in_flight, drain_s)
            drain(ctx, drain_s)
        runner.stop()
        runner.quit()
    finally:
        stopper.stopped()
        progress.stop()
        ctx.close()
        reserve.release()  # run.json, the report and the summary have its room
    failure = ctx.write_failure or stopper.failure
    lost = ctx.log.lost
    return RunOutcome(
        aggregates=ctx.recorder.result(),
        interrupted_reason=stopper.reason,
        signal=stopper.reason,
        record_files=[ctx.log.path.name],
        records_written=ctx.log.count,
        started_epoch=started,
        ended_epoch=time.time(),
        stopped_early=ctx.failing,
        write_failure=failure.describe() if failure is not None else None,
        records_lost=lost,
        ramp=ramp,
    )
