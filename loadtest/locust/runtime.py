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
cancelled. A worker that dies is noticed (process exit, or no heartbeat for ``master.LOST_AFTER_S``);
what it reported is kept and the run names it.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
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
from loadtest.locust.progress import ProgressPrinter
from loadtest.locust.prometheus import LiveMetrics, LiveView
from loadtest.locust.settings import RunSettings
from loadtest.metrics.recorder import RunAggregates
from loadtest.metrics.run_length import drain_timeout_for
from loadtest.profile.schema import Profile
from loadtest.results.capture import CAPTURE_FILE

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


def send(runner: Runner, msg: WireMessage, client_id: str | None = None) -> None:
    """Send a typed message (to one worker when ``client_id`` is given; a worker sends to its master)."""
    runner.send_message(msg.TYPE, to_data(msg), client_id)


def user_class(profile: Profile) -> type:
    return executor_for(profile.load).user_class


def drive_load(runner: Runner, profile: Profile, settings: RunSettings, stopper: Stopper) -> None:
    """Start the users and keep the load the profile asks for until the duration ends or a signal comes
    (the profile's executor, locust/executors.py)."""
    executor_for(profile.load).drive(runner, settings.duration_s, settings.processes, stopper.event)


class Stopper:
    """Ends the wait early on SIGINT/SIGTERM and remembers which signal did it."""

    def __init__(self) -> None:
        self.event = Event()
        self.reason: str | None = None

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            gevent.signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: int) -> None:
        if self.reason is None:
            self.reason = signal.Signals(sig).name
            log.warning("%s received: stopping the run, keeping every finished request", self.reason)
        self.event.set()


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
    ctx = RunContext(settings, 0, 1, "records.jsonl")
    if live is not None:
        live.attach(lambda: LiveView(ctx.recorder.result(), ctx.in_flight))
    ctx.open_capture(Path(settings.out_dir), CAPTURE_FILE)
    env = Environment(user_classes=[user_class(ctx.profile)], host=settings.host)
    ctx.env = env
    env.loadtest = ctx  # type: ignore[attr-defined]  # our context rides on locust's Environment
    stopper = Stopper()
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
    drive_load(runner, ctx.profile, settings, stopper)
    progress.stop()
    if stopper.reason is None:
        drain_s = drain_timeout_for(ctx.profile)
        progress.draining(ctx.in_flight, drain_s)
        drain(ctx, drain_s)
    runner.stop()
    runner.quit()
    ctx.close()
    return RunOutcome(
        aggregates=ctx.recorder.result(),
        interrupted_reason=stopper.reason,
        signal=stopper.reason,
        record_files=[ctx.log.path.name],
        records_written=ctx.log.count,
        started_epoch=started,
        ended_epoch=time.time(),
        stopped_early=ctx.failing,
    )
