"""Drives a run on Locust's runners: one local process, or a master with worker processes here or on other hosts.

Settings travel from the master to each worker when it connects (``loadtest_settings``: the settings,
the profile's content and the workload fingerprint; never the API key, only its variable's name).
Records travel the other way: each report carries the histogram delta and the zlib-compressed record
lines finished since the last report, taken together, so the master's run folder holds exactly the
records its merged histograms count. End of a run: stop issuing, let in-flight requests finish (drain,
bounded), stop the users, and collect every worker's final delta and lines through an explicit
request/reply. An interrupt (Ctrl-C, SIGTERM) skips the drain: in-flight requests are recorded as
cancelled. A worker that dies is noticed (process exit, or no heartbeat for ``LOST_AFTER_S``); what it
reported is kept and the run names it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gevent
import msgspec
import yaml
from gevent.event import Event
from locust.env import Environment
from locust.rpc import Message
from locust.runners import MasterRunner, Runner, WorkerRunner

from loadtest.client.record import RequestRecord
from loadtest.client.secrets import KeySourceError, load_api_key
from loadtest.contracts.messages import (
    Failing,
    Final,
    Finish,
    Hello,
    MessageError,
    Ready,
    Report,
    Settings,
    WireMessage,
    from_data,
    report_from,
    to_data,
)
from loadtest.contracts.record_line import LINE_ENCODER
from loadtest.gc_tuning import tune_gc
from loadtest.locust.compat import check_locust_version, users_dispatcher
from loadtest.locust.context import RunContext
from loadtest.locust.executors import executor_for
from loadtest.locust.settings import RunSettings
from loadtest.locust.users import ClosedLoopUser, OpenLoopUser
from loadtest.metrics.judged import record_from_line
from loadtest.metrics.recorder import Recorder, RunAggregates
from loadtest.profile.loader import load_profile
from loadtest.profile.schema import Profile
from loadtest.results.record_log import read_lines
from loadtest.workload.builder import Workload

log = logging.getLogger("loadtest")

# The master/worker messages are the Structs of contracts/messages.py (Hello, Settings, Ready, Finish,
# Final, Failing; Report rides in each Locust worker report, every WORKER_REPORT_INTERVAL = 3 s); they
# travel as the dict form its to_data / from_data make, through _send and from_data only.
LOST_AFTER_S = 5.0  # no heartbeat (sent every second) for this long: the worker is gone
MASTER_GONE_AFTER_S = 15.0  # a worker stops when the master has not answered a heartbeat for this long


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


def _send(runner: Runner, msg: WireMessage, client_id: str | None = None) -> None:
    """Send a typed message (to one worker when ``client_id`` is given; a worker sends to its master)."""
    runner.send_message(msg.TYPE, to_data(msg), client_id)


def user_class(profile: Profile) -> type:
    return executor_for(profile.load).user_class


def drive_load(runner: Runner, profile: Profile, settings: RunSettings, stopper: _Stopper) -> None:
    """Start the users and keep the load the profile asks for until the duration ends or a signal comes
    (the profile's executor, locust/executors.py)."""
    executor_for(profile.load).drive(runner, settings.duration_s, settings.processes, stopper.event)


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
    """Let requests in flight finish, at most ``timeout`` s; those still waiting then are the endpoint's."""
    ctx.stopping = True
    deadline = time.monotonic() + timeout
    while ctx.in_flight > 0 and time.monotonic() < deadline:
        gevent.sleep(0.05)
    if ctx.in_flight > 0:
        ctx.drain_expired_s = timeout


def run_local(settings: RunSettings) -> RunOutcome:
    """Everything in this process."""
    ctx = RunContext(settings, 0, 1, "records.jsonl")
    env = Environment(user_classes=[user_class(ctx.profile)], host=settings.host)
    ctx.env = env
    env.loadtest = ctx  # type: ignore[attr-defined]  # our context rides on locust's Environment
    stopper = _Stopper()
    stopper.install()
    ctx.on_failing = lambda _info: stopper.event.set()  # end the wait; the drain and results follow
    runner = env.create_local_runner()
    tune_gc()
    started = time.time()
    drive_load(runner, ctx.profile, settings, stopper)
    if stopper.reason is None:
        _drain(ctx, ctx.profile.client.drain_timeout_s)
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


class ShippedLog:
    """A worker's record log: each line goes to a local file (if any) and waits for the next report.

    ``take()`` hands over the lines finished since the last call (zlib-compressed); the caller takes the
    histogram delta in the same step, so lines and counts always travel together.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path if path is not None else Path(os.devnull)
        self._fd = -1
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._pending: list[bytes] = []
        self.count = 0

    def write(self, rec: RequestRecord) -> None:
        line = LINE_ENCODER.encode(rec.to_log()) + b"\n"
        if self._fd >= 0:
            os.write(self._fd, line)
        self._pending.append(line)
        self.count += 1

    def take(self) -> bytes:
        if not self._pending:
            return b""
        blob = zlib.compress(b"".join(self._pending), 1)
        self._pending = []
        return blob

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


class RecordSink:
    """The master's side: appends each worker's shipped lines to ``records-w<i>.jsonl`` in the run folder."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._fds: dict[int, int] = {}
        self.counts: dict[int, int] = {}

    def add(self, index: int, blob: bytes | None) -> None:
        if blob:
            self.add_raw(index, zlib.decompress(blob))

    def add_raw(self, index: int, raw: bytes) -> None:
        """Append whole record lines (each ending in a newline) to worker ``index``'s log."""
        if not raw:
            return
        fd = self._fds.get(index)
        if fd is None:
            path = self.out / f"records-w{index}.jsonl"
            fd = self._fds[index] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.counts[index] = self.counts.get(index, 0) + raw.count(b"\n")
        data = memoryview(raw)
        while data:
            data = data[os.write(fd, data) :]

    @property
    def files(self) -> list[str]:
        """Every log written, also after ``close``."""
        return [f"records-w{i}.jsonl" for i in sorted(self.counts)]

    def close(self) -> None:
        for fd in self._fds.values():
            os.fsync(fd)
            os.close(fd)
        self._fds.clear()


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

    def name(self) -> str:
        return f"worker {self.index} ({self.host} pid {self.pid})"


def settings_payload(settings: RunSettings, index: int = 0) -> Settings:
    """What worker ``index`` needs to run: settings, the profile's content (trace path absolute), the fingerprint."""
    profile, path = settings.profile()
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    trace = load_profile(settings.profile_ref)[0].load.trace
    if (
        trace is not None
        and isinstance(data.get("load"), dict)
        and isinstance(data["load"].get("trace"), dict)
    ):
        data["load"]["trace"]["path"] = trace.path  # resolved against the master's profile folder
    return Settings(
        index=index,
        settings=settings.to_json(),
        profile=json.dumps(data),
        profile_name=path.stem,
        fingerprint=Workload(profile, settings.seed).fingerprint(),
    )


def run_master(
    settings: RunSettings,
    master_port: int,
    spawn_local: bool = True,
    expect: int | None = None,
    bind_host: str = "127.0.0.1",
    wait_s: float = 60.0,
) -> RunOutcome:
    """A Locust master in this process and ``expect`` workers (default ``settings.processes``).

    ``spawn_local``: start the workers as processes on this host; otherwise wait up to ``wait_s`` for
    ``loadtest worker`` processes to connect from anywhere that can reach ``bind_host:master_port``.
    """
    check_locust_version()  # the distributed mode uses Locust's dispatcher (locust/compat.py)
    n = settings.processes = expect or settings.processes
    profile, _ = settings.profile()
    payload = settings_payload(settings)
    env = Environment(user_classes=[user_class(profile)], host=settings.host)
    try:
        runner: MasterRunner = env.create_master_runner(bind_host, master_port)
    except SystemExit as e:  # Locust exits when the port is taken
        raise RuntimeError(f"cannot listen for workers on {bind_host}:{master_port} (port in use?)") from e
    total = RunAggregates()
    out = Path(settings.out_dir)
    sink = RecordSink(out)
    workers: dict[int, _Worker] = {}
    by_client: dict[str, _Worker] = {}
    failing: list[dict[str, Any]] = []  # the first worker's word that the endpoint fails wholesale

    def on_connect(client_id: str, **_kw: Any) -> None:
        if client_id in by_client:
            return  # a repeated client_ready: it already has the settings
        index = runner.get_worker_index(client_id)
        if index >= n:
            log.warning("worker %s connected but %d are expected: sending it away", client_id, n)
            runner.send_message("quit", None, client_id)
            return
        by_client[client_id] = workers[index] = _Worker(index, client_id)

    def on_hello(environment: Environment, msg: Message, **_kw: Any) -> None:
        from_data(Hello, msg.data)
        w = by_client.get(msg.node_id)
        if w is not None:
            w.last_seen = time.monotonic()
            _send(runner, msgspec.structs.replace(payload, index=w.index), msg.node_id)

    def seen(client_id: str, **_kw: Any) -> None:
        w = by_client.get(client_id)
        if w is not None:
            w.last_seen = time.monotonic()

    def on_worker_report(client_id: str, data: dict) -> None:
        seen(client_id)
        report = report_from(data)
        if report is None:  # the worker has no run yet
            return
        if (w := by_client.get(client_id)) is not None:
            w.in_flight = report.in_flight
        if report.delta:
            total.merge_wire(report.delta)
        sink.add(report.index, report.lines)

    def on_ready(environment: Environment, msg: Message, **_kw: Any) -> None:
        w = by_client.get(msg.node_id)
        if w is None:
            return
        try:
            ready = from_data(Ready, msg.data)
        except MessageError as e:  # another loadtest version: the run stops with this line
            w.error = str(e)
            return
        w.host, w.pid, w.error, w.records = ready.host, ready.pid, ready.error, ready.records
        w.ready = w.error is None

    def on_final(environment: Environment, msg: Message, **_kw: Any) -> None:
        final = from_data(Final, msg.data)
        total.merge_wire(final.delta)
        sink.add(final.index, final.lines)
        w = workers.get(final.index)
        if w is not None:
            w.final = final
            if final.left:
                _forget(runner, w.client_id)

    def on_failing(environment: Environment, msg: Message, **_kw: Any) -> None:
        if not failing:
            failing.append(dict(from_data(Failing, msg.data).info))
            stopper.event.set()  # every worker drains and sends its final results as at the end of a run

    env.events.worker_connect.add_listener(on_connect)
    env.events.heartbeat_sent.add_listener(seen)
    env.events.worker_report.add_listener(on_worker_report)
    runner.register_message(Hello.TYPE, on_hello)
    runner.register_message(Ready.TYPE, on_ready)
    runner.register_message(Final.TYPE, on_final)
    runner.register_message(Failing.TYPE, on_failing)
    stopper = _Stopper()
    stopper.install()

    procs: dict[int, subprocess.Popen] = {}  # pid → local worker process
    if spawn_local:
        for i in range(n):
            p = _spawn_worker(bind_host, master_port, out / f"worker-{i}.log")
            procs[p.pid] = p
    watcher: gevent.Greenlet | None = None
    started = time.time()
    try:
        _wait_for_workers(runner, workers, n, procs, stopper, wait_s, out, bind_host, master_port)
        if stopper.reason:
            runner.quit()
            return RunOutcome(
                aggregates=total,
                interrupted_reason=f"{stopper.reason} while the workers were starting: no request was sent",
                signal=stopper.reason,
                record_files=sink.files,
                started_epoch=started,
                ended_epoch=time.time(),
            )
        watcher = gevent.spawn(_watch_workers, runner, workers, procs, stopper)
        started = time.time()
        drive_load(runner, profile, settings, stopper)
        drain = stopper.reason is None
        drain_s = profile.client.drain_timeout_s
        _send(runner, Finish(drain=drain, timeout=drain_s))
        deadline = time.monotonic() + (drain_s if drain else 0) + 30
        while time.monotonic() < deadline and any(w.final is None and not w.lost for w in workers.values()):
            gevent.sleep(0.05)
        runner.quit()
    finally:
        if watcher is not None:
            watcher.kill()
        _stop_processes(list(procs.values()))
        sink.close()
    lost = [w for w in sorted(workers.values(), key=lambda w: w.index) if w.final is None or w.final.left]
    recovered = {w.index: _recover_unshipped(w, sink, total, len(profile.scenarios) > 1) for w in lost}
    sink.close()
    if spawn_local:  # the local copies were only insurance: the run folder's logs now hold everything
        for w in workers.values():
            if w.records and Path(w.records).parent == out.resolve():
                Path(w.records).unlink(missing_ok=True)
    reason: str | None = stopper.reason  # the signal handler may have set it since the start-up check
    if lost and reason is None:
        reason = "; ".join(f"{w.name()} {_lost_why(w)}" for w in lost) + (
            ": every request it finished is included"
            if all(recovered[w.index] is not None for w in lost)
            else ": its requests up to its last report are included"
            if len(lost) == 1
            else ": their requests up to their last reports are included"
        )
    return RunOutcome(
        aggregates=total,
        interrupted_reason=reason,
        signal=stopper.reason,
        record_files=sink.files,
        records_written=sum(sink.counts.values()),
        workers_lost=[w.index for w in lost],
        started_epoch=started,
        ended_epoch=time.time(),
        stopped_early=failing[0] if failing else None,
    )


def _recover_unshipped(w: _Worker, sink: RecordSink, total: RunAggregates, per_scenario: bool) -> int | None:
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
    recorder = Recorder(per_scenario=per_scenario)
    for line in missing:
        recorder.add(record_from_line(line))
    total.merge_wire(recorder.take_delta())
    sink.add_raw(w.index, b"".join(LINE_ENCODER.encode(line) + b"\n" for line in missing))
    log.warning(
        "%s: %d finished request(s) it had not reported were taken from %s", w.name(), len(missing), local
    )
    return len(missing)


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
    stopper: _Stopper,
    wait_s: float,
    out: Path,
    bind_host: str,
    port: int,
) -> None:
    """Until ``n`` workers have their settings and are ready; a clear error otherwise."""
    deadline = time.monotonic() + wait_s
    if not procs:
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


