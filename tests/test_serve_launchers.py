"""Engine launchers: dry-run command lines for every engine x preset x mode, and a real start/health/stop
cycle of the supervisor against a stand-in executable."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CLI, run_cli

from loadtest.cli.serve_cmd import serve_command
from loadtest.serve import ENGINES, all_presets
from loadtest.serve.state import scrub_argv, server_info_for

TP_FLAG = {"vllm": "--tensor-parallel-size", "sglang": "--tp", "trtllm": "--tp_size"}
STANDIN = """\
#!{python}
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]
if "--version" in argv or "-c" in argv:  # the launcher's version command, when /version is slow
    print("9.9.9-standin")
    sys.exit(0)
port = int(argv[argv.index("--port") + 1]) if "--port" in argv else int(argv[argv.index("--http-port") + 1])
record = os.environ["STANDIN_DIR"]
with open(os.path.join(record, f"{{port}}.json"), "w") as f:
    json.dump({{"argv": argv, "pid": os.getpid(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}}, f)
health = int(os.environ.get("STANDIN_HEALTH", "200"))
print(f"standin listening on {{port}}, health answers {{health}}", flush=True)

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        bodies = {{
            "/health": (health, b"ok"),
            "/metrics": (200, b"vllm:num_requests_running 0\\n"),
            "/v1/models": (200, json.dumps({{"data": [{{"id": "m"}}]}}).encode()),
            "/version": (200, b'{{"version": "9.9.9-standin"}}'),
        }}
        code, body = bodies.get(self.path, (404, b""))
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

server = ThreadingHTTPServer(("127.0.0.1", port), H)
signal.signal(signal.SIGINT, lambda *a: sys.exit(0))
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
server.serve_forever()
"""


def dry_run_plan(capsys: pytest.CaptureFixture[str], engine: str, *args: str) -> dict:
    assert serve_command(engine, ["--dry-run", "--json", "--gpu-ids", "0,1,2,3,4,5,6,7", *args]) == 0
    return json.loads(capsys.readouterr().out)


def cases() -> list[tuple[str, str, str, int]]:
    """Every GPU preset, mode and GPU count with every engine (CPU presets: test_cpu_preset_plan)."""
    out = []
    for preset in all_presets().values():
        if preset.device == "cpu":
            continue
        for mode in ("aggregated", "disagg"):
            for gpus in preset.layouts(mode):
                out += [(engine, preset.name, mode, gpus) for engine in ENGINES]
    return out


def test_every_engine_preset_and_mode(capsys: pytest.CaptureFixture[str]) -> None:
    seen_modes: set[tuple[str, str]] = set()
    for engine, name, mode, gpus in cases():
        preset = all_presets()[name]
        layout = preset.layout(mode, gpus)
        plan = dry_run_plan(
            capsys, engine, "--preset", name, "--mode", mode, "--gpus", str(gpus), "--port", "9100"
        )
        seen_modes.add((engine, mode))
        where = f"{engine} {name} {mode} {gpus}"
        assert plan["model"] == preset.model and plan["url"] == "http://127.0.0.1:9100", where
        procs = plan["processes"]
        workers = [p for p in procs if p["role"] in ("server", "worker", "prefill", "decode")]
        instances = [layout.instance] if layout.instance else [*layout.prefill, *layout.decode]
        assert len(workers) == len(instances), where
        # every GPU handed out exactly once
        used = [g for p in workers for g in p["env"]["CUDA_VISIBLE_DEVICES"].split(",")]
        assert sorted(used, key=int) == [str(i) for i in range(gpus)], where
        if mode == "disagg":
            roles = [p["role"] for p in workers]
            assert roles == ["prefill"] * len(layout.prefill) + ["decode"] * len(layout.decode), where
            front = [p for p in procs if p["role"] in ("router", "frontend")]
            assert len(front) == 1 and front[0]["port"] == 9100, where
        for p, inst in zip(workers, instances, strict=True):
            argv = p["argv"]
            assert preset.model in argv, where
            if engine in TP_FLAG:
                assert argv[argv.index(TP_FLAG[engine]) + 1] == str(inst.tp), where
            if engine != "dynamo" and mode == "aggregated":
                assert argv[argv.index("--port") + 1] == "9100", where
            if engine == "dynamo":
                assert p["env"]["DYN_SYSTEM_PORT"] != "9100"
                if mode == "disagg":
                    assert argv[argv.index("--disaggregation-mode") + 1] == p["role"], where
            if engine == "sglang" and mode == "disagg":
                assert argv[argv.index("--disaggregation-mode") + 1] == p["role"], where
            if engine == "vllm" and mode == "disagg":
                kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
                assert kv["kv_connector"] == "NixlConnector", where
                assert kv["kv_role"] == ("kv_producer" if p["role"] == "prefill" else "kv_consumer"), where
        if engine == "trtllm":
            files = plan["files"]
            tp = yaml_value(files, "tensor_parallel_size")
            assert tp is None  # trtllm-serve takes parallelism as flags; Dynamo's engine file has it
            if mode == "disagg":
                assert "context_servers" in files["disagg_config.yaml"], where
                assert "disable_overlap_scheduler: true" in files["ctx_llm_api_options.yaml"], where
        assert plan["metrics_urls"], where
    assert seen_modes == {(e, m) for e in ENGINES for m in ("aggregated", "disagg")}


def yaml_value(files: dict[str, str], key: str) -> str | None:
    for content in files.values():
        for line in content.splitlines():
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    return None


def test_dynamo_backends_and_the_cli_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    plan = dry_run_plan(
        capsys,
        "dynamo",
        "--preset",
        "llama-2-70b",
        "--mode",
        "disagg",
        "--gpus",
        "8",
        "--dynamo-backend",
        "trtllm",
    )
    assert [p["role"] for p in plan["processes"]] == ["frontend", "prefill", "decode"]
    assert "tensor_parallel_size: 4" in plan["files"]["prefill_engine_args.yaml"]
    assert plan["ready"] == "models"
    r = run_cli(
        ["serve", "sglang", "--preset", "deepseek-r1", "--dry-run", "--extra-args=--enable-torch-compile"]
    )
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "sglang.launch_server" in ln)
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in line and "--tp 8 " in line and "--ep-size 8" in line
    assert "--reasoning-parser deepseek-r1" in line and line.endswith("--enable-torch-compile")
    r = run_cli(["serve", "vllm", "--preset", "deepseek-r1", "--mode", "disagg", "--dry-run"])
    assert r.returncode == 2 and "no disagg layout" in r.stderr
    r = run_cli(["serve", "vllm", "--preset", "no-such-model", "--dry-run"])
    assert r.returncode == 2 and "llama-3.1-8b" in r.stderr  # names the known presets
    r = run_cli(["serve", "presets"])
    assert r.returncode == 0 and "gpt-oss-120b" in r.stdout and "qwen3-vl-235b-a22b" in r.stdout


def test_secrets_are_scrubbed_from_recorded_argv() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "sk-1", "--hf-token=abc", "--port", "1"]
    assert scrub_argv(argv) == ["vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "--port", "1"]
    # Counts and paths named after tokens are not secrets.
    kept = ["--max-num-batched-tokens", "8192", "--tokenizer", "/models/t", "--max-tokens", "16"]
    assert scrub_argv(kept) == kept
    assert scrub_argv(["--token", "abc"]) == ["--token", "***"]


# ---- a real start / health / stop cycle ----------------------------------------------------------
def free_port_block(span: int = 110) -> int:
    """A port P with P..P+3 and P+100..P+101 free (router, workers, SGLang bootstrap ports)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + span > 65000:
            continue
        try:
            for p in [*range(base, base + 4), base + 100, base + 101]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port block")


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    path = tmp_path / "standin"
    path.write_text(STANDIN.format(python=sys.executable))
    path.chmod(0o755)
    (tmp_path / "records").mkdir()
    return path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def launcher_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(LOADTEST_STATE_DIR=str(tmp_path / "state"), STANDIN_DIR=str(tmp_path / "records"), **extra)
    return env


def test_start_health_record_stop(tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port_block()
    info = tmp_path / "server.json"
    args = ["serve", "sglang", "--preset", "llama-3.1-8b", "--mode", "disagg", "--gpus", "2",
            "--port", str(port), "--executable", str(standin), "--log-dir", str(tmp_path / "logs"),
            "--info-out", str(info), "--health-timeout", "60", "--extra-args", "--api-key sk-secret"]  # fmt: skip
    launcher = subprocess.Popen(
        CLI + args, env=launcher_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not info.exists():
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "server.json was not written"
            time.sleep(0.1)
        doc = json.loads(info.read_text())
        pids = [p["pid"] for p in doc["processes"]]
        logs = "\n".join(f.read_text() for f in (tmp_path / "logs").glob("*.log"))
        assert all(alive(pid) for pid in pids)
        assert doc["engine"] == "sglang" and doc["version"] == "9.9.9-standin", (doc, logs)
        assert doc["url"] == f"http://127.0.0.1:{port}" and doc["preset"] == "llama-3.1-8b"
        assert [p["role"] for p in doc["processes"]] == ["prefill", "decode", "router"]
        assert doc["launcher_pid"] == launcher.pid
        assert "sk-secret" not in info.read_text()  # argv is recorded with secrets hidden
        # each process got exactly the argv and GPUs the plan says
        for p in doc["processes"]:
            seen = json.loads(
                (tmp_path / "records" / f"{p['argv'][p['argv'].index('--port') + 1]}.json").read_text()
            )
            assert seen["pid"] == p["pid"]
            assert seen["argv"] == [a if a != "***" else "sk-secret" for a in p["argv"][1:]]
        prefill = json.loads((tmp_path / "records" / f"{port + 1}.json").read_text())
        assert prefill["cuda"] == "0" and "prefill" in prefill["argv"]
        decode = json.loads((tmp_path / "records" / f"{port + 2}.json").read_text())
        assert decode["cuda"] == "1" and "decode" in decode["argv"]
        # a run against that URL finds the record without being told
        monkeypatch.setenv("LOADTEST_STATE_DIR", str(tmp_path / "state"))
        found = server_info_for(f"http://localhost:{port}/")
        assert found is not None and found["engine"] == "sglang", found
        assert "pid" not in found["processes"][0]
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err
        assert "ready: http://127.0.0.1" in out and "stopped" in out, (out, err)
        assert not any(alive(pid) for pid in pids), "a server process outlived the launcher"
        assert server_info_for(f"http://127.0.0.1:{port}") is None  # the record is gone with the server
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in pids:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


def test_health_timeout_shows_the_log_tail(tmp_path: Path, standin: Path) -> None:
    port = free_port_block()
    args = ["serve", "vllm", "--preset", "llama-3.1-8b", "--port", str(port), "--executable", str(standin),
            "--log-dir", str(tmp_path / "logs"), "--health-timeout", "3"]  # fmt: skip
    r = subprocess.run(
        CLI + args,
        env=launcher_env(tmp_path, STANDIN_HEALTH="503"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "server was not healthy within 3 s" in r.stderr and "HTTP 503" in r.stderr
    assert f"standin listening on {port}, health answers 503" in r.stderr  # the tail of the server's log
    seen = json.loads((tmp_path / "records" / f"{port}.json").read_text())
    assert seen["argv"][:2] == ["serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert not alive(seen["pid"])


def test_missing_engine_executable(tmp_path: Path) -> None:
    r = run_cli(
        ["serve", "trtllm", "--preset", "llama-3.1-8b", "--port", str(free_port_block()),
         "--executable", str(tmp_path / "nope"), "--log-dir", str(tmp_path / "logs")]
    )  # fmt: skip
    assert r.returncode == 1 and "cannot run" in r.stderr and "--executable" in r.stderr


def test_cpu_preset_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A CPU preset starts vLLM's CPU build: its server module, no GPUs, OpenMP and KV-cache env."""
    model = tmp_path / "tiny"
    model.mkdir()
    plan = dry_run_plan(
        capsys, "vllm", "--preset", "tiny-llama-cpu", "--model", str(model), "--cpu-cores", "0-1",
        "--python", "/opt/vllm/bin/python",
    )  # fmt: skip
    (proc,) = plan["processes"]
    assert proc["argv"][:6] == [
        *("taskset", "-c", "0-1"),  # every process of the server on those cores
        *("/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"),
    ]
    assert proc["argv"][proc["argv"].index("--model") + 1] == str(model)
    assert proc["argv"][proc["argv"].index("--served-model-name") + 1] == "tiny-llama"
    assert "--gpu-memory-utilization" not in proc["argv"] and "--tensor-parallel-size" not in proc["argv"]
    assert proc["env"] == {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "OMP_NUM_THREADS": "2",
    }
    assert plan["gpus"] == 0 and plan["layout"]["device"] == "cpu" and plan["ready"] == "models"
    # Other engines, a missing model folder and a bad core list are refused with one line.
    for argv in (
        ["sglang", "--preset", "tiny-llama-cpu", "--model", str(model)],
        ["vllm", "--preset", "tiny-llama-cpu", "--model", str(tmp_path / "missing")],
        ["vllm", "--preset", "tiny-llama-cpu", "--model", str(model), "--cpu-cores", "3-1"],
    ):
        assert serve_command(argv[0], ["--dry-run", *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert "CPU preset" in err and "tiny_llama.py" in err and "--cpu-cores" in err
