"""Run the simulated engine as a child process (plain subprocess + urllib, safe under gevent)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

# a server this host started: never through a proxy the environment may name
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

LISTENING_PREFIX = "LOADTEST_SIM_LISTENING"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class SimProcess:
    """``python -m loadtest.sim`` in a subprocess; ``with SimProcess(speedup=10) as sim: sim.base_url``."""

    def __init__(
        self,
        gpu: str = "H100",
        model: str = "llama-3.1-8b",
        speedup: float = 1.0,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        truth_log: str | Path | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        tp: int = 1,
        extra_args: list[str] | None = None,
        stderr_path: str | Path | None = None,
        startup_timeout_s: float = 30.0,
        env: dict[str, str] | None = None,
        faults: str | None = None,
        reasoning: bool | None = None,
    ) -> None:
        self.args = [
            sys.executable,
            "-m",
            "loadtest.sim",
            "--host",
            host,
            "--port",
            str(port),
            "--gpu",
            gpu,
            "--model",
            model,
            "--speedup",
            str(speedup),
            "--seed",
            str(seed),
            "--tp",
            str(tp),
            "--parent-pid",
            str(os.getpid()),
        ]
        if truth_log is not None:
            self.args += ["--truth-log", str(truth_log)]
        if max_num_seqs is not None:
            self.args += ["--max-num-seqs", str(max_num_seqs)]
        if max_num_batched_tokens is not None:
            self.args += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
        if faults:
            self.args += ["--faults", faults]
        if reasoning is not None:
            self.args += ["--reasoning", "on" if reasoning else "off"]
        self.args += list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.env = env
        self._own_stderr = stderr_path is None
        self.stderr_path = (
            Path(stderr_path)
            if stderr_path is not None
            else Path(tempfile.mkstemp(prefix="loadtest-sim-", suffix=".log")[1])
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = host
        self.port: int | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> SimProcess:
        if self.proc is not None:
            return self
        env = dict(os.environ if self.env is None else self.env)
        # Make the child import this same `loadtest` package even when it is not installed.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                # Own session: a terminal Ctrl-C reaches the load generator, which stops the engine last.
                start_new_session=True,
            )
        try:
            addr = self._read_listening_line()
            self.host, _, port = addr.rpartition(":")
            self.port = int(port)
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _stderr_tail(self, n: int = 4000) -> str:
        try:
            return self.stderr_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def _fail(self, why: str) -> RuntimeError:
        return RuntimeError(
            f"simulated engine failed to start ({why}): {' '.join(self.args)}\n"
            f"--- stderr tail ({self.stderr_path}) ---\n{self._stderr_tail()}"
        )

    def _read_listening_line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.startup_timeout_s
        buf = b""
        while True:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace").strip()
                if text.startswith(LISTENING_PREFIX):
                    return text.split(None, 1)[1]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(f"no {LISTENING_PREFIX} line within {self.startup_timeout_s:.0f} s")
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.5))
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    self.proc.wait(timeout=5)
                    raise self._fail(f"exited with code {self.proc.returncode}")
                buf += chunk
            elif self.proc.poll() is not None:
                raise self._fail(f"exited with code {self.proc.returncode}")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                with _DIRECT.open(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                raise self._fail(f"exited with code {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise self._fail("/health did not answer 200")
            time.sleep(0.05)

    def stop(self) -> int | None:
        """SIGTERM, wait up to 10 s, then SIGKILL. Idempotent; returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except ProcessLookupError:
                pass
        if proc.stdout is not None:
            proc.stdout.close()
        if self._own_stderr and proc.returncode == 0:
            self.stderr_path.unlink(missing_ok=True)  # keep the log only when something went wrong
        return proc.returncode

    def __enter__(self) -> SimProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- accessors -------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("SimProcess is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def grpc_url(self) -> str:
        """``grpc://host:port`` of the KServe v2 gRPC service (started with ``extra_args=["--grpc-port", "0"]``)."""
        port = self.stats().get("grpc_port")
        if port is None:
            raise RuntimeError("the engine serves no gRPC (start it with --grpc-port)")
        return f"grpc://{self.host}:{port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def _get(self, path: str, timeout: float = 10.0) -> bytes:
        with _DIRECT.open(self.base_url + path, timeout=timeout) as r:
            return r.read()

    def stats(self) -> dict[str, Any]:
        """GET /sim/stats."""
        return json.loads(self._get("/sim/stats"))

    def metrics(self) -> str:
        """GET /metrics (Prometheus text)."""
        return self._get("/metrics").decode()

    def truth(self) -> list[dict[str, Any]]:
        """GET /sim/truth: one dict per finished request."""
        return [json.loads(line) for line in self._get("/sim/truth", timeout=30).splitlines() if line.strip()]