def _watch_workers(
    runner: MasterRunner, workers: dict[int, _Worker], procs: dict[int, subprocess.Popen], stopper: _Stopper
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


def _local_log_path(out: Path, index: int) -> Path:
    """``<out>/records-w<i>.jsonl``; a log left there by an earlier run is moved aside, never appended to."""
    path = out / f"records-w{index}.jsonl"
    if path.exists() and path.stat().st_size:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
        path.rename(out / f"records-w{index}.{stamp}.jsonl")
    return path


def _setup_worker(
    data: Settings, out: str | None, keep_local: bool, copy_in_run_dir: bool = False
) -> RunContext:
    """The worker's RunContext from the master's ``loadtest_settings`` message.

    ``copy_in_run_dir`` (a ``--processes`` worker, on the master's host): its records also go, as they
    finish, to ``worker-<i>.records.jsonl`` in the run folder, so that a worker killed between two
    reports loses nothing it finished (the master takes them from there; see _recover_unshipped).
    """
    index = data.index
    settings = RunSettings.from_json(data.settings)
    try:
        load_api_key(settings.api_key_env, settings.api_key_file)
    except KeySourceError as e:
        raise RuntimeError(str(e)) from e
    run_dir_copy = Path(settings.out_dir) / f"worker-{index}.records.jsonl" if copy_in_run_dir else None
    local = Path(out if out else Path("reports") / f"worker-{index}") if keep_local else None
    folder = local if local is not None else Path(tempfile.mkdtemp(prefix="loadtest-worker-"))
    folder.mkdir(parents=True, exist_ok=True)
    profile_file = folder / f"{data.profile_name}.yaml"
    profile_file.write_text(data.profile)  # JSON is valid YAML
    settings = replace(settings, profile_ref=str(profile_file), out_dir=str(folder))
    # RunContext opens its own log; this process ships lines instead (the local copy is optional).
    ctx = RunContext(settings, index, settings.processes, os.devnull)
    null_log = ctx.log
    os.close(null_log._fd)
    null_log._fd = -1
    ctx.log = ShippedLog(_local_log_path(local, index) if local is not None else run_dir_copy)  # type: ignore[assignment]
    if local is None:
        profile_file.unlink()
        folder.rmdir()
    got = ctx.workload.fingerprint()
    if got != data.fingerprint:
        raise RuntimeError(
            "this host builds different traffic from the same profile and seed (workload fingerprint "
            f"{got[:12]} ≠ the master's {data.fingerprint[:12]}): same loadtest version and tokenizer files?"
        )
    return ctx


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

    ``out``: the folder for this worker's own copy of its records (default ``reports/worker-<i>/``);
    ``keep_local=False`` keeps none (local workers: the master writes the same lines next to it).
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
    state: dict[str, Any] = {"ctx": None, "code": 0, "finishing": False}
    heard = [time.monotonic()]

    def on_settings(environment: Environment, msg: Message, **_kw: Any) -> None:
        reply = Ready(index=-1, host=socket.gethostname(), pid=os.getpid())
        try:
            data = from_data(Settings, msg.data)
            reply.index = data.index
            ctx = _setup_worker(data, out, keep_local, copy_in_run_dir)
        except Exception as e:  # noqa: BLE001 - reported to the master as one line
            reply.error = (
                str(e) if isinstance(e, (RuntimeError, MessageError)) else f"{type(e).__name__}: {e}"
            )
            log.error("cannot set up the run: %s", reply.error)
            _send(runner, reply)
            state["code"] = 1
            gevent.spawn_later(0.5, runner.quit)
            return
        ctx.env = env
        env.loadtest = ctx  # type: ignore[attr-defined]  # our context rides on locust's Environment
        # The endpoint fails wholesale here: the master ends the run for every worker.
        ctx.on_failing = lambda info: _send(runner, Failing(index=ctx.worker_index, info=info))
        state["ctx"] = ctx
        reply.records = str(ctx.log.path.resolve()) if ctx.log.path != Path(os.devnull) else None
        _send(runner, reply)
        if keep_local:
            print(f"worker {reply.index}: run {ctx.settings.run_id}, records in {ctx.log.path}", flush=True)
        tune_gc()

    def on_report(client_id: str, data: dict) -> None:
        ctx: RunContext | None = state["ctx"]
        if ctx is not None:
            report = Report(
                index=ctx.worker_index,
                in_flight=ctx.in_flight,
                delta=ctx.recorder.take_delta(),  # the delta and the lines: the same moment
                lines=ctx.log.take(),  # type: ignore[attr-defined]
            )
            data.update(to_data(report))

    def finish(drain: bool, timeout: float, left: str | None = None) -> None:
        ctx: RunContext | None = state["ctx"]
        if ctx is None or state["finishing"]:
            return
        state["finishing"] = True
        if drain:
            _drain(ctx, timeout)
        ctx.stopping = True
        runner.stop()
        ctx.close()
        _send(
            runner,
            Final(
                index=ctx.worker_index,
                delta=ctx.recorder.take_delta(),
                lines=ctx.log.take(),  # type: ignore[attr-defined]
                count=ctx.log.count,
                left=left,
            ),
        )

    def on_finish(environment: Environment, msg: Message, **_kw: Any) -> None:
        order = from_data(Finish, msg.data)
        gevent.spawn(finish, order.drain, order.timeout)

    def leave(why: str) -> None:
        finish(False, 0.0, why)
        gevent.sleep(0.5)  # let the final message go out
        ctx: RunContext | None = state["ctx"]
        if ctx is not None:
            ctx.close()
        runner.quit()

    def on_signal(sig: int) -> None:
        name = signal.Signals(sig).name
        log.warning("%s received: worker leaves the run, sending what it has", name)
        gevent.spawn(leave, name)

    def watch_master() -> None:
        while True:
            gevent.sleep(1.0)
            if parent_pid is not None and os.getppid() != parent_pid:
                why = "the master process is gone"
            elif state["ctx"] is None and time.monotonic() - waited > master_wait_s:
                why = f"no run settings from the master at {master_host}:{master_port} within {master_wait_s:g}s"
                state["code"] = 1
            elif time.monotonic() - heard[0] > MASTER_GONE_AFTER_S:
                why = f"no heartbeat from the master for {MASTER_GONE_AFTER_S:g}s"
            else:
                continue
            log.error("%s; worker stops", why)
            leave(why)
            return

    env.events.heartbeat_received.add_listener(lambda **_kw: heard.__setitem__(0, time.monotonic()))
    env.events.report_to_master.add_listener(on_report)
    runner.register_message(Settings.TYPE, on_settings)
    runner.register_message(Finish.TYPE, on_finish)
    if parent_pid is None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            gevent.signal_handler(sig, on_signal, sig)
    gevent.spawn(watch_master)
    _send(runner, Hello())  # the settings come back in reply
    runner.greenlet.join()
    ctx = state["ctx"]
    if ctx is not None:
        ctx.close()
    return int(state["code"])
