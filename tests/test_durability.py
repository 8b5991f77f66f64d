"""Durable records (docs/durability.md): a disk that fills mid-run, a killed worker and a signal lose no
finished request silently and never pass."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from summary_sections import add_lines

from loadtest.sim import SimProcess
from tests.conftest import CLI, child_pids, read_lines, write_profile

DISK = "80m"  # the run folder's check wants 64 MiB free; the run holds 8 MiB of it back for run.json


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (root only; the test is skipped, saying why, elsewhere)."""
    where.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of ``DISK`` mounted for the test, unmounted after it."""
    with _tmpfs(tmp_path / "disk", DISK) as where:
        yield where


def _fill(disk: Path) -> None:
    """Take every free byte of ``disk`` (large blocks, then small ones)."""
    with open(disk / "filler", "wb", buffering=0) as f:
        for block in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(bytes(block))
            except OSError:
                continue


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *args], stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _wait(cond: Callable[[], bool], procs: list[subprocess.Popen], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        assert all(p.poll() is None for p in procs), "a process ended early"
        time.sleep(0.05)


def _has_lines(pattern: str, *folders: Path) -> Callable[[], bool]:
    return lambda: any(p.stat().st_size > 0 for d in folders for p in d.glob(pattern))


def _ok_ids(sim: SimProcess) -> set[str]:
    """The requests the engine finished, by the X-Request-Id they carried."""
    return {t["request_id"] for t in sim.truth() if t["outcome"] == "ok"}


@pytest.mark.parametrize("mode", ["single", "processes", "master"])
def test_a_disk_that_fills_mid_run_loses_no_finished_request_silently(
    tmp_path: Path, small_disk: Path, mode: str
) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 4}, duration_s=20)
    out = small_disk / "run"
    logs = [tmp_path / "cli.log"]
    with SimProcess(speedup=4) as sim:
        common = _common(prof, sim.base_url, out)
        if mode == "master":
            port = _free_port()
            cli = _start(["master", *common, "--expect-workers", "2", "--master-port", str(port)], logs[0])
            logs += [tmp_path / f"w{i}.log" for i in range(2)]
            workers = [
                _start(["worker", "--master-port", str(port), "--out", str(tmp_path / f"w{i}")], logs[1 + i])
                for i in range(2)
            ]
            ready = _has_lines("records-w*.jsonl", out)  # the master wrote a first report's lines
        else:
            cli = _start(["run", *common, *(["--processes", "2"] if mode == "processes" else [])], logs[0])
            workers = []
            ready = _has_lines("records-w*.jsonl" if mode == "processes" else "records.jsonl", out)
        try:
            _wait(ready, [cli, *workers])
            _fill(small_disk)
            code = cli.wait(timeout=60)
            for w in workers:
                w.wait(timeout=60)
        finally:
            _stop([cli, *workers])
        ok = _ok_ids(sim)
    (small_disk / "filler").unlink()
    console = logs[0].read_text()
    assert code == 3, console[-3000:]
    for log in logs:
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    last = console.strip().splitlines()[-1]
    assert last.startswith("verdict: ") and "PASS" not in last and "disk full" in last, last
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "incomplete" and run["interrupted_reason"].startswith("disk full at ")
    assert run["verdict"]["status"] != "pass"
    assert run["verdict"]["reasons"][0].startswith("incomplete: disk full at "), run["verdict"]["reasons"]
    lost = run["lost"]["records_not_written"]
    lines = read_lines([out / f for f in run["files"]["records"] if (out / f).exists()])
    logged = {ln["wire_id"] for ln in lines}
    # Every request the engine finished is in the record log or counted as not written; the counts agree.
    assert len(ok - logged) <= lost, (len(ok), len(logged), lost)
    assert len(lines) + lost == run["metrics"]["requests"]["completed"]
    assert lost > 0
    add_lines(
        "durability: a disk that fills mid-run",
        [
            f"{mode:9s} engine finished {len(ok):4d} ok; record log {len(lines):4d} lines; counted not written "
            f"{lost:4d}; finished but not logged {len(ok - logged):4d}; exit {code}; verdict {run['verdict']['status']}"
        ],
    )


def test_a_killed_workers_requests_in_flight_get_records(tmp_path: Path) -> None:
    """Requests long enough (2000 tokens at real speed, over ten seconds each) to be in flight at the worker's last
    report and at its kill: the master records each as cancelled, its loss said in the error."""
    prof = write_profile(
        tmp_path / "p.yaml",
        load={"concurrency": 4},
        output_tokens={"dist": "fixed", "value": 2000},
        duration_s=30,
    )
    out = tmp_path / "run"
    log = tmp_path / "cli.log"
    with SimProcess(speedup=1) as sim:
        cli = _start(
            [
                "run",
                *_common(prof, sim.base_url, out),
                "--processes",
                "2",
            ],
            log,
        )
        try:
            _wait(lambda: len(list(out.glob("worker-*.records.jsonl"))) == 2, [cli])
            time.sleep(6.5)  # a report (every 3 s) has told the master what each worker has in flight
            victim = child_pids(cli.pid, b"loadtest.locust.worker")[0]
            os.kill(victim, signal.SIGKILL)
            code = cli.wait(timeout=90)
        finally:
            _stop([cli])
    console = log.read_text()
    assert code == 1, console[-3000:]
    assert "Traceback" not in console
    run = json.loads((out / "run.json").read_text())
    index = next(i for i in range(2) if f"worker {i} (" in run["interrupted_reason"])
    lost = [
        ln
        for ln in read_lines([out / f"records-w{index}.jsonl"])
        if "lost with worker" in (ln["error"] or "")
    ]
    assert lost and all(ln["outcome"] == "cancelled" and ln["worker"] == index for ln in lost), lost
    assert run["lost"]["in_flight_of_lost_workers"] == len(lost)
    assert run["metrics"]["requests"]["completed"] == sum(
        1 for _ in read_lines([out / f for f in run["files"]["records"]])
    )
    # A lost worker is not the endpoint's fault: the run is invalid, not an endpoint failure, not a pass.
    assert run["verdict"]["status"] == "invalid", run["verdict"]["reasons"]
    assert run["verdict"]["reasons"][0].startswith(f"interrupted: worker {index} (")
    add_lines(
        "durability: a worker killed mid-run",
        [
            f"{len(lost)} request(s) in flight recorded as lost; {run['metrics']['requests']['completed']} records"
        ],
    )


def _sigterm_after_records(cmd: list[str], out: Path, ready_glob: str, log: Path) -> tuple[int, float, str]:
    proc = _start(cmd, log)
    try:
        _wait(_has_lines(ready_glob, out), [proc], timeout=90)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        _stop([proc])
    return code, took, log.read_text()


@pytest.mark.parametrize("mode", ["single", "processes", "master"])
def test_sigterm_stops_the_run_promptly_and_never_passes(tmp_path: Path, mode: str) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 4}, duration_s=60)
    out = tmp_path / "run"
    with SimProcess(speedup=4) as sim:
        extra = ["--processes", "2"] if mode == "processes" else []
        workers: list[subprocess.Popen] = []
        if mode == "master":
            port = _free_port()
            extra = ["--expect-workers", "2", "--master-port", str(port)]
            workers = [
                _start(
                    ["worker", "--master-port", str(port), "--out", str(tmp_path / f"w{i}")],
                    tmp_path / f"w{i}.log",
                )
                for i in range(2)
            ]
        cmd = [
            "master" if mode == "master" else "run",
            *_common(prof, sim.base_url, out),
            *extra,
        ]
        try:
            code, took, console = _sigterm_after_records(cmd, out, "records*.jsonl", tmp_path / "cli.log")
            for w in workers:  # the master's end ends its workers' part: they leave by themselves
                w.wait(timeout=60)
        finally:
            _stop(workers)
    assert code == 143, console[-3000:]
    assert took < 10, took  # the stop itself aims at about a second; the results take the rest
    assert "Traceback" not in console
    last = console.strip().splitlines()[-1]
    assert last.startswith("verdict: ") and "PASS" not in last and "interrupted: SIGTERM" in last, last
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted" and run["verdict"]["status"] != "pass"
    add_lines("durability: SIGTERM", [f"{mode}: exit {code} {took:.2f} s after the signal"])


BUSY = """
from gevent import monkey
monkey.patch_all()
import os, subprocess, time, gevent
from loadtest.locust.runtime import Stopper
stopper = Stopper()
stopper.install()
def busy():
    t = time.monotonic()
    while time.monotonic() - t < 60:  # a computation that never yields (building a huge unit)
        pass
