"""The master's part of a distributed run: hand each worker its settings, merge the histogram deltas and
record lines they report, notice lost workers (recovering what they finished where it can), and collect
every worker's final results at the end."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import msgspec
import yaml
from locust.env import Environment
from locust.rpc import Message
from locust.runners import STATE_MISSING, MasterRunner

from loadtest.contracts.messages import (
    Failing,
    Final,
    Finish,
    Hello,
    InFlight,
    Issued,
    MessageError,
    Ready,
    Settings,
    Standby,
    from_data,
    report_from,
)
from loadtest.contracts.record_line import LINE_ENCODER, RecordLine
from loadtest.locust.compat import check_locust_version, users_dispatcher
from loadtest.locust.host_cpu import HostCpu
from loadtest.locust.progress import ProgressPrinter
from loadtest.locust.prometheus import LiveMetrics, LiveView
from loadtest.locust.ramp import Ramp
from loadtest.locust.runtime import RunOutcome, Stopper, drive_load, send, user_class
from loadtest.locust.settings import RunSettings
from loadtest.locust.shipping import RecordSink
from loadtest.metrics.judged import record_from_line
from loadtest.metrics.recorder import Recorder, RunAggregates
from loadtest.metrics.run_length import drain_timeout_for
from loadtest.profile.schema import Profile
from loadtest.results.durable import Reserve, WriteFailure
from loadtest.results.record_log import read_lines
from loadtest.workload.builder import Workload

log = logging.getLogger("loadtest")

LOST_AFTER_S = 5.0  # no heartbeat (sent every second) for this long: the worker is gone
# After a signal or a failed write: how long the workers have to send their final results (they stop
# without a drain); one that has not by then is lost, its requests in flight recorded as such.
FINALS_AFTER_STOP_S = 5.0


@dataclass
class _Worker:
    """What the master knows about one connected worker."""

    index: int
    client_id: str
    host: str = "?"
    pid: int = 0
    ready: bool = False
    error: str | None = None
    last_seen: float = field(default_factory=time.monotonic)
    lost: str | None = None
    final: Final | None = None
    records: str | None = None  # the worker's own copy of its records (path on its host), if it keeps one
    in_flight: int = 0  # requests in flight at its last report: what a lost worker takes with it
    pending: list[InFlight] = field(default_factory=list)  # those requests, when the worker reports them

    def name(self) -> str:
        return f"worker {self.index} ({self.host} pid {self.pid})"


def settings_payload(settings: RunSettings, profile: Profile, path: Path, workload: Workload) -> Settings:
    """What a worker needs to run (its index set per worker): settings, the content of the profile at
    ``path`` (its files' paths absolute), the fingerprint of the master's ``workload``."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    _absolute_files(data, profile)
    return Settings(
        index=0,
        settings=settings.to_json(),
        profile=json.dumps(data),
        profile_name=path.stem,
        fingerprint=workload.fingerprint(),
    )


def free_port() -> int:
    """A free TCP port on loopback: the master's, for worker processes on this host."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def master_runner(env: Environment, bind_host: str, port: int) -> MasterRunner:
    """Locust's master runner on ``env``, listening for workers; RuntimeError when the port is taken."""
    try:
        return env.create_master_runner(bind_host, port)
    except SystemExit as e:  # Locust exits when the port is taken
        raise RuntimeError(f"cannot listen for workers on {bind_host}:{port} (port in use?)") from e


def _absolute_files(data: dict[str, Any], profile: Profile) -> None:
    """Every file the profile names (trace, raw bodies, datasets, a tokenizer folder) in ``data`` as the
    master resolved it: a worker's copy of the profile lies in another folder, in the scenario list or
    the flat form."""
    load = data.get("load")
    if profile.load.trace is not None and isinstance(load, dict) and isinstance(load.get("trace"), dict):
        load["trace"]["path"] = profile.load.trace.path
    if isinstance(data.get("tokenizer"), str):
        data["tokenizer"] = profile.tokenizer  # a bundled name, or the resolved file or folder
    listed = data.get("scenarios")
    raw_scenarios = listed if isinstance(listed, list) else [data]
    for raw, sc in zip(raw_scenarios, profile.scenarios, strict=False):
        if not isinstance(raw, dict):
            continue
        if sc.dataset is not None and isinstance(raw.get("dataset"), dict):
            raw["dataset"]["path"] = sc.dataset.path
        if sc.raw is not None and isinstance(raw.get("raw"), dict):
            raw["raw"]["file"] = sc.raw.file


class MasterSession:
    """One master's run: the Locust master runner, what it knows of each worker, the merged results, and
    the message handlers that keep them.

    ``serve_many`` (a `loadtest ui` master): the workers stay for run after run. A worker takes the
    lowest free index of ``n``, is told on Hello to wait (``Standby``), and gets each run's settings
    from ``start_run``; ``finish_workers`` and ``outcome`` end each run as they end a headless one.
    """

    def __init__(
        self,
        settings: RunSettings,
        runner: MasterRunner,
        env: Environment,
        n: int,
        live: LiveMetrics | None = None,
        serve_many: bool = False,
    ) -> None:
        self.runner = runner
        self.env = env
        self.n = n
        self.serve_many = serve_many
        self.live_run = False  # serve_many: a run is between start_run and outcome
        self.workers: dict[int, _Worker] = {}
        self.by_client: dict[str, _Worker] = {}
        self.procs: dict[int, subprocess.Popen] = {}  # pid → local worker process
        self.watcher: gevent.Greenlet | None = None
        self.ramp: Ramp | None = None  # the closed loop's start, once drive_load has started every stream
        self.reserve: Reserve | None = None  # room for run.json on a disk the records fill
        self.begin(settings)
        if live is not None:  # the merged figures as of the workers' last reports
            live.attach(lambda: LiveView(self.total, self.in_flight()))

    def begin(self, settings: RunSettings) -> None:
        """A run's own state: its settings, workload and payload, merged aggregates, record sink, stop signal."""
        self.settings = settings
        self.profile, path = settings.profile()
        self.workload = Workload(
            self.profile, settings.seed, schedule_seed=settings.schedule_seed, model_seed=settings.model_seed
        )
        self.payload = settings_payload(settings, self.profile, path, self.workload)
        self.total = RunAggregates()
        self.out = Path(settings.out_dir)
        self.release_reserve()  # serve_many: the last run's, should it still be there
        self.reserve = Reserve(self.out)
        self.sink = RecordSink(self.out, self._write_failed)
        self.failing: list[dict[str, Any]] = []  # the first worker's word that the endpoint fails wholesale
        self.issued: set[int] = set()  # workers that issued their share of --max-requests
        self.stopper = Stopper()
        for w in self.workers.values():  # serve_many: what the last run knew of each worker goes
            w.ready, w.error, w.final, w.in_flight, w.records, w.pending = False, None, None, 0, None, []

    def _write_failed(self, failure: WriteFailure) -> None:
        """The run folder cannot take the records: said once, the run stops as on Ctrl-C."""
        log.error("%s: stopping the run, counting every finished request it cannot write", failure.describe())
        self.release_reserve()
        self.stopper.fail(failure)

    def release_reserve(self) -> None:
        """The run folder's space reserve goes: run.json, the report and the summary have its room."""
        if self.reserve is not None:
            self.reserve.release()
            self.reserve = None

    def in_flight(self) -> int:
        """Requests in flight at the workers' last reports (workers still in the run)."""
        return sum(w.in_flight for w in self.workers.values() if not w.lost and w.final is None)

    # ---- what the workers say ----
    def on_connect(self, client_id: str, **_kw: Any) -> None:
        if client_id in self.by_client:
            return  # a repeated client_ready (after a run, or a reconnect): it keeps its index
        if self.serve_many:  # the lowest free index: a worker that replaces a lost one takes its place
            free = [i for i in range(self.n) if i not in self.workers]
            index = free[0] if free and not self.live_run else self.n
            why = "a run is in progress: start it again after the run" if free else f"{self.n} are expected"
        else:
            index = self.runner.get_worker_index(client_id)
            why = f"{self.n} are expected"
        if index >= self.n:
            log.warning("worker %s connected but %s: sending it away", client_id, why)
            self.runner.send_message("quit", None, client_id)
            return
        self.by_client[client_id] = self.workers[index] = _Worker(index, client_id)

    def on_hello(self, environment: Environment, msg: Message, **_kw: Any) -> None:
        from_data(Hello, msg.data)
        w = self.by_client.get(msg.node_id)
        if w is not None:
            w.last_seen = time.monotonic()
            if self.serve_many:  # the settings come with each start
                send(self.runner, Standby(), msg.node_id)
            else:
                send(self.runner, msgspec.structs.replace(self.payload, index=w.index), msg.node_id)

    def seen(self, client_id: str, **_kw: Any) -> None:
        w = self.by_client.get(client_id)
        if w is not None:
            w.last_seen = time.monotonic()

    def on_worker_report(self, client_id: str, data: dict) -> None:
        self.seen(client_id)
        report = report_from(data)
        if report is None or (self.serve_many and not self.live_run):  # no run (yet, or any more)
            return
        if (w := self.by_client.get(client_id)) is not None:
            w.in_flight, w.pending = report.in_flight, report.pending
        if report.delta:
            self.total.merge_wire(report.delta)
        self.sink.add(report.index, report.lines)

    def on_ready(self, environment: Environment, msg: Message, **_kw: Any) -> None:
        w = self.by_client.get(msg.node_id)
        if w is None:
            return
        try:
            ready = from_data(Ready, msg.data)
        except MessageError as e:  # another loadtest version: the run stops with this line
            w.error = str(e)
            return
        w.host, w.pid, w.error, w.records = ready.host, ready.pid, ready.error, ready.records
        w.ready = w.error is None

    def on_final(self, environment: Environment, msg: Message, **_kw: Any) -> None:
        final = from_data(Final, msg.data)
        if self.serve_many and not self.live_run:  # a start that did not begin: its workers let it go
            return
        self.total.merge_wire(final.delta)
        self.sink.add(final.index, final.lines)
        w = self.workers.get(final.index)
        if w is not None:
            w.final = final
            if final.left:
                _forget(self.runner, w.client_id)

    def on_issued(self, environment: Environment, msg: Message, **_kw: Any) -> None:
        """--max-requests: once every worker has issued its share, the load ends (the drain follows)."""
        self.issued.add(from_data(Issued, msg.data).index)
        if len(self.issued) >= self.n:
            self.stopper.event.set()

    def on_failing(self, environment: Environment, msg: Message, **_kw: Any) -> None:
        if not self.failing:
            self.failing.append(dict(from_data(Failing, msg.data).info))
            self.stopper.event.set()  # every worker drains and sends its final results as at the end of a run

    def listen(self) -> None:
        self.env.events.worker_connect.add_listener(self.on_connect)
        self.env.events.heartbeat_sent.add_listener(self.seen)
        self.env.events.worker_report.add_listener(self.on_worker_report)
        self.runner.register_message(Hello.TYPE, self.on_hello)
        self.runner.register_message(Ready.TYPE, self.on_ready)
        self.runner.register_message(Final.TYPE, self.on_final)
        self.runner.register_message(Failing.TYPE, self.on_failing)
        self.runner.register_message(Issued.TYPE, self.on_issued)

    # ---- the run ----
    def run(self, spawn_local: bool, bind_host: str, master_port: int, wait_s: float) -> RunOutcome:
        """Start (or wait for) the workers, drive the load, collect the finals, account for lost workers."""
        settings, profile, runner, workers, sink, total = (
            self.settings,
            self.profile,
            self.runner,
            self.workers,
            self.sink,
            self.total,
        )
        stopper, procs, out, n = self.stopper, self.procs, self.out, self.n
        self.listen()
        stopper.install()
        if spawn_local:
            self.spawn_local(bind_host, master_port, out)
        started = time.time()
        try:
            _wait_for_workers(runner, workers, n, procs, stopper, wait_s, out, bind_host, master_port)
            if stopper.reason:
                runner.quit()
                stopper.stopped()
                self.release_reserve()
                return RunOutcome(
                    aggregates=total,
                    interrupted_reason=f"{stopper.reason} while the workers were starting: no request was sent",
                    signal=stopper.reason,
                    record_files=sink.files,
                    started_epoch=started,
                    ended_epoch=time.time(),
                )
            self.watcher = gevent.spawn(_watch_workers, runner, workers, procs, stopper)
            started = time.time()
            # The workers' figures and requests in flight as of their last reports (every 3 s).
            progress = ProgressPrinter(
                lambda: total.all, self.in_flight, settings.duration_s, settings.progress_s
            )
            progress.start()
            host_cpu = gevent.spawn(_sample_host_cpu, total, list(procs)) if procs else None
            self.ramp = drive_load(runner, profile, settings, stopper, HostCpu(list(procs)))
            progress.stop()
            if host_cpu is not None:
                host_cpu.kill()
            drain = not stopper.interrupted
            drain_s = drain_timeout_for(profile)
            if drain:
                progress.draining(self.in_flight(), drain_s)
            self.finish_workers(drain, drain_s)
            runner.quit()
        finally:
            stopper.stopped()
            if self.watcher is not None:
                self.watcher.kill()
            # After a stop, the finals are in or their workers lost: a worker still busy is not waited for.
            _stop_processes(list(procs.values()), 2.0 if stopper.interrupted else 10.0)
            sink.close()
            self.release_reserve()
        return self.outcome(started, spawn_local)

    def spawn_local(self, bind_host: str, master_port: int, logs: Path, prefix: str = "") -> None:
        """``n`` worker processes on this host (``--processes``), their logs ``<prefix>worker-<i>.log`` in
        ``logs``."""
        for i in range(self.n):
            p = _spawn_worker(bind_host, master_port, logs / f"{prefix}worker-{i}.log")
            self.procs[p.pid] = p

    def stop_local(self) -> None:
        """The local worker processes: given time to leave after the master's quit, then ended by pid."""
        _stop_processes(list(self.procs.values()))

    def connected(self) -> list[_Worker]:
        """serve_many: the workers connected and waiting for a run (Locust's own state ``ready``)."""
        ready = {c.id for c in self.runner.clients.ready}
        if not self.live_run:  # forget the workers that left between runs: their index is free again
            nodes = self.runner.clients
            gone = [
                w
                for w in self.workers.values()
                if w.client_id not in nodes or nodes[w.client_id].state == STATE_MISSING
            ]
            for w in gone:
                del self.workers[w.index]
                self.by_client.pop(w.client_id, None)
        return sorted((w for w in self.workers.values() if w.client_id in ready), key=lambda w: w.index)

    def start_run(self, settings: RunSettings, wait_s: float, bind_host: str, port: int) -> None:
        """serve_many: hand each connected worker this run's settings and wait until all are ready; the
        watch for lost workers starts. RuntimeError (naming the worker) when one cannot set up the run."""
        self.begin(settings)
        workers = self.connected()
        if len(workers) < self.n:
            raise RuntimeError(f"only {len(workers)} of {self.n} workers connected and ready")
        for node in list(self.runner.clients.values()):  # in Locust's books, not in ours: no users for it
            if node.id not in self.by_client:
                log.warning("worker %s is not one of this UI's %d: sending it away", node.id, self.n)
                self.runner.send_message("quit", None, node.id)
                _forget(self.runner, node.id)
        self.live_run = True
        for w in workers:
            w.last_seen = time.monotonic()
            send(self.runner, msgspec.structs.replace(self.payload, index=w.index), w.client_id)
        _wait_for_workers(
            self.runner,
            self.workers,
            self.n,
            self.procs,
            self.stopper,
            wait_s,
            self.out,
            bind_host,
            port,
            announce=False,  # they are connected: only their set-up is awaited
        )
        self.watcher = gevent.spawn(_watch_workers, self.runner, self.workers, self.procs, self.stopper)

    def abort_run(self) -> None:
        """serve_many: a start that could not begin (a worker could not set it up): every worker that did
        lets it go; nothing was sent."""
        self.live_run = False
        send(self.runner, Finish(drain=False, timeout=0.0))
        if self.watcher is not None:
            self.watcher.kill()
            self.watcher = None
        self.sink.close()
        self.release_reserve()

    def finish_workers(self, drain: bool, drain_s: float) -> None:
        """Tell every worker the run is over (drain first, at most ``drain_s``, or not) and wait for each
        one's final results, or for it to be lost."""
        send(self.runner, Finish(drain=drain, timeout=drain_s))
        deadline = time.monotonic() + (drain_s + 30 if drain else FINALS_AFTER_STOP_S)
        while time.monotonic() < deadline and any(
            w.final is None and not w.lost for w in self.workers.values()
        ):
            gevent.sleep(0.05)

    def outcome(self, started: float, spawn_local: bool, interrupted: str | None = None) -> RunOutcome:
        """The run's outcome once the finals are in: lost workers named (their unshipped records recovered
        where their copy is reachable), the record files closed. ``interrupted``: why the run was stopped
        (a signal to a `loadtest ui`)."""
        if self.watcher is not None:
            self.watcher.kill()
            self.watcher = None
        settings, profile, workers, sink, total, out = (
            self.settings,
            self.profile,
            self.workers,
            self.sink,
            self.total,
            self.out,
        )
        lost = [w for w in sorted(workers.values(), key=lambda w: w.index) if w.final is None or w.final.left]
        split = (len(profile.scenarios) > 1, len(settings.hosts or ()) > 1)  # as each worker's recorder
        recovered = {w.index: _recover_unshipped(w, sink, total, *split) for w in lost}
        lost_in_flight = sum(_record_in_flight(w, sink, total, *split) for w in lost if w.final is None)
        sink.close()
        self.release_reserve()
        if spawn_local:  # the local copies were only insurance: the run folder's logs now hold everything
            for w in workers.values():
                if w.records and Path(w.records).parent == out.resolve():
                    Path(w.records).unlink(missing_ok=True)
        reason: str | None = self.stopper.reason or interrupted  # a signal may have come since the start
        if lost and reason is None:
            reason = "; ".join(f"{w.name()} {_lost_why(w)}" for w in lost) + (
                ": every request it finished is included"
                if all(recovered[w.index] is not None for w in lost)
                else ": its requests up to its last report are included"
                if len(lost) == 1
                else ": their requests up to their last reports are included"
            )
        if self.serve_many:  # a lost worker's index is free for one that joins before the next run
            for w in lost:
                self.workers.pop(w.index, None)
                self.by_client.pop(w.client_id, None)
            self.live_run = False
        return RunOutcome(
            aggregates=total,
            interrupted_reason=reason,
            signal=self.stopper.reason,
            record_files=sink.files,
            records_written=sum(sink.counts.values()),
            workers_lost=[w.index for w in lost],
            started_epoch=started,
            ended_epoch=time.time(),
            stopped_early=self.failing[0] if self.failing else None,
            write_failure=sink.failure.describe() if sink.failure is not None else None,
            records_lost=sink.lost,
            lost_in_flight=lost_in_flight,
            ramp=self.ramp,
        )


def run_master(
    settings: RunSettings,
    master_port: int,
    spawn_local: bool = True,
    expect: int | None = None,
    bind_host: str = "127.0.0.1",
    wait_s: float = 60.0,
    live: LiveMetrics | None = None,
) -> RunOutcome:
    """A Locust master in this process and ``expect`` workers (default ``settings.processes``).

    ``spawn_local``: start the workers as processes on this host; otherwise wait up to ``wait_s`` for
    ``loadtest worker`` processes to connect from anywhere that can reach ``bind_host:master_port``.
    """
    check_locust_version()  # the distributed mode uses Locust's dispatcher (locust/compat.py)
    n = settings.processes = expect or settings.processes
    profile, _ = settings.profile()
    env = Environment(user_classes=[user_class(profile)], host=settings.host)
    runner = master_runner(env, bind_host, master_port)
    return MasterSession(settings, runner, env, n, live).run(spawn_local, bind_host, master_port, wait_s)


def _recover_unshipped(
    w: _Worker, sink: RecordSink, total: RunAggregates, per_scenario: bool, per_endpoint: bool = False
) -> int | None:
    """A lost worker's records that it finished but never reported, taken from its own copy.

    Possible when that copy is on this host (always for ``--processes`` workers: a file in the run
    folder). Lines already shipped are skipped by id; a last line cut by the crash is ignored. The
    recovered lines are appended to ``records-w<i>.jsonl`` and their metrics merged into ``total``,
    so the merged histograms still count exactly the records in the folder. Returns how many lines
    were recovered, or None when the worker's copy is not reachable from here.
    """
    if not w.records or w.host != socket.gethostname():
        return None
    local = Path(w.records)
    if not local.is_file():
        return None
    shipped_path = sink.out / f"records-w{w.index}.jsonl"
    shipped = {line.id for line in read_lines([shipped_path])} if shipped_path.is_file() else set()
    missing = [line for line in read_lines([local]) if line.id not in shipped]
    if not missing:
        return 0
    _account_lines(missing, w.index, sink, total, per_scenario, per_endpoint)
    log.warning(
        "%s: %d finished request(s) it had not reported were taken from %s", w.name(), len(missing), local
    )
    return len(missing)


def _account_lines(
    lines: list[RecordLine],
    index: int,
    sink: RecordSink,
    total: RunAggregates,
    per_scenario: bool,
    per_endpoint: bool,
) -> None:
    """Lines the master writes for a lost worker ``index``: merged into ``total`` and appended to its log."""
    recorder = Recorder(per_scenario=per_scenario, per_endpoint=per_endpoint)
    for line in lines:
        recorder.add(record_from_line(line))
    total.merge_wire(recorder.take_delta())
    sink.add_raw(index, b"".join(LINE_ENCODER.encode(line) + b"\n" for line in lines))


def _record_in_flight(
    w: _Worker, sink: RecordSink, total: RunAggregates, per_scenario: bool, per_endpoint: bool = False
) -> int:
    """A lost worker's requests in flight at its last report that no line of its log accounts for: one
    record each, outcome ``cancelled`` (the worker, not the endpoint, lost them; their real outcome is
    unknown), appended to ``records-w<i>.jsonl`` and merged into ``total``. Returns how many."""
    if not w.pending:
        return 0
    path = sink.out / f"records-w{w.index}.jsonl"
    known = {line.id for line in read_lines([path])} if path.is_file() else set()
    why = f"lost with worker {w.index}: in flight at its last report, its outcome is unknown"
    lines = [
        RecordLine(
            id=p.id, scenario=p.scenario, api=p.api, worker=w.index, t=p.t, error=why, sent_us=p.sent_us
        )
        for p in w.pending
        if p.id not in known
    ]
    if not lines:
        return 0
    _account_lines(lines, w.index, sink, total, per_scenario, per_endpoint)
    log.warning("%s: %d request(s) in flight when it was lost recorded as cancelled", w.name(), len(lines))
    return len(lines)


def _lost_why(w: _Worker) -> str:
    if w.final is not None and w.final.left:
        return f"left the run early ({w.final.left})"
    why = w.lost or "did not report its final results"
    if w.in_flight:  # sent, never finished where the master can see: no record, and said so
        why += f" with {w.in_flight} request{'s' if w.in_flight != 1 else ''} in flight at its last report (their outcome is unknown)"
    return why


def _wait_for_workers(
    runner: MasterRunner,
    workers: dict[int, _Worker],
    n: int,
    procs: dict[int, subprocess.Popen],
    stopper: Stopper,
    wait_s: float,
    out: Path,
    bind_host: str,
    port: int,
    announce: bool = True,
) -> None:
    """Until ``n`` workers have their settings and are ready; a clear error otherwise."""
    deadline = time.monotonic() + wait_s
    if not procs and announce:
        log.warning(
            "waiting up to %gs for %d worker(s): loadtest worker --master-host %s --master-port %d",
            wait_s,
            n,
            "<this host>" if bind_host in ("0.0.0.0", "*", "::") else bind_host,
            port,
        )
    while True:
        failed = [w for w in workers.values() if w.error]
        if failed:
            w = failed[0]
            raise RuntimeError(f"{w.name()} could not set up the run: {w.error}")
        ready = [w for w in workers.values() if w.ready]
        if len(ready) >= n and len(runner.clients.ready) >= n:
            return
        if stopper.reason:  # Ctrl-C / SIGTERM while the workers start: an interrupted run, not a failure
            return
        dead = [p for p in procs.values() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            where = f" (see {out}/worker-*.log)" if procs else f" within {wait_s:g}s on {bind_host}:{port}"
            raise RuntimeError(f"only {len(ready)} of {n} workers connected and ready{where}")
        gevent.sleep(0.1)


def _sample_host_cpu(total: RunAggregates, pids: list[int]) -> None:
    """Once a second while the load runs: this master's and its local workers' CPU together, per core
    they may use (locust/host_cpu.py), into the run's health figures."""
    host = HostCpu(pids)
    gevent.sleep(2.0)  # start-up (users spawning) is not the steady load
    host.share()
    hist = total.all.hists["generator_host_cpu"]
    while True:
        gevent.sleep(1.0)
        hist.record_value(min(round(host.share() * 1000), 100_000))


def _watch_workers(
    runner: MasterRunner, workers: dict[int, _Worker], procs: dict[int, subprocess.Popen], stopper: Stopper
) -> None:
    """Notice workers that die: a local process that exits, or any worker silent for ``LOST_AFTER_S``."""
    t0 = time.monotonic()
    while True:
        gevent.sleep(0.25)
        now = time.monotonic()
        for w in workers.values():
            if w.lost or w.final is not None:
                continue
            proc = procs.get(w.pid)
            code = proc.poll() if proc is not None else None
            if code is not None:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
                w.lost = f"was lost {now - t0:.1f}s into the run (process ended: {how})"
            elif now - w.last_seen > LOST_AFTER_S:
                w.lost = f"was lost {now - t0:.1f}s into the run (no heartbeat for {now - w.last_seen:.0f}s)"
            else:
                continue
            log.error("%s %s", w.name(), w.lost)
            _forget(runner, w.client_id)
        if workers and all(w.lost for w in workers.values()):
            log.error("every worker is lost: ending the run")
            stopper.event.set()
            return


def _forget(runner: MasterRunner, client_id: str) -> None:
    """Drop a gone worker from Locust's books without handing its users to the others.

    Locust would redistribute them when it finally drops a silent worker (after 60 s); in open loop
    that would make a surviving worker dispatch its share of the schedule twice.
    """
    node = runner.clients.get(client_id)
    if node is None:
        return
    del runner.clients[client_id]
    dispatcher = users_dispatcher(runner)
    if dispatcher is not None:
        dispatcher.remove_worker(node)


def _spawn_worker(master_host: str, master_port: int, log_path: Path) -> subprocess.Popen:
    logf = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    host = "127.0.0.1" if master_host in ("0.0.0.0", "*") else master_host
    cmd = [
        sys.executable,
        "-m",
        "loadtest.locust.worker",
        "--master-host",
        host,
        "--master-port",
        str(master_port),
        "--local",
    ]
    # A new session: a terminal Ctrl-C reaches the master only, which then stops the workers in order.
    return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)


def _stop_processes(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """Local worker processes: ``grace_s`` to leave after the master's quit, then ended by pid."""
    deadline = time.monotonic() + grace_s
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
