"""Where a `loadtest ui` run's users run and its numbers come from: this process, or workers over a master."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import gevent
from locust.env import Environment

from loadtest.locust.context import RunContext
from loadtest.locust.master import MasterSession
from loadtest.locust.runtime import RunOutcome
from loadtest.locust.settings import RunSettings
from loadtest.metrics.recorder import RunAggregates
from loadtest.profile.schema import Profile
from loadtest.workload.builder import Workload

log = logging.getLogger("loadtest")


class LiveRun(Protocol):
    """One UI run while it runs: what the dashboard reads, and how it ends."""

    @property
    def profile(self) -> Profile: ...

    @property
    def workload(self) -> Workload: ...

    def aggregates(self) -> RunAggregates:
        """The run's figures so far (a master: as of the workers' last reports)."""
        ...

    def in_flight(self) -> int: ...

    def finish(self, drain: bool, timeout: float) -> None:
        """Stop issuing; with ``drain``, let requests in flight end (at most ``timeout`` s)."""
        ...

    def outcome(self, interrupted: str | None, started: float, ended: float) -> RunOutcome:
        """What the run hands to finalize, once its users are stopped."""
        ...


class RunSource(Protocol):
    """Starts each UI run: here (``LocalRuns``) or on the workers of a master (``WorkerRuns``)."""

    def begin(self, settings: RunSettings, environment: Environment) -> LiveRun:
        """The run of one start; RuntimeError (one line for the page) when it cannot start."""
        ...

    def workers(self) -> dict[str, Any] | None:
        """The workers for /llm/stats (None: users run in the UI's own process)."""
        ...

    def refusal(self) -> str | None:
        """Why a start cannot begin now (None when it can)."""
        ...


@dataclass
class LocalRun:
    """A run in this process: its RunContext (recorder, record log, clients)."""

    ctx: RunContext

    @property
    def profile(self) -> Profile:
        return self.ctx.profile

    @property
    def workload(self) -> Workload:
        return self.ctx.workload

    def aggregates(self) -> RunAggregates:
        return self.ctx.recorder.result()

    def in_flight(self) -> int:
        return self.ctx.in_flight

    def finish(self, drain: bool, timeout: float) -> None:
        self.ctx.stopping = True
        deadline = time.monotonic() + timeout
        while drain and self.ctx.in_flight > 0 and time.monotonic() < deadline:
            gevent.sleep(0.05)

    def outcome(self, interrupted: str | None, started: float, ended: float) -> RunOutcome:
        self.ctx.close()
        return RunOutcome(
            aggregates=self.ctx.recorder.result(),
            interrupted_reason=interrupted,
            record_files=[self.ctx.log.path.name],
            records_written=self.ctx.log.count,
            started_epoch=started,
            ended_epoch=ended,
            # a full disk: the UI's run says so and counts what it could not write (docs/durability.md)
            write_failure=self.ctx.write_failure.describe() if self.ctx.write_failure is not None else None,
            records_lost=self.ctx.log.lost,
        )


class LocalRuns:
    """Every run's users in the UI's own process (Locust's local runner)."""

    def begin(self, settings: RunSettings, environment: Environment) -> LiveRun:
        ctx = RunContext(settings, 0, 1, "records.jsonl")
        ctx.env = environment
        environment.loadtest = ctx  # type: ignore[attr-defined]  # our context rides on locust's Environment
        return LocalRun(ctx)

    def workers(self) -> dict[str, Any] | None:
        return None

    def refusal(self) -> str | None:
        return None


class WorkerRun:
    """A run on the workers: the master session's merged aggregates, its finish and outcome."""

    def __init__(self, runs: WorkerRuns) -> None:
        self.runs = runs
        self.session = runs.session
        self.profile = self.session.profile
        self.workload = self.session.workload

    def aggregates(self) -> RunAggregates:
        return self.session.total

    def in_flight(self) -> int:
        return self.session.in_flight()

    def finish(self, drain: bool, timeout: float) -> None:
        self.session.finish_workers(drain, timeout)

    def outcome(self, interrupted: str | None, started: float, ended: float) -> RunOutcome:
        self.runs.stop_watch()
        out = self.session.outcome(started, self.runs.spawn_local, interrupted)
        out.started_epoch, out.ended_epoch = started, ended
        return out


class WorkerRuns:
    """Every run's users on ``n`` workers of this master (`loadtest worker` from anywhere, or ``--processes``
    local ones), which stay connected from run to run: each start hands them its settings."""

    def __init__(
        self,
        session: MasterSession,
        bind_host: str,
        port: int,
        wait_s: float,
        spawn_local: bool,
        logs: Path,
        log_prefix: str = "",
    ) -> None:
        self.session = session
        self.bind_host, self.port, self.wait_s = bind_host, port, wait_s
        self.spawn_local = spawn_local
        self._watch: gevent.Greenlet | None = None
        session.listen()
        if spawn_local:
            session.spawn_local(bind_host, port, logs, log_prefix)

    def begin(self, settings: RunSettings, environment: Environment) -> LiveRun:
        try:
            self.session.start_run(settings, self.wait_s, self.bind_host, self.port)
        except RuntimeError:
            self.session.abort_run()
            raise
        runner = environment.runner
        stopper = self.session.stopper

        def stop_when_told() -> None:  # every worker lost, the endpoint failing, --max-requests issued
            stopper.event.wait()
            log.warning("run %s: stopping (%s)", settings.run_id, self._why())
            if runner is not None:
                runner.stop()

        self._watch = gevent.spawn(stop_when_told)
        return WorkerRun(self)

    def _why(self) -> str:
        s = self.session
        if s.failing:
            return "the endpoint fails wholesale"
        if s.workers and all(w.lost for w in s.workers.values()):
            return "every worker is lost"
        return "every worker issued its share of --max-requests"

    def stop_watch(self) -> None:
        if self._watch is not None and self._watch is not gevent.getcurrent():  # not when it is the stopper
            self._watch.kill(block=False)
        self._watch = None

    def workers(self) -> dict[str, Any] | None:
        s = self.session
        waiting = {w.index for w in s.connected()}  # between runs: connected, waiting for a start
        listed = sorted(s.workers.values(), key=lambda w: w.index)

        def state(w: Any) -> str:
            if w.lost:
                return "lost"
            if s.live_run:
                return "running" if w.ready else "setting up"
            return "waiting" if w.index in waiting else "connecting"

        return {
            "expected": s.n,
            "connected": len(listed),
            "ready": sum(state(w) in ("running", "waiting") for w in listed),
            "local": self.spawn_local,
            "master": f"{self.bind_host}:{self.port}",
            "list": [
                {"index": w.index, "host": w.host, "pid": w.pid, "state": state(w), "lost": w.lost}
                for w in listed
            ],
        }

    def refusal(self) -> str | None:
        s = self.session
        ready = len(s.connected())
        if ready >= s.n:
            return None
        how = (
            "local worker processes are starting (or one ended: see its log)"
            if self.spawn_local
            else f"start `loadtest worker --master-host <this host> --master-port {self.port}` on the workers"
        )
        return f"{ready} of {s.n} workers connected and ready: a run starts once all {s.n} are ({how})"

    def close(self) -> None:
        """The UI stops: the workers are told to quit (the runner's quit), local ones ended by pid."""
        self.stop_watch()
        self.session.stop_local()
