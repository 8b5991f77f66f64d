"""Distributed runs on loopback: a master with separately started workers, and a worker lost mid-run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from loadtest.sim import SimProcess
from tests.conftest import CLI, child_pids, ended_lines, read_lines, run_cli, write_profile


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(CLI + args, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=cwd)  # noqa: SIM115


def _lines_by_worker(out: Path) -> dict[int, list[dict]]:
    return {int(p.stem.split("-w")[1]): read_lines([p]) for p in sorted(out.glob("records-w*.jsonl"))}


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _wait_for_records(out: Path, workers: int, timeout: float = 30) -> None:
    """Until the master's folder holds reported records of every worker."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = ended_lines(out, "records-w*.jsonl")
        if len(counts) == workers and all(counts):
            return
        time.sleep(0.2)
    raise AssertionError(f"no records from {workers} workers in {out}")


def test_master_with_two_separate_workers_matches_engine(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"rate": 12.0}, duration_s=4)
    out, port = tmp_path / "run", _free_port()
    with SimProcess(speedup=4) as sim:
        master = _start(
            ["master", "--profile", str(prof), "--host", sim.base_url, "--expect-workers", "2"]
            + ["--master-port", str(port), "--out", str(out)],
            tmp_path / "master.log",
            tmp_path,
        )
        workers = [
            _start(
                ["worker", "--master-port", str(port), "--out", str(tmp_path / f"w{i}")],
                tmp_path / f"w{i}.log",
                tmp_path,
            )
            for i in range(2)
        ]
        try:
            assert master.wait(timeout=60) == 0, (tmp_path / "master.log").read_text()
            for w in workers:
                assert w.wait(timeout=20) == 0
        finally:
            _stop([master, *workers])
        stats = sim.stats()
    run = json.loads((out / "run.json").read_text())
    req = run["metrics"]["requests"]
    by = _lines_by_worker(out)
    records = [r for lines in by.values() for r in lines]
    assert run["status"] == "completed" and run["config"]["processes"] == 2
    # The merge counts what the engine received; the master's folder holds every record.
    assert req["completed"] == stats["requests_received"] == len(records) > 0
    assert req["ok"] == stats["requests_completed"] == sum(r["outcome"] == "ok" for r in records)
    assert run["metrics"]["latency_ms"]["e2e"]["count"] == req["ok"]
    assert run["metrics"]["latency_ms"]["ttft"]["count"] == req["ok"]
    # The open-loop schedule is split: global request ids 0..N-1, each sent once, by both workers.
    ids = sorted(int(r["id"].split("-")[1]) for r in records)
    assert ids == list(range(len(ids)))
    assert sorted(by) == [0, 1] and all(by.values())
    # Settings came from the master; each worker's own copy equals what the master holds for it.
    for i in range(2):
        local = list(tmp_path.glob(f"w*/records-w{i}.jsonl"))
        assert len(local) == 1 and read_lines(local) == by[i]
    assert (out / "report.html").exists()
    # The master polled the engine's /metrics during the run (docs/telemetry.md).
    tel = run["telemetry"]
    assert tel["engine"] in ("vllm", "loadtest-sim") and len(tel["t"]) >= 2  # the engine speaks vLLM's names
    assert max(v for v in tel["series"]["requests_running"] if v is not None) >= 0
    assert all(0 <= v <= 1 for v in tel["series"]["kv_cache_usage"] if v is not None)


@pytest.mark.parametrize("how", ["processes", "separate"])
def test_worker_killed_mid_run_is_named_and_its_reports_kept(tmp_path: Path, how: str) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        load={"concurrency": 4},
        output_tokens={"dist": "fixed", "value": 64},
        duration_s=9,
    )
    out, port = tmp_path / "run", _free_port()
    with SimProcess(speedup=4) as sim:
        common = ["--profile", str(prof), "--host", sim.base_url, "--out", str(out)]
        if how == "processes":
            master = _start(["run", *common, "--processes", "2"], tmp_path / "master.log", tmp_path)
            workers: list[subprocess.Popen] = []
        else:
            args = ["master", *common, "--expect-workers", "2", "--master-port", str(port)]
            master = _start(args, tmp_path / "master.log", tmp_path)
            workers = [
                _start(
                    ["worker", "--master-port", str(port), "--out", str(tmp_path / f"w{i}")],
                    tmp_path / f"w{i}.log",
                    tmp_path,
                )
                for i in range(2)
            ]
        try:
            _wait_for_records(out, 2)
            victim = workers[0].pid if workers else child_pids(master.pid, b"loadtest.locust.worker")[0]
            os.kill(victim, signal.SIGKILL)
            code = master.wait(timeout=60)
        finally:
            _stop([master, *workers])
        stats = sim.stats()
    log = (tmp_path / "master.log").read_text()
    assert code == 1, log
    assert "Traceback" not in log
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted"
    lost = [i for i in range(2) if f"worker {i} (" in run["interrupted_reason"]]
    assert len(lost) == 1, run["interrupted_reason"]
    assert any(f"worker {lost[0]}" in n for n in run["notes"]), run["notes"]
    assert (out / "report.html").exists()
    by = _lines_by_worker(out)
    req = run["metrics"]["requests"]
    # Everything the dead worker reported before the kill is in the folder and in the counts.
    assert len(by[lost[0]]) > 0 and len(by[1 - lost[0]]) > 0
    assert req["completed"] == sum(len(v) for v in by.values()) <= stats["requests_received"]
    assert req["ok"] == sum(r["outcome"] == "ok" for v in by.values() for r in v)
    assert run["metrics"]["latency_ms"]["e2e"]["count"] == req["ok"]
    # Its requests in flight at its last report that no line accounts for are recorded, as cancelled.
    in_flight = [r for r in by[lost[0]] if "lost with worker" in (r["error"] or "")]
    assert all(r["outcome"] == "cancelled" for r in in_flight)
    assert (run.get("lost") or {}).get("in_flight_of_lost_workers", 0) == len(in_flight)
    assert run["verdict"]["status"] != "pass"
    if workers:  # what it reported is a prefix of its own copy
        local = read_lines(list(tmp_path.glob(f"w*/records-w{lost[0]}.jsonl")))
        shipped = [r for r in by[lost[0]] if r not in in_flight]
        assert local[: len(shipped)] == shipped


