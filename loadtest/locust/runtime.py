"""Drives a run on Locust's runners: one local process, or a master with worker processes on this host.

End of a run: stop issuing, let in-flight requests finish (drain, bounded), stop the users, and
collect every worker's final delta through an explicit request/reply, so the merged histograms are
exact. An interrupt (Ctrl-C, SIGTERM) skips the drain: in-flight requests are recorded as cancelled.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event
from locust.env import Environment
from locust.rpc import Message
from locust.runners import MasterRunner, Runner, WorkerRunner

from loadtest.gc_tuning import tune_gc
from loadtest.locust.context import RunContext
from loadtest.locust.settings import RunSettings, load_mode
from loadtest.locust.users import ClosedLoopUser, OpenLoopUser
from loadtest.metrics.recorder import RunAggregates
from loadtest.profile.schema import Profile

log = logging.getLogger("loadtest")

MSG_FINISH = "loadtest_finish"  # master → worker: {"drain": bool, "timeout": s}
MSG_FINAL = "loadtest_final"  # worker → master: {"index": i, "delta": wire, "records": n}
DRAIN_TIMEOUT_S = 60.0


@dataclass
class RunOutcome:
    """What the runtime hands back for run.json."""

    aggregates: RunAggregates
    interrupted_reason: str | None = None
    record_files: list[str] = field(default_factory=list)
    records_written: int = 0
    workers_lost: list[int] = field(default_factory=list)
    started_epoch: float = 0.0
    ended_epoch: float = 0.0


def user_class(profile: Profile) -> type:
    return OpenLoopUser if load_mode(profile) == "open" else ClosedLoopUser


def drive_load(runner: Runner, profile: Profile, settings: RunSettings, stopper: _Stopper) -> None:
    """Start the users and keep the load the profile asks for until the duration ends or a signal comes.

    Open loop: one dispatcher per worker process follows the schedule. Closed loop: ``concurrency``
    users, or a stage sequence that changes the user count (a ramp spreads the change over the stage).
    """
    load = profile.load
    if load_mode(profile) == "open":
        runner.start(settings.processes, spawn_rate=max(100.0, settings.processes * 10.0))
        stopper.event.wait(timeout=settings.duration_s)
        return
    if not load.stages:
        n = int(load.concurrency or 1)
        runner.start(n, spawn_rate=max(100.0, n * 10.0))
        stopper.event.wait(timeout=settings.duration_s)
        return
    deadline = time.monotonic() + settings.duration_s
    previous = 0
    for stage in load.stages:
        n = int(stage.concurrency or 0)
        rate = max(0.1, abs(n - previous) / stage.duration_s) if stage.ramp else max(100.0, n * 10.0)
        runner.start(n, spawn_rate=rate)
        previous = n
        wait = min(stage.duration_s, deadline - time.monotonic())
        if wait <= 0 or stopper.event.wait(timeout=wait):
            return


class _Stopper:
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


def _drain(ctx: RunContext, timeout: float) -> None:
    ctx.stopping = True
    deadline = time.monotonic() + timeout
    while ctx.in_flight > 0 and time.monotonic() < deadline:
        gevent.sleep(0.05)


def run_local(settings: RunSettings) -> RunOutcome:
    """Everything in this process."""
    ctx = RunContext(settings, 0, 1, "records.jsonl")
    env = Environment(user_classes=[user_class(ctx.profile)], host=settings.host)
    ctx.env = env
    env.loadtest = ctx  # type: ignore[attr-defined]
    stopper = _Stopper()
    stopper.install()
    runner = env.create_local_runner()
    tune_gc()
    started = time.time()
    drive_load(runner, ctx.profile, settings, stopper)
    if stopper.reason is None:
        _drain(ctx, DRAIN_TIMEOUT_S)
    runner.stop()
    runner.quit()
    ctx.close()
    return RunOutcome(
        aggregates=ctx.recorder.result(),
        interrupted_reason=stopper.reason,
        record_files=[ctx.log.path.name],
        records_written=ctx.log.count,
        started_epoch=started,
        ended_epoch=time.time(),
    )


def run_master(settings: RunSettings, master_port: int) -> RunOutcome:
    """A Locust master in this process and ``settings.processes`` worker processes on this host."""
    profile, _ = settings.profile()
    env = Environment(user_classes=[user_class(profile)], host=settings.host)
    runner: MasterRunner = env.create_master_runner("127.0.0.1", master_port)
    total = RunAggregates()
    finals: dict[int, dict] = {}

    def on_worker_report(client_id: str, data: dict) -> None:
        delta = data.get("loadtest")
        if delta:
            total.merge_wire(delta)

    def on_final(environment: Environment, msg: Message, **_kw: Any) -> None:
        data = msg.data
        total.merge_wire(data["delta"])
        finals[int(data["index"])] = data

    env.events.worker_report.add_listener(on_worker_report)
    runner.register_message(MSG_FINAL, on_final)
    stopper = _Stopper()
    stopper.install()

    out = Path(settings.out_dir)
    settings_path = out / ".settings.json"
    settings.write(settings_path)
    procs = [
        _spawn_worker(settings_path, master_port, out / f"worker-{i}.log") for i in range(settings.processes)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(runner.clients.ready) < settings.processes:
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline or stopper.reason:
                raise RuntimeError(
                    f"only {len(runner.clients.ready)} of {settings.processes} worker processes connected"
                    f" (see {out}/worker-*.log)"
                )
            gevent.sleep(0.1)
        started = time.time()
        drive_load(runner, profile, settings, stopper)
        drain = stopper.reason is None
        runner.send_message(MSG_FINISH, {"drain": drain, "timeout": DRAIN_TIMEOUT_S})
        deadline = time.monotonic() + (DRAIN_TIMEOUT_S if drain else 0) + 30
        while len(finals) < settings.processes and time.monotonic() < deadline:
            alive = sum(1 for p in procs if p.poll() is None)
            if len(finals) >= alive and alive < settings.processes:
                break  # a worker died: it will never answer
            gevent.sleep(0.05)
        lost = sorted(set(range(settings.processes)) - set(finals))
        runner.quit()
    finally:
        _stop_processes(procs)
    reason = stopper.reason
    if lost and reason is None:
        reason = f"worker(s) {lost} did not report their final results"
    files = sorted(p.name for p in out.glob("records*.jsonl"))
    return RunOutcome(
        aggregates=total,
        interrupted_reason=reason,
        record_files=files,
        records_written=sum(int(f["records"]) for f in finals.values()),
        workers_lost=lost,
        started_epoch=started,
        ended_epoch=time.time(),
    )


def _spawn_worker(settings_path: Path, master_port: int, log_path: Path) -> subprocess.Popen:
    logf = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    cmd = [
        sys.executable,
        "-m",
        "loadtest.locust.worker",
        "--settings",
        str(settings_path),
        "--master-port",
        str(master_port),
    ]
    # A new session: a terminal Ctrl-C reaches the master only, which then stops the workers in order.
    return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)


def _stop_processes(procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 10
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        gevent.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


def worker_main(settings: RunSettings, master_port: int) -> int:
    """Entry of a worker process: connect, run users on command, answer the final-results request."""
    profile, _ = settings.profile()
    env = Environment(user_classes=[user_class(profile)], host=settings.host)
    runner: WorkerRunner = env.create_worker_runner("127.0.0.1", master_port)
    ctx = RunContext(
        settings, runner.worker_index, settings.processes, f"records-w{runner.worker_index}.jsonl"
    )
    ctx.env = env
    env.loadtest = ctx  # type: ignore[attr-defined]

    def on_report(client_id: str, data: dict) -> None:
        data["loadtest"] = ctx.recorder.take_delta()

    def finish(drain: bool, timeout: float) -> None:
        if drain:
            _drain(ctx, timeout)
        runner.stop()
        ctx.close()
        runner.send_message(
            MSG_FINAL,
            {"index": ctx.worker_index, "delta": ctx.recorder.take_delta(), "records": ctx.log.count},
        )

    def on_finish(environment: Environment, msg: Message, **_kw: Any) -> None:
        gevent.spawn(finish, bool(msg.data["drain"]), float(msg.data["timeout"]))

    def watch_master_process(parent: int) -> None:
        while os.getppid() == parent:
            gevent.sleep(1.0)
        log.error("the master process is gone; worker %d stops", ctx.worker_index)
        runner.stop()
        ctx.close()
        runner.greenlet.kill()

    env.events.report_to_master.add_listener(on_report)
    runner.register_message(MSG_FINISH, on_finish)
    gevent.spawn(watch_master_process, os.getppid())
    tune_gc()
    runner.greenlet.join()
    return 0
