"""The dependency rule of docs/ARCHITECTURE.md, enforced: the layers contract (import-linter, configured
in pyproject.toml), no private name imported from another package, and no command-line parsing below
``cli/`` except in the two process entry points."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "loadtest"
# Processes of their own, started by module path: they parse their own command line.
ENTRY_POINTS = {"loadtest/sim/__main__.py", "loadtest/locust/worker.py"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(f.relative_to(ROOT)), ast.parse(f.read_text())) for f in sorted(PACKAGE.rglob("*.py"))]


def _room(module: str) -> str:
    """The package (room) of ``loadtest.a.b``: ``a``; a top-level module is its own room."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_layers_contract_is_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    res = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout and "KEPT" in res.stdout


def test_no_private_name_is_imported_from_another_package() -> None:
    bad = []
    for path, tree in _modules():
        here = _room(".".join(Path(path).with_suffix("").parts))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("loadtest."):
                if _room(node.module) == here:
                    continue
                bad += [
                    f"{path}:{node.lineno} {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not bad, bad


def test_no_command_line_parsing_below_cli() -> None:
    bad = []
    for path, tree in _modules():
        if path.startswith("loadtest/cli/") or path in ENTRY_POINTS:
            continue
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            bad += [f"{path}:{node.lineno}" for n in names if n.split(".")[0] == "argparse"]
    assert not bad, f"argparse below cli/ (take typed options instead): {bad}"


def _written_layers() -> list[set[str]]:
    """The layers as docs/ARCHITECTURE.md draws them: the first column of the dependency rule's block
    (a line that starts with ``|`` goes on the layer above)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("## The dependency rule", 1)[1].split("```", 2)[1]
    layers: list[set[str]] = []
    for line in block.strip("\n").splitlines():
        rooms = line.split("   ")[0] if not line.lstrip().startswith("|") else line.strip().split("   ")[0]
        names = {n.strip() for n in rooms.split("|") if n.strip()}
        if line.lstrip().startswith("|"):
            layers[-1] |= names
        else:
            layers.append(names)
    return layers


def test_the_written_layers_are_the_enforced_ones() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    enforced = [
        {m.strip().removeprefix("loadtest.") for m in layer.split("|")} for layer in contract["layers"]
    ]
    assert _written_layers() == enforced
