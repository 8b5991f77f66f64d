"""Live progress of `loadtest run` (locust/progress.py): a line on stderr every --progress seconds with
the requests so far (growing), their rates, TTFT and the requests in flight, and the drain announced;
none with --progress 0; the same from a master whose workers report; by default every 5 s on a terminal,
none when piped, none with --quiet."""

from __future__ import annotations

import itertools
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import CLI, run_cli, write_profile  # noqa: E402

LINE = re.compile(
    r"^progress (\d+) s / 6 s: (\d+) requests \((\d+) ok, (\d+) failed\), [\d.]+ req/s, [\d,]+ output tok/s, "
    r"(TTFT p50 [\d.,]+ ms p99 [\d.,]+ ms|no first token yet)(, (\d+) in flight)$"
)
# Before any request finished (long answers), the line says so rather than showing zero rates.
NONE_YET = re.compile(r"^progress (\d+) s / 6 s: no request finished yet, (\d+) in flight$")


@pytest.mark.parametrize("processes", [1, 2], ids=["local", "master"])
def test_progress_lines_while_the_load_runs_and_the_drain_announced(tmp_path: Path, processes: int) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 4})
    res = run_cli(
        ["run", "--profile", str(prof), "--duration", "6", "--progress", "1.5", "--engine-speedup", "5"]
        + ["--processes", str(processes), "--out", str(tmp_path / "out")]
    )
    assert res.returncode == 0, res.stderr[-2000:]
    err = res.stderr.splitlines()
    assert all(len(ln) <= 80 for ln in err if ln.startswith(("progress ", "  ", "load stopped"))), err
    # A progress line wrapped to 80 columns continues on lines indented two spaces.
    lines = [
        " ".join(
            [ln, *(nxt.strip() for nxt in itertools.takewhile(lambda x: x.startswith("  "), err[i + 1 :]))]
        )
        for i, ln in enumerate(err)
        if ln.startswith("progress ")
    ]
    lines = [ln for ln in lines if not NONE_YET.match(ln)]
    assert len(lines) >= 2, res.stderr[-2000:]
    parsed = [LINE.match(ln) for ln in lines]
    assert all(parsed), lines
    done = [int(m.group(2)) for m in parsed if m]
    assert done == sorted(done) and done[-1] > 0  # the count grows, and requests were counted
    assert all(int(m.group(2)) == int(m.group(3)) + int(m.group(4)) for m in parsed if m)
    # Requests in flight: a local run's own count, a master's from its workers' reports (every 3 s)
    assert all(0 <= int(m.group(7)) <= 4 for m in parsed if m)
    assert any(int(m.group(7)) > 0 for m in parsed if m)
    assert any(ln.startswith("load stopped after ") for ln in res.stderr.splitlines()), res.stderr[-2000:]


def test_no_progress_with_progress_0(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml")
    res = run_cli(
        ["run", "--profile", str(prof), "--duration", "3", "--progress", "0", "--out", str(tmp_path / "o")]
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert not [ln for ln in res.stderr.splitlines() if ln.startswith(("progress ", "load stopped"))]


def _in_a_terminal(argv: list[str], timeout: float) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal (what a person sees); exit code and output."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*CLI, *argv], stdout=follower, stderr=follower, stdin=subprocess.DEVNULL)
    os.close(follower)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal closed: the process ended
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=30), out.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)


def test_a_20_s_run_in_a_terminal_shows_progress_and_a_piped_quiet_one_shows_none(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml", load={"concurrency": 1}, output_tokens={"dist": "fixed", "value": 4}
    )
    code, seen = _in_a_terminal(
        [
            "run",
            "--profile",
            str(prof),
            "--duration",
            "20",
            "--engine-speedup",
            "10",
            "--out",
            str(tmp_path / "t"),
        ],
        timeout=240,
    )
    assert code == 0, seen[-2000:]
    ticks = [ln for ln in seen.splitlines() if ln.startswith("progress ")]
    assert 3 <= len(ticks) <= 5, seen[-3000:]  # every 5 s by default on a terminal: at 5, 10, 15 (20) s
    piped = run_cli(
        ["run", "--profile", str(prof), "--duration", "6", "--quiet", "--out", str(tmp_path / "p")]
    )
    assert piped.returncode == 0, piped.stderr[-2000:]
    text = piped.stdout + piped.stderr
    assert not [ln for ln in text.splitlines() if ln.startswith(("progress ", "load stopped"))]
    assert "verdict: PASS" in piped.stdout  # quiet is about the ticker, not the result


def test_before_any_request_finished_the_line_says_so() -> None:
    from loadtest.locust.progress import progress_line
    from loadtest.metrics.recorder import Recorder

    line = progress_line(Recorder().total, 12.0, 6.0, 16, (0.0, 0.0))
    assert line == "progress 12 s / 6 s: no request finished yet, 16 in flight"
