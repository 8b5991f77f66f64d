"""A worker process's part of a distributed run: get the settings from the master, run users on command,
ship each report's histogram delta with the record lines finished since the last one, and the final
results when told to finish (or when the master, or this process's signal, ends its part early). A
`loadtest ui` master says so on connect (``Standby``): the worker then serves run after run, a new
context from each start's settings."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import gevent
from locust.env import Environment
from locust.rpc import Message
from locust.runners import WorkerRunner

from loadtest.client.secrets import KeySourceError, load_api_key
from loadtest.contracts.messages import (
    Failing,
    Final,
    Finish,
    Hello,
    Issued,
    MessageError,
    Ready,
    Report,
    Settings,
    Standby,
    from_data,
    to_data,
)
from loadtest.gc_tuning import tune_gc
from loadtest.locust.context import RunContext
from loadtest.locust.runtime import Stopper, drain, send
from loadtest.locust.settings import RunSettings
from loadtest.locust.shipping import ShippedLog
from loadtest.locust.users import ClosedLoopUser, OpenLoopUser
from loadtest.results.capture import worker_capture_file

log = logging.getLogger("loadtest")

MASTER_GONE_AFTER_S = 15.0  # a worker stops when the master has not answered a heartbeat for this long


def _local_log_path(out: Path, index: int) -> Path:
    """``<out>/records-w<i>.jsonl``; a log left there by an earlier run is moved aside, never appended to."""
    path = out / f"records-w{index}.jsonl"
    if path.exists() and path.stat().st_size:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
        path.rename(out / f"records-w{index}.{stamp}.jsonl")
    return path


def _setup_worker(
    data: Settings, out: str | None, keep_local: bool, copy_in_run_dir: bool = False, per_run: bool = False
) -> tuple[RunContext, Path | None]:
    """The worker's RunContext from the master's ``loadtest_settings`` message, and the folder of its own
    record copy when that folder is a temporary one (removed after a clean finish).

    ``out``: where a ``loadtest worker`` keeps its own copy of its records (and captures); without it, a
    temporary folder that the worker removes once its part ended normally (the master has every line)
    and keeps, and names, when it left early. The profile copy the run's context is built from lives in
    a scratch folder removed as soon as the context is built: nothing is left in the working directory.
    ``copy_in_run_dir`` (a ``--processes`` worker, on the master's host): its records also go, as they
    finish, to ``worker-<i>.records.jsonl`` in the run folder, so that a worker killed between two
    reports loses nothing it finished (the master takes them from there; see _recover_unshipped).
    ``per_run`` (a worker of a `loadtest ui` master, serving many runs): the copy goes in ``out/<run id>/``.
    """
    index = data.index
    settings = RunSettings.from_json(data.settings)
    try:
        load_api_key(settings.api_key_env, settings.api_key_file)
    except KeySourceError as e:
        raise RuntimeError(str(e)) from e
    run_dir_copy = Path(settings.out_dir) / f"worker-{index}.records.jsonl" if copy_in_run_dir else None
    temporary = None
    local = None
    if keep_local:
        if out:
            local = Path(out) / settings.run_id if per_run else Path(out)
        else:
            local = temporary = Path(tempfile.mkdtemp(prefix=f"loadtest-worker-{index}-"))
        local.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="loadtest-worker-profile-"))
    profile_file = scratch / f"{data.profile_name}.yaml"
    profile_file.write_text(data.profile)  # JSON is valid YAML
    settings = replace(settings, profile_ref=str(profile_file), out_dir=str(local or scratch))
    try:
        # No record log of its own: this process ships lines instead (the local copy is optional).
        ctx = RunContext(settings, index, settings.processes, None, reports=True)
    finally:
        profile_file.unlink()
        scratch.rmdir()
    capture_dir = local if local is not None else (run_dir_copy.parent if run_dir_copy is not None else None)
    if capture_dir is not None:  # its own file, written as requests end: a killed worker loses none
        ctx.open_capture(capture_dir, worker_capture_file(index))
    ctx.log = ShippedLog(_local_log_path(local, index) if local is not None else run_dir_copy)
    got = ctx.workload.fingerprint()
    if got != data.fingerprint:
        ctx.log.close()
        if temporary is not None:  # nothing ran: nothing to keep
            shutil.rmtree(temporary, ignore_errors=True)
        raise RuntimeError(
            "this host builds different traffic from the same profile and seed (workload fingerprint "
            f"{got[:12]} ≠ the master's {data.fingerprint[:12]}): same loadtest version and tokenizer files?"
        )
    return ctx, temporary


def _shipped(ctx: RunContext) -> ShippedLog:
    """A worker's record log: the lines it ships."""
    if not isinstance(ctx.log, ShippedLog):
        raise TypeError("a worker's run context ships its lines (ShippedLog)")
    return ctx.log


class WorkerSession:
    """One worker's run: its Locust worker runner, the run's context once the settings came, and the
    message handlers that drive it (settings, reports, finish, leaving early)."""

    def __init__(
        self,
        runner: WorkerRunner,
        env: Environment,
        master: str,
        out: str | None,
        keep_local: bool,
        parent_pid: int | None,
        copy_in_run_dir: bool,
        master_wait_s: float,
    ) -> None:
        self.runner = runner
        self.env = env
        self.master = master
        self.out = out
        self.keep_local = keep_local
        self.parent_pid = parent_pid
        self.copy_in_run_dir = copy_in_run_dir
        self.master_wait_s = master_wait_s
        self.ctx: RunContext | None = None
        self.temporary: Path | None = None  # the own record copy's folder when no --out named one
        self.left: str | None = None  # why this worker left the run early, if it did
        self.code = 0
        self.finishing = False
        self.standby = False  # a `loadtest ui` master: run after run, each start's settings when it comes
        self.started = time.monotonic()
        self.heard = time.monotonic()

    # ---- messages from the master ----
    def on_standby(self, environment: Environment, msg: Message, **_kw: Any) -> None:
        from_data(Standby, msg.data)
        self.standby = True
        if self.parent_pid is None:
            print(f"worker: joined the web UI at {self.master}; each start there is a run", flush=True)

    def on_settings(self, environment: Environment, msg: Message, **_kw: Any) -> None:
        reply = Ready(index=-1, host=socket.gethostname(), pid=os.getpid())
        if self.ctx is not None:  # the previous run's context (standby: a new start)
            self.ctx.close()
            self.ctx = None
        try:
            data = from_data(Settings, msg.data)
            reply.index = data.index
            ctx, self.temporary = _setup_worker(
                data, self.out, self.keep_local, self.copy_in_run_dir, per_run=self.standby
            )
        except Exception as e:  # noqa: BLE001 - reported to the master as one line
            reply.error = (
                str(e) if isinstance(e, (RuntimeError, MessageError)) else f"{type(e).__name__}: {e}"
            )
            log.error("cannot set up the run: %s", reply.error)
            send(self.runner, reply)
            if not self.standby:  # a UI's worker stays for the next start
                self.code = 1
                gevent.spawn_later(0.5, self.runner.quit)
            return
        self.finishing = False
        ctx.env = self.env
        self.env.loadtest = ctx  # type: ignore[attr-defined]  # our context rides on locust's Environment
        # The endpoint fails wholesale here: the master ends the run for every worker.
        ctx.on_failing = lambda info: send(self.runner, Failing(index=ctx.worker_index, info=info))
        ctx.on_issued = lambda: send(self.runner, Issued(index=ctx.worker_index))
        self.ctx = ctx
        reply.records = str(ctx.log.path.resolve()) if ctx.log.path != Path(os.devnull) else None
        send(self.runner, reply)
        if self.keep_local:
            print(f"worker {reply.index}: run {ctx.settings.run_id}, records in {ctx.log.path}", flush=True)
        tune_gc()

    def on_report(self, client_id: str, data: dict) -> None:
        ctx = self.ctx
        if ctx is not None:
            report = Report(
                index=ctx.worker_index,
                in_flight=ctx.in_flight,
                pending=ctx.pending(),  # the master records them should this worker be lost
                delta=ctx.recorder.take_delta(),  # the delta and the lines: the same moment
                lines=_shipped(ctx).take(),
            )
            data.update(to_data(report))

    def on_finish(self, environment: Environment, msg: Message, **_kw: Any) -> None:
        order = from_data(Finish, msg.data)
        gevent.spawn(self.finish, order.drain, order.timeout)

    # ---- the end of this worker's part ----
    def finish(self, drain_first: bool, timeout: float, left: str | None = None) -> None:
        """Stop the users (after the drain, when told), then send the final delta and lines once."""
        ctx = self.ctx
        if ctx is None or self.finishing:
            return
        self.finishing = True
        if drain_first:
            drain(ctx, timeout)
        ctx.stopping = True
        self.runner.stop()
        ctx.close()
        send(
            self.runner,
            Final(
                index=ctx.worker_index,
                delta=ctx.recorder.take_delta(),
                lines=_shipped(ctx).take(),
                count=ctx.log.count,
                left=left,
            ),
        )
        if self.standby and left is None:  # this run is over: the next start brings new settings
            self.ctx = None
            self._clean_up()
            self.temporary = None

    def leave(self, why: str) -> None:
        """Leave the run early: send what this worker has, then quit."""
        self.left = why
        self.finish(False, 0.0, why)
        gevent.sleep(0.5)  # let the final message go out
        if self.ctx is not None:
            self.ctx.close()
        self.runner.quit()

    def leave_on_signal(self, stopper: Stopper) -> None:
        """On SIGINT / SIGTERM (``stopper``: noted even while the process computes without yielding, and a
        greenlet that does not yield is ended): leave the run, sending what this worker has."""
        stopper.event.wait()
        name = stopper.reason or "a signal"
        log.warning("%s received: worker leaves the run, sending what it has", name)
        try:
            self.leave(name)
        finally:
            stopper.stopped()

    def watch_master(self) -> None:
        """Leave when the local master's process is gone, no settings came in time, or heartbeats stop."""
        while True:
            gevent.sleep(1.0)
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                why = "the master process is gone"
            elif (
                self.ctx is None and not self.standby and time.monotonic() - self.started > self.master_wait_s
            ):
                why = f"no run settings from the master at {self.master} within {self.master_wait_s:g}s"
                self.code = 1
            elif time.monotonic() - self.heard > MASTER_GONE_AFTER_S:
                why = f"no heartbeat from the master for {MASTER_GONE_AFTER_S:g}s"
            else:
                continue
            log.error("%s; worker stops", why)
            self.leave(why)
            return

    def _heartbeat(self, **_kw: Any) -> None:
        self.heard = time.monotonic()

    def run(self) -> int:
        """Register the handlers, say hello (the settings come back in reply), and serve until told to quit."""
        self.env.events.heartbeat_received.add_listener(self._heartbeat)
        self.env.events.report_to_master.add_listener(self.on_report)
        self.runner.register_message(Standby.TYPE, self.on_standby)
        self.runner.register_message(Settings.TYPE, self.on_settings)
        self.runner.register_message(Finish.TYPE, self.on_finish)
        if self.parent_pid is None:
            stopper = Stopper()
            stopper.install()
            gevent.spawn(self.leave_on_signal, stopper)
        gevent.spawn(self.watch_master)
        send(self.runner, Hello())
        self.runner.greenlet.join()
        if self.ctx is not None:
            self.ctx.close()
        self._clean_up()
        return self.code

    def _clean_up(self) -> None:
        """A temporary record copy: removed after a clean finish (the master holds every line), kept and
        named when this worker left early (the lines it could not ship are there). Captured samples
        (capture-w<i>.jsonl, which only the worker holds) keep the folder, named."""
        folder = self.temporary
        if folder is None or not folder.exists():
            return
        if self.left is not None or self.code != 0:
            print(f"worker: left the run early; its own copy of its records stays in {folder}", flush=True)
            return
        for path in folder.glob("records-w*.jsonl"):
            path.unlink()
        if any(p.stat().st_size for p in folder.iterdir() if p.is_file()):
            print(f"worker: its captured samples stay in {folder}", flush=True)
            return
        shutil.rmtree(folder, ignore_errors=True)


def worker_main(
    master_host: str = "127.0.0.1",
    master_port: int = 5557,
    out: str | None = None,
    keep_local: bool = True,
    parent_pid: int | None = None,
    copy_in_run_dir: bool = False,
    master_wait_s: float = 120.0,
) -> int:
    """A worker: connect, get the run's settings from the master, run users on command, ship results.

    ``master_wait_s``: how long to wait for a master to answer (Locust's connect blocks until one does)
    and then for its settings; past it the worker says so and exits 1.

    ``out``: the folder for this worker's own copy of its records (default: a temporary folder, removed
    after a clean finish, kept when the worker left early); ``keep_local=False`` keeps none (local
    workers: the master writes the same lines next to it).
    ``parent_pid``: stop when that process (the local master) is gone. Signals end this worker's part
    early: it sends what it has and leaves.
    """
    env = Environment(user_classes=[ClosedLoopUser, OpenLoopUser])
    if parent_pid is None:
        print(
            f"worker: waiting for the master at {master_host}:{master_port} (up to {master_wait_s:g}s)",
            flush=True,
        )
    waited = time.monotonic()
    try:
        with gevent.Timeout(master_wait_s):
            runner: WorkerRunner = env.create_worker_runner(master_host, master_port)
    except (ConnectionError, gevent.Timeout):
        log.error(
            "no master answered at %s:%d within %gs; worker stops", master_host, master_port, master_wait_s
        )
        return 1
    session = WorkerSession(
        runner,
        env,
        f"{master_host}:{master_port}",
        out,
        keep_local,
        parent_pid,
        copy_in_run_dir,
        master_wait_s,
    )
    session.started = waited
    return session.run()
