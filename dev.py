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


def ensure_venv() -> None:
    """Create .venv and install the package with its test extras whenever pyproject.toml changes."""
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py may be started by an older python3
        sys.exit(f"loadtest needs Python 3.11 or newer (this is {sys.version.split()[0]})")
    if not PY.exists():
        sh([sys.executable, "-m", "venv", str(VENV)])
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == want:
        return
    sh([str(PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    sh([str(PY), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[test]"])
    STAMP.write_text(want)


def ensure_browser() -> None:
    """The report tests render pages in headless Chromium; install Debian's package when we can."""
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        return
    if sys.platform.startswith("linux") and shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        try:
            sh(["apt-get", "update", "-qq"], env=env)
            sh(["apt-get", "install", "-y", "-qq", "chromium"], env=env, stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError as e:
            print(f"note: could not install chromium ({e}); browser tests will be skipped", flush=True)
    else:
        print("note: no chromium found and cannot install it here; browser tests will be skipped", flush=True)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test"):
        print(__doc__)
        return 2
    what, rest = sys.argv[1], sys.argv[2:]
    ensure_venv()
    if what == "run":
        return subprocess.call([str(BIN / "loadtest"), "run", *rest], cwd=ROOT)
    ensure_browser()
    rc = subprocess.call([str(BIN / "ruff"), "check", "loadtest", "servers", "tests", "tools", "dev.py"], cwd=ROOT)
    rc_tests = subprocess.call([str(PY), "-m", "pytest", "-q", *rest], cwd=ROOT)
    return rc_tests or rc


if __name__ == "__main__":
    sys.exit(main())
