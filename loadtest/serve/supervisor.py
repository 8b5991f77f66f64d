"""Start a launch plan's processes (each in its own session), wait for health, stop them cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from loadtest.serve.plan import LaunchPlan, ProcSpec

# a server this host started: never through a proxy the environment may name
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

LOG_TAIL_BYTES = 3000


class LaunchError(RuntimeError):
    """A server that could not start or stay up; the message names the process and shows its log tail."""


@dataclass
class Running:
    spec: ProcSpec
    proc: subprocess.Popen[bytes]
    log: Path
    healthy: bool = False
    last_error: str = ""
    _fh: IO[bytes] | None = field(default=None, repr=False)


def log_tail(path: Path, n: int = LOG_TAIL_BYTES) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode(errors="replace")


def http_ok(url: str, timeout: float = 2.0) -> tuple[bool, str]:
    """GET ``url``: (True, body) on 200, else (False, why)."""
    try:
        with _DIRECT.open(url, timeout=timeout) as r:
            body = r.read(1 << 20).decode(errors="replace")
            return r.status == 200, body if r.status == 200 else f"HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code}"
    except (OSError, ValueError) as e:
        return False, str(getattr(e, "reason", e))


def lists_a_model(url: str) -> tuple[bool, str]:
    ok, body = http_ok(url + "/v1/models")
    if not ok:
        return False, body
    try:
        data = json.loads(body).get("data") or []
    except (ValueError, AttributeError):
        return False, "/v1/models did not answer JSON"
    return (True, "") if data else (False, "/v1/models lists no model yet")


class Supervisor:
    """``start()`` then ``wait_healthy()``; ``stop()`` (idempotent) sends SIGINT, then SIGTERM, then
    SIGKILL to each process group, the router / frontend first."""

    def __init__(self, plan: LaunchPlan, workdir: Path) -> None:
        self.plan = plan
        self.workdir = workdir
        self.running: list[Running] = []

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name, content in self.plan.files.items():
            (self.workdir / name).write_text(content)
        try:
            for spec in self.plan.processes:
                self.running.append(self._spawn(spec))
        except BaseException:
            self.stop()
            raise

    def _spawn(self, spec: ProcSpec) -> Running:
        log = self.workdir / f"{spec.name}.log"
        fh = log.open("ab")
        try:
            proc = subprocess.Popen(
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env={**os.environ, **spec.env},
                start_new_session=True,  # its own process group: stopped as a whole, deaf to terminal Ctrl-C
            )
        except OSError as e:
            fh.close()
            raise LaunchError(
                f"{spec.name}: cannot run {spec.argv[0]!r}: {e.strerror or e}; install the engine or point "
                "--executable / --python at it"
            ) from e
        return Running(spec, proc, log, _fh=fh)

    def _exited(self) -> Running | None:
        return next((r for r in self.running if r.proc.poll() is not None), None)

    def _failure(self, r: Running, why: str) -> LaunchError:
        return LaunchError(f"{r.spec.name} {why}\n--- last lines of {r.log} ---\n{log_tail(r.log).rstrip()}")

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> None:
        """Until every health URL answers 200 (and, for ``ready == "models"``, the endpoint lists a model);
        LaunchError with the log tail of the process that exited or is still not healthy."""
        deadline = time.monotonic() + timeout_s
        while True:
            dead = self._exited()
            if dead is not None:
                raise self._failure(dead, f"exited with code {dead.proc.returncode} before it was healthy")
            waiting = [r for r in self.running if r.spec.health_url and not r.healthy]
            for r in waiting:
                r.healthy, r.last_error = http_ok(r.spec.health_url or "")
                if r.healthy:
                    r.last_error = ""
            waiting = [r for r in waiting if not r.healthy]
            if not waiting:
                ok, why = (True, "") if self.plan.ready != "models" else lists_a_model(self.plan.url)
                if ok:
                    return
                waiting = [self.running[0]]
                waiting[0].last_error = why
            if time.monotonic() >= deadline:
                r = waiting[0]
                raise self._failure(
                    r,
                    f"was not healthy within {timeout_s:g} s ({r.spec.health_url or self.plan.url}: "
                    f"{r.last_error or 'no answer'}); raise --health-timeout for large models",
                )
            time.sleep(poll_s)

    def first_exited(self) -> Running | None:
        return self._exited()

    def stop(self, grace_s: float = 30.0) -> None:
        order = sorted(self.running, key=lambda r: r.spec.role not in ("router", "frontend"))
        for sig, share in ((signal.SIGINT, 0.5), (signal.SIGTERM, 0.5)):
            alive = [r for r in order if r.proc.poll() is None]
            for r in alive:
                _signal_group(r.proc.pid, sig)
            end = time.monotonic() + grace_s * share
            for r in alive:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.proc.wait(timeout=max(0.0, end - time.monotonic()))
        for r in order:
            # the leader may be gone while its children (TP workers) are not: kill the whole group
            _signal_group(r.proc.pid, signal.SIGKILL)
            if r.proc.poll() is None:
                r.proc.wait()
            if r._fh is not None:
                r._fh.close()
                r._fh = None

    def pids(self) -> dict[str, int]:
        return {r.spec.name: r.proc.pid for r in self.running}


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
