"""Shared test helpers: run the real CLI in a subprocess, write small profiles."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
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


def interrupt_when(
    cmd: list[str],
    ready: Callable[[], bool],
    sig: signal.Signals = signal.SIGINT,
    wait_s: float = 90,
    merge_stderr: bool = False,
) -> tuple[int, str, str]:
    """Start ``cmd``, send ``sig`` once ``ready()`` holds, return (exit code, stdout, stderr); never leaks it.

    Waits at most ``wait_s`` for ``ready`` and as long again for the exit; fails if the process ended
    before the signal. With ``merge_stderr`` the stderr lines are in stdout and stderr is "".
    """
    err = subprocess.STDOUT if merge_stderr else subprocess.PIPE
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and proc.poll() is None and not ready():
            time.sleep(0.1)
        assert proc.poll() is None, "ended before the signal:\n" + "\n".join(filter(None, proc.communicate()))
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=wait_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout, stderr or ""


@pytest.fixture
def small_profile(tmp_path: Path) -> Path:
    return write_profile(tmp_path / "test-chat.yaml")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What the tests measured (tests/summary_sections.py): the real engines' figures, the fault matrix."""
    from summary_sections import SECTIONS

    for title, lines in SECTIONS.items():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
