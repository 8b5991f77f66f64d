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
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

# Every request's path, one call after the other: its build, its bytes, its reads, its parse and its
# record. A module is listed only if nothing replaces its functions at run time, and nothing subclasses its
# classes but where a class allows it (``mypyc_attr(allow_interpreted_subclasses=True)``: the adapters' bases).
COMPILED = (
    "loadtest.workload.salt",
    "loadtest.workload.text",
    "loadtest.workload.builder",
    "loadtest.client.read_sweep",
    "loadtest.client.http",
    "loadtest.client.openai",
    "loadtest.client.record",
    "loadtest.client.sse",
    "loadtest.client.choices",
    "loadtest.client.quality",
    "loadtest.client.adapters.base",
    "loadtest.client.adapters.chat",
    "loadtest.client.adapters.registry",
    "loadtest.tokens.assistant",
    "loadtest.tokens.tokenizer",
    "loadtest.metrics.recorder",
    "loadtest.results.durable",
    "loadtest.results.record_log",
    "loadtest.workload.lengths",
    "loadtest.locust.compat",
    "loadtest.locust.context",
    "loadtest.locust.sending",
)
MANIFEST = "_compiled.json"
GROUP = "loadtest_compiled"  # mypyc's group: the modules' shared library is this name + "__mypyc"
SHARED_LIBRARY = GROUP + "__mypyc"
_PACKAGE = Path(__file__).resolve().parent


def source_digest(path: Path) -> str:
    """A module source's SHA-256, as the manifest records it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_path(name: str) -> Path:
    """The source file of compiled module ``name`` (``loadtest.client.http``)."""
    return _PACKAGE.joinpath(*name.split(".")[1:]).with_suffix(".py")


def stale_modules() -> list[str]:
    """The compiled modules whose source differs from the one they were built from ([] when none was built)."""
    try:
        recorded = json.loads((_PACKAGE / MANIFEST).read_text())["sources"]
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


def compiled_count() -> int:
    """How many of COMPILED this process imports compiled (it imports them)."""
    return sum(is_compiled(importlib.import_module(name)) for name in COMPILED)


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
    """When any compiled module is stale, run every compiled module from its source, and say so once;
    ``LOADTEST_PURE_PYTHON=1`` runs them from their sources too, silently (the pure package's behaviour)."""
    pure = os.environ.get("LOADTEST_PURE_PYTHON") == "1"
    why = "" if pure else _why_not_compiled()
    if pure or why:
        sys.meta_path.insert(0, _SourcesFirst())
    if why:
        warnings.warn(
            f"loadtest: {why}: running the compiled modules as Python (slower); `python3 dev.py run` or "
            "`pip install --no-build-isolation -e .` builds them again",
            RuntimeWarning,
            stacklevel=2,
        )


def _why_not_compiled() -> str:
    """Why the built modules cannot run ("" when they can, or when none was built): a source changed,
    the library they share is missing (a copy of the package without it), or the record of their sources."""
    if not any(any(source_path(n).parent.glob(n.rsplit(".", 1)[1] + ".*.so")) for n in COMPILED):
        return ""  # none was built
    if importlib.util.find_spec(SHARED_LIBRARY) is None:
        return f"the compiled build's {SHARED_LIBRARY} library is missing"
    if not (_PACKAGE / MANIFEST).exists():  # a pure install over a built tree: nothing says what was built
        return f"the compiled build's record of its sources ({MANIFEST}) is missing"
    stale = stale_modules()
    return f"{', '.join(stale)} changed since the compiled build" if stale else ""