def test_a_worker_without_a_master_says_where_it_waits_and_gives_up(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_cli(
        ["worker", "--master-port", str(port), "--master-timeout", "2", "--out", str(tmp_path / "w")],
        timeout=60,
    )
    assert res.returncode == 1
    assert f"waiting for the master at 127.0.0.1:{port}" in res.stdout
    assert "no master answered" in res.stderr


def test_ctrl_c_while_the_workers_start_is_an_interrupted_run_with_results(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prof = write_profile(tmp_path / "p.yaml", duration_s=5)
    out = tmp_path / "out"
    with SimProcess(speedup=8) as sim:
        argv = ["master", "--expect-workers", "2", "--profile", str(prof), "--host", sim.base_url]
        proc = subprocess.Popen(
            [*CLI, *argv, "--master-port", str(port), "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stderr is not None
            seen = ""
            while "waiting up to" not in seen:  # the master is up, waiting for its workers
                line = proc.stderr.readline()
                assert line, f"the master ended before waiting for workers: {seen[-2000:]}"
                seen += line
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, stderr[-2000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted" and "while the workers were starting" in run["interrupted_reason"]
    assert "exit 130" in stdout and "endpoint failing" not in stdout


def test_separate_workers_leave_nothing_in_their_working_directory(tmp_path: Path) -> None:
    """A worker told where (--out) keeps its copy of its records there and nothing else; one told nowhere
    keeps a temporary copy it removes once its part ended normally. Neither writes into its cwd."""
    prof = write_profile(tmp_path / "p.yaml", load={"rate": 10.0}, duration_s=3)
    out, port = tmp_path / "run", _free_port()
    cwd, scratch, kept = tmp_path / "cwd", tmp_path / "tmp", tmp_path / "kept"
    cwd.mkdir()
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}  # the workers' temporary folders go here
    with SimProcess(speedup=4) as sim:
        master = _start(
            ["master", "--profile", str(prof), "--host", sim.base_url, "--expect-workers", "2"]
            + ["--master-port", str(port), "--out", str(out)],
            tmp_path / "master.log",
            tmp_path,
        )
        workers = [
            subprocess.Popen(
                CLI + ["worker", "--master-port", str(port), *extra],
                stdout=open(tmp_path / f"w{i}.log", "wb"),  # noqa: SIM115
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
            )
            for i, extra in enumerate([["--out", str(kept)], []])
        ]
        try:
            assert master.wait(timeout=60) == 0, (tmp_path / "master.log").read_text()
            for i, w in enumerate(workers):
                assert w.wait(timeout=20) == 0, (tmp_path / f"w{i}.log").read_text()
        finally:
            _stop([master, *workers])
    by = _lines_by_worker(out)
    assert sorted(by) == [0, 1] and all(by.values())
    assert list(cwd.iterdir()) == []  # no reports/worker-<i>/, no profile copy
    (copy,) = kept.iterdir()  # the told worker: its records and nothing else
    assert copy.name.startswith("records-w") and read_lines([copy]) == by[int(copy.stem.split("-w")[1])]
    assert list(scratch.iterdir()) == []  # the other's temporary copy (and both profile copies) removed


def test_a_worker_that_leaves_early_keeps_its_temporary_copy_and_names_it(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"rate": 10.0}, duration_s=8)
    out, port, scratch = tmp_path / "run", _free_port(), tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    with SimProcess(speedup=4) as sim:
        master = _start(
            ["master", "--profile", str(prof), "--host", sim.base_url, "--expect-workers", "2"]
            + ["--master-port", str(port), "--out", str(out)],
            tmp_path / "master.log",
            tmp_path,
        )
        workers = [
            subprocess.Popen(
                CLI + ["worker", "--master-port", str(port)],
                stdout=open(tmp_path / f"w{i}.log", "wb"),  # noqa: SIM115
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                env=env,
            )
            for i in range(2)
        ]
        try:
            _wait_for_records(out, 2)
            workers[0].send_signal(signal.SIGTERM)
            assert workers[0].wait(timeout=30) is not None
            master.wait(timeout=60)
            assert workers[1].wait(timeout=20) == 0
        finally:
            _stop([master, *workers])
    log = (tmp_path / "w0.log").read_text()
    kept = [ln.rsplit(" ", 1)[1] for ln in log.splitlines() if "its own copy of its records stays in" in ln]
    assert len(kept) == 1, log
    (copy,) = Path(kept[0]).glob("records-w*.jsonl")
    index = int(copy.stem.split("-w")[1])
    # what it shipped before it left is the start of the copy it kept; the other worker kept nothing
    shipped = _lines_by_worker(out)[index]
    assert shipped and read_lines([copy])[: len(shipped)] == shipped
    assert list(scratch.iterdir()) == [Path(kept[0])]  # and no profile copy