worker = gevent.spawn(busy)
subprocess.Popen(["sh", "-c", f"sleep 1; kill -TERM {os.getpid()}"])
t0 = time.monotonic()
stopper.event.wait(120)
stopper.stopped()
print(f"{stopper.reason} {worker.dead} {time.monotonic() - t0 - 1:.2f}", flush=True)
"""


def test_a_signal_stops_a_process_that_does_not_yield() -> None:
    res = subprocess.run([sys.executable, "-c", BUSY], capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    reason, dead, after = res.stdout.split()
    assert reason == "SIGTERM" and dead == "True"
    assert float(after) < 10, after  # about a second on a quiet machine (BUSY_CHECK_S, twice at most)
    assert "Traceback" not in res.stderr


def _cut_log(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(ln) + "\n" for ln in lines) + '{"id": "cut-in-the-mid')


def test_readers_skip_and_count_a_cut_last_line(tmp_path: Path) -> None:
    from loadtest.results.record_log import ReadTally
    from loadtest.results.record_log import read_lines as read_log

    path = tmp_path / "records.jsonl"
    _cut_log(path, [{"id": "a", "outcome": "ok"}, {"id": "b", "outcome": "ok"}])
    tally = ReadTally()
    assert [ln.id for ln in read_log([path], tally)] == ["a", "b"]
    assert tally.cut == 1 and tally.bad == 0


def test_when_run_json_cannot_be_written_the_last_line_says_what_was_lost(
    tmp_path: Path, small_disk: Path
) -> None:
    """A filler that takes every byte the run frees (its reserve too): run.json cannot be written."""
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 4}, duration_s=20)
    out = small_disk / "run"
    log = tmp_path / "cli.log"
    with SimProcess(speedup=4) as sim:
        cmd = [
            "run",
            *_common(prof, sim.base_url, out),
        ]
        cli = _start(cmd, log)
        try:
            _wait(_has_lines("records.jsonl", out), [cli])
            deadline = time.monotonic() + 90
            with open(small_disk / "filler", "wb", buffering=0) as f:
                while cli.poll() is None and time.monotonic() < deadline:
                    try:
                        f.write(bytes(1 << 12))
                    except OSError:
                        time.sleep(0.001)
            code = cli.wait(timeout=60)
        finally:
            _stop([cli])
    console = log.read_text()
    assert code == 3, console[-3000:]
    assert "Traceback" not in console
    last = console.strip().splitlines()[-1]
    assert last.startswith("run.json not written: disk full at "), last
    assert "lost: run.json" in last and "kept: " in last, last
    verdict = console.strip().splitlines()[-2]
    assert verdict.startswith("verdict: ") and "PASS" not in verdict, verdict
    assert not (out / "run.json").exists() and not (out / ".run.json.tmp").exists()
    assert not (out / "report.html").exists()


def test_a_block_that_does_not_fit_leaves_no_half_line(tmp_path: Path) -> None:
    from loadtest.results.durable import AppendFile, WriteFailure

    heard: list[WriteFailure] = []
    with _tmpfs(tmp_path / "tiny", "64k") as disk:
        f = AppendFile(disk / "records.jsonl", heard.append)
        assert f.append(b'{"id": "a"}\n')
        block = b"".join(b'{"id": "%d", "pad": "%s"}\n' % (i, b"x" * 1000) for i in range(200))  # ~200 KB
        assert not f.append(block, 200)
        assert not f.append(b'{"id": "later"}\n')  # nothing more after the first failure
        f.close()
        assert (disk / "records.jsonl").read_bytes() == b'{"id": "a"}\n'  # the block cut back out
    assert f.lost == 201
    assert len(heard) == 1 and heard[0].cause == "disk full" and heard[0].file == "records.jsonl"
    assert heard[0].describe().startswith("disk full at ")


def _common(prof: Path, host: str, out: Path) -> list[str]:
    """The options every run of these tests takes: the profile, the engine, the run folder, health warned."""
    return ["--profile", str(prof), "--host", host, "--out", str(out), "--generator-health", "warn"]
