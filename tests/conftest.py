"""Shared test helpers: run the real CLI in a subprocess, write small profiles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-m", "loadtest.cli.main"]


def write_profile(path: Path, **overrides: Any) -> Path:
    """A small, fast chat profile (fixed lengths unless overridden)."""
    prof: dict[str, Any] = {
        "name": "test-chat",
        "api": "chat",
        "system_prompt_tokens": 0,
        "input_tokens": {"dist": "fixed", "value": 64},
        "output_tokens": {"dist": "uniform", "min": 8, "max": 24},
        "load": {"concurrency": 4},
        "duration_s": 3,
        "seed": 1,
    }
    prof.update(overrides)
    path.write_text(json.dumps(prof))  # JSON is valid YAML
    return path


def run_cli(
    args: list[str], timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def read_lines(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line]


@pytest.fixture
def small_profile(tmp_path: Path) -> Path:
    return write_profile(tmp_path / "test-chat.yaml")
