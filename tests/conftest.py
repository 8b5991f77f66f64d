"""Shared test helpers: run the real CLI in a subprocess, write small profiles."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-m", "loadtest.cli.main"]

# The gRPC tests create grpcio channels and servers in the test process; grpcio's fork handlers would then
# run in every child the later tests start (between fork and exec) and abort it. Off before grpc loads.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# Why these helpers judge the generator's health with `warn` by default: a run's verdict includes the
# load generator's own health (schedule lag p99 ≤ 50 ms, CPU ≤ 90 %; loadtest/metrics/verdict.py), and
# on a busy CI machine a test's tiny run can miss it and exit 11 (invalid) although the test's subject
# is something else. With `warn` the health checks are still made and written to run.json (blocking:
# false) but never decide the exit code. write_profile writes it into the profile (so commands started
# with Popen get it too), run_cli adds --generator-health warn (for shipped and hand-written profiles);
# tests/real_engines.py's run_load does the same. A test whose subject IS the generator's health (or
# exit 11 from it) asks for `fail`: write_profile(..., judging={"generator_health": "fail"}) and
# run_cli(..., generator_health=None), or `--generator-health fail` on the command line.
GENERATOR_HEALTH = "warn"
# The commands that judge a run and take --generator-health.
_JUDGING_COMMANDS = {"run", "master", "sweep", "ui"}


def write_profile(path: Path, **overrides: Any) -> Path:
    """A small, fast chat profile (fixed lengths unless overridden), judged with
    ``judging.generator_health: warn`` unless ``judging`` says otherwise (GENERATOR_HEALTH above)."""
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
    prof["judging"] = {"generator_health": GENERATOR_HEALTH, **(prof.get("judging") or {})}
    path.write_text(json.dumps(prof))  # JSON is valid YAML
    return path


def run_cli(
    args: list[str],
    timeout: float = 120,
    cwd: Path | None = None,
    generator_health: str | None = GENERATOR_HEALTH,
) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess. A judging command (run, master, sweep, ui) gets ``--generator-health
    warn`` (GENERATOR_HEALTH above) unless ``args`` give one; ``generator_health=None``: the profile's."""
    if generator_health and args and args[0] in _JUDGING_COMMANDS and "--generator-health" not in args:
        args = [*args, "--generator-health", generator_health]
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def child_pids(parent: int, needle: bytes) -> list[int]:
    """The ids of `parent`'s children whose command line holds `needle`; a process that ends mid-scan is skipped."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path("/proc", d, "stat").read_text()
            cmd = Path("/proc", d, "cmdline").read_bytes()
        except OSError:
            continue
        if stat.rsplit(") ", 1)[1].split()[1] == str(parent) and needle in cmd:
            found.append(int(d))
    return found


def failed_only_on_delivery(run_doc: dict[str, Any]) -> bool:
    """Whether the run's failed blocking checks are the merged-delivery diagnosis and the ITL and TPOT
    SLOs it makes not measurable, and nothing else (at least one of them)."""
    from loadtest.metrics import delivery  # not at the top: the GRPC setting above comes before any import
    from loadtest.metrics.verdict import MERGED_DELIVERY

    failed = [c["name"] for c in run_doc["verdict"]["checks"] if c["blocking"] and not c["passed"]]
    return bool(failed) and all(
        n == MERGED_DELIVERY or n.split("_", 1)[0] in delivery.UNMEASURABLE for n in failed
    )


def read_lines(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line]


def ended_lines(out: Path, pattern: str) -> list[int]:
    """Lines ended so far in each log of ``out`` named by ``pattern``, while a run still writes them (a
    last line caught mid-write is not counted); none while ``out`` does not exist."""
    return [p.read_bytes().count(b"\n") for p in sorted(out.glob(pattern))] if out.exists() else []


def engine_ttft_best_of_three(
    sim: Any,
    send: Callable[[int], str],
    want: Callable[[dict[str, Any]], float],
    slack: Callable[[float], float],
) -> dict[str, Any]:
    """The engine's own TTFT (arrival to first token, its truth record) of the request ``send(k)`` makes
    (returning its id): never under the model's ``want(truth)`` on any try, and at most ``slack(want)``
    over it plus the engine's step lateness in the best of three tries, since a busy machine's delays
    only add. The passing try's truth record."""
    tries = []
    for k in range(3):
        sim.stats()  # clears the step lateness: what follows is this request's
        request_id = send(k)
        late_s = sim.stats()["engine"]["step_lateness"]["max_us"] / 1e6
        truth = next(t for t in sim.truth() if t["request_id"] == request_id)
        measured = (truth["first_token_ns"] - truth["arrival_ns"]) / 1e9
        expected = want(truth)
        assert measured >= expected, (request_id, measured, expected)
        tries.append((measured, expected, late_s))
        if measured - expected <= slack(expected) + late_s:
            return truth
    raise AssertionError(tries)


def interrupt_when(
    cmd: list[str],
    ready: Callable[[], bool],
    sig: signal.Signals = signal.SIGINT,
    wait_s: float = 90,
    merge_stderr: bool = False,
    sigint_ignored: bool = False,
) -> tuple[int, str, str]:
    """Start ``cmd``, send ``sig`` once ``ready()`` holds, return (exit code, stdout, stderr); never leaks it.

    Waits at most ``wait_s`` for ``ready`` and as long again for the exit; fails if the process ended
    before the signal. With ``merge_stderr`` the stderr lines are in stdout and stderr is "". With
    ``sigint_ignored`` it starts with SIGINT ignored, as a shell's background job does.
    """
    err = subprocess.STDOUT if merge_stderr else subprocess.PIPE
    start = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=start)
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


def byte_level_tokenizer(path: Path) -> Path:
    """A tokenizer.json at ``path`` with no merges: one token per byte (per ASCII character), built with
    the tokenizers library (a model whose counts a test can predict)."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HfTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=260, special_tokens=["<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["a"], trainer)
    tok.save(str(path))
    return path
