"""The compiled build's module list, and the guard that runs a module's Python source when it changed
after its build (a checkout edited after ``pip install -e .``): stale compiled code never runs.

setup.py compiles these modules with mypyc when it can (docs/ARCHITECTURE.md, "The compiled build") and
records each source's digest in ``_compiled.json``; with no such file the package is pure Python. This
module imports nothing of loadtest: setup.py reads it before the package's dependencies are installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

# Every request's path, one call after the other: its build, its bytes, its reads, its parse and its
# record. A module is listed only if nothing subclasses its classes or replaces its functions at run time.
COMPILED = (
    "loadtest.workload.salt",
    "loadtest.workload.text",
    "loadtest.workload.builder",
    "loadtest.client.http",
    "loadtest.client.openai",
    "loadtest.client.record",
    "loadtest.client.sse",
    "loadtest.metrics.recorder",
    "loadtest.locust.context",
)
MANIFEST = "_compiled.json"
_PACKAGE = Path(__file__).resolve().parent


def source_digest(path: Path) -> str:
    """A module source's SHA-256, as the manifest records it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_path(name: str) -> Path:
    """The source file of compiled module ``name`` (``loadtest.client.http``)."""
    return _PACKAGE.joinpath(*name.split(".")[1:]).with_suffix(".py")


def stale_modules(package: Path = _PACKAGE) -> list[str]:
    """The compiled modules whose source differs from the one they were built from ([] when none was built)."""
    try:
        recorded = json.loads((package / MANIFEST).read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    stale = []
    for name, digest in recorded.items():
        try:
            same = source_digest(source_path(name)) == digest
        except OSError:
            same = False
        if not same:
            stale.append(name)
    return stale


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` runs as a compiled extension."""
    return not str(getattr(module, "__file__", "") or "").endswith(".py")


class _SourcesFirst:
    """A finder that loads the compiled modules from their ``.py`` files: all of them, since compiled
    modules call one another directly."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in COMPILED:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def guard() -> None:
    """When any compiled module is stale, run every compiled module from its source, and say so once."""
    stale = stale_modules()
    if not stale:
        return
    sys.meta_path.insert(0, _SourcesFirst())
    warnings.warn(
        f"loadtest: {', '.join(stale)} changed since the compiled build: running the compiled modules as "
        "Python (slower); `python3 dev.py run` or `pip install --no-build-isolation -e .` builds them again",
        RuntimeWarning,
        stacklevel=2,
    )
