"""The compiled build: mypyc compiles the modules every request runs through (loadtest/compiled.py's
COMPILED) into C extensions when a C compiler is there. Without one, or with ``LOADTEST_COMPILE=0``, the
package is pure Python and does the same, more slowly (docs/ARCHITECTURE.md, "The compiled build")."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "loadtest"))
from compiled import COMPILED, GROUP, MANIFEST, source_digest  # noqa: E402  (the list, without importing loadtest)


def ext_modules() -> list:
    """The extensions of COMPILED, each optional: a failed compile leaves that module as Python."""
    manifest = ROOT / "loadtest" / MANIFEST
    manifest.unlink(missing_ok=True)
    if os.environ.get("LOADTEST_COMPILE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # a build without the build requirements (pip --no-build-isolation)
        print("loadtest: mypyc is not installed: building pure Python", file=sys.stderr)
        return []
    paths = [name.replace(".", "/") + ".py" for name in COMPILED]
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypyc names the modules by their paths
    try:
        exts = mypycify(paths, opt_level="3", debug_level="0", group_name=GROUP)
    except (SystemExit, Exception) as e:  # noqa: BLE001 - mypyc exits when the modules do not type-check
        print(
            f"loadtest: not compiled ({e!r}): mypyc type-checks the modules against their dependencies, "
            "so install those first and then `pip install --no-build-isolation -e .` (python3 dev.py does)",
            file=sys.stderr,
        )
        return []
    finally:
        os.chdir(cwd)
    for ext in exts:
        ext.optional = True
    digests = {name: source_digest(ROOT / p) for name, p in zip(COMPILED, paths, strict=True)}
    manifest.write_text(json.dumps({"sources": digests}, indent=1, sort_keys=True) + "\n")
    return exts


setup(ext_modules=ext_modules())
