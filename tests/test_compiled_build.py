"""The compiled build (docs/ARCHITECTURE.md, "The compiled build"): where a C compiler is, the per-request
modules run compiled; a module whose source changed since its build runs all of them as Python, with a
warning; the pure Python package (LOADTEST_PURE_PYTHON=1) parses and runs the same."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import loadtest
from loadtest import compiled
from loadtest.compiled import (
    COMPILED,
    MANIFEST,
    SHARED_LIBRARY,
    source_digest,
    source_path,
    stale_modules,
)
from tests.conftest import CLI, write_profile

PACKAGE = Path(loadtest.__file__).resolve().parent
BUILT = (PACKAGE / MANIFEST).exists() and any(PACKAGE.rglob("*.so"))
needs_build = pytest.mark.skipif(
    not BUILT, reason="no compiled build here (no C compiler, or LOADTEST_COMPILE=0): the package is Python"
)


def _module_files(env: dict[str, str], cwd: Path) -> dict[str, str]:
    """Each compiled module's file, as a fresh interpreter with ``env`` imports it."""
    code = "import json, importlib; print(json.dumps({n: importlib.import_module(n).__file__ for n in %r}))"
    out = subprocess.run(
        [sys.executable, "-c", code % (COMPILED,)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.splitlines()[-1]) | {"stderr": out.stderr}


@needs_build
def test_every_listed_module_runs_compiled_and_matches_its_source() -> None:
    assert stale_modules() == []
    recorded = json.loads((PACKAGE / MANIFEST).read_text())["sources"]
    assert sorted(recorded) == sorted(COMPILED)
    # imported by a fresh interpreter: Locust's monkey-patching on a first import in this process,
    # after other tests' threads started, could deadlock the import
    env = dict(os.environ)
    env.pop("LOADTEST_PURE_PYTHON", None)
    files = _module_files(env, PACKAGE.parent)
    for name in COMPILED:
        assert recorded[name] == source_digest(source_path(name))
        assert not files[name].endswith(".py"), f"{name} runs as Python: {files[name]}"


@needs_build
def test_a_changed_source_runs_every_compiled_module_as_python(tmp_path: Path) -> None:
    """A copy of the built package runs compiled; with one source edited, all of COMPILED load from their
    .py files and the warning names the edited one."""
    copy = tmp_path / "site"
    shutil.copytree(PACKAGE, copy / "loadtest", ignore=shutil.ignore_patterns("__pycache__"))
    for lib in PACKAGE.parent.glob(SHARED_LIBRARY + "*"):  # the modules' shared library
        shutil.copy2(lib, copy / lib.name)
    env = dict(os.environ, PYTHONPATH=str(copy))
    env.pop("LOADTEST_PURE_PYTHON", None)
    files = _module_files(env, tmp_path)
    assert all(not files[n].endswith(".py") and files[n].startswith(str(copy)) for n in COMPILED), files
    salt = copy / "loadtest" / "workload" / "salt.py"
    salt.write_text(salt.read_text() + "\n# edited after the build\n")
    files = _module_files(env, tmp_path)
    assert all(files[n].endswith(".py") and files[n].startswith(str(copy)) for n in COMPILED), files
    assert "loadtest.workload.salt changed since the compiled build" in files["stderr"]


@needs_build
def test_a_build_without_its_shared_library_runs_as_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A package copied without the library its compiled modules share (a container image of a checkout)
    is not run compiled: the guard says why."""
    assert compiled._why_not_compiled() == ""
    monkeypatch.setattr(compiled, "SHARED_LIBRARY", "loadtest_no_such_build__mypyc")
    assert (
        compiled._why_not_compiled()
        == "the compiled build's loadtest_no_such_build__mypyc library is missing"
    )


def test_the_pure_python_package_parses_and_runs_the_same(tmp_path: Path) -> None:
    """LOADTEST_PURE_PYTHON=1: the modules load from their sources, the SSE and parser tests pass, and a
    short run against the embedded engine passes with every request ok."""
    env = dict(os.environ, LOADTEST_PURE_PYTHON="1")
    files = _module_files(env, tmp_path)
    assert all(files[n].endswith(".py") for n in COMPILED), files
    root = PACKAGE.parent
    tests = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_sse.py",
            "tests/test_salt.py",
        ],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert tests.returncode == 0, tests.stdout[-3000:]
    prof = write_profile(tmp_path / "p.yaml", duration_s=3)
    out = tmp_path / "run"
    res = subprocess.run(
        [*CLI, "run", "--profile", str(prof), "--out", str(out), "--generator-health", "warn"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if x.strip()]
    assert lines and all(r["outcome"] == "ok" for r in lines)


@needs_build
def test_a_build_without_its_record_of_sources_runs_as_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pure install over a built tree (``LOADTEST_COMPILE=0``) removes the record and leaves the old
    extensions: nothing says which sources they were built from, so they are not run."""
    monkeypatch.setattr(compiled, "MANIFEST", "_no_such_record.json")
    why = compiled._why_not_compiled()
    assert why == "the compiled build's record of its sources (_no_such_record.json) is missing"
