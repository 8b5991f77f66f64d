"""`loadtest ui` as a master: real UI process, real `loadtest worker` processes, the embedded engine; run
after run started and stopped through Locust's HTTP API, each run's folder against the engine's truth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from loadtest.sim import SimProcess
from tests.conftest import CLI, GENERATOR_HEALTH, read_lines, write_profile
from tests.test_webui import CHROMIUM, _dump_dom, _free_port, _get, _post, _stats, _wait_for


def _start_workers(port: int, tmp: Path, n: int = 2) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            [*CLI, "worker", "--master-port", str(port), "--out", str(tmp / f"w{i}")],
            stdout=open(tmp / f"w{i}.log", "wb"),  # noqa: SIM115 - the child's log
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
        for i in range(n)
    ]


def _stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _run_over_workers(base: str, proc: subprocess.Popen, log: Path, users: int) -> dict[str, Any]:
    """Start a closed-loop run of ``users`` streams; once both workers' reports are merged, stop it."""
    assert _post(base + "/swarm", {"user_count": users, "spawn_rate": users, "host": ""})["success"]
    live = _wait_for(
        "merged counts from both workers",
        lambda: (
            (s := _stats(base))["run"]
            and s["run"]["phase"] == "running"
            and s["overall"]["requests"]["ok"] >= 10
            and s
        ),
        30,
        proc,
        log,
    )
    assert live["workers"]["ready"] == 2 and [w["state"] for w in live["workers"]["list"]] == ["running"] * 2
    # Locust's own Workers tab: both workers, the run's users split between them
    locust_workers = json.loads(_get(base + "/stats/requests")[1])["workers"]
    assert len(locust_workers) == 2 and sum(w["user_count"] for w in locust_workers) == users
    first = live["overall"]["requests"]["completed"]
    _wait_for(
        "the merged counts to grow",
        lambda: _stats(base)["overall"]["requests"]["completed"] > first,
        20,
        proc,
        log,
    )
    assert _post(base + "/stop")["success"]
    return _wait_for(
        "the results",
        lambda: (s := _stats(base))["run"]["phase"] in ("done", "failed") and s,
        60,
        proc,
        log,
    )


def _records(out: Path) -> dict[int, list[dict]]:
    return {int(p.stem.split("-w")[1]): read_lines([p]) for p in sorted(out.glob("records-w*.jsonl"))}


@pytest.fixture
def ui_master(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """A `loadtest ui --expect-workers 2` against an engine of the test's own (its truth is read); an
    indirect parameter ``{"args": [...], "env": {...}}`` adds options and environment variables."""
    given = getattr(request, "param", {})
    prof = write_profile(
        tmp_path / "ui-w.yaml",
        name="ui-w",
        load={"concurrency": 4},
        output_tokens={"dist": "fixed", "value": 16},
        slos={"ttft_p99": "2s"},
    )
    web, master = _free_port(), _free_port()
    log = tmp_path / "ui.log"
    with SimProcess(speedup=8) as sim:
        args = ["ui", "--profile", str(prof), "--host", sim.base_url, "--web-port", str(web)]
        args += ["--expect-workers", "2", "--master-port", str(master), "--worker-timeout", "30"]
        args += ["--generator-health", GENERATOR_HEALTH, "--reports-dir", str(tmp_path / "reports")]
        env = {**os.environ, **given.get("env", {})}
        with log.open("wb") as logf:
            proc = subprocess.Popen(
                [*CLI, *args, *given.get("args", [])],
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                env=env,
            )
        base = f"http://127.0.0.1:{web}"
        try:
            _wait_for("the UI to answer", lambda: _get(base + "/")[0] == 200, 30, proc, log)
            yield base, proc, log, master, sim
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_ui_runs_start_after_start_on_the_same_two_workers(ui_master: Any, tmp_path: Path) -> None:
    base, proc, log, port, sim = ui_master
    idle = _stats(base)
    assert idle["workers"]["expected"] == 2 and idle["workers"]["ready"] == 0
    # fewer workers than expected: the start is refused on the form, nothing starts
    refused = _post(base + "/swarm", {"user_count": 4, "spawn_rate": 4, "host": ""})
    assert not refused["success"] and "0 of 2 workers connected and ready" in refused["message"]
    assert _stats(base)["run"] is None
    workers = _start_workers(port, tmp_path)
    try:
        _wait_for("two workers", lambda: _stats(base)["workers"]["ready"] == 2, 30, proc, log)
        if CHROMIUM is not None:  # the dashboard says how many workers are ready
            dom = _dump_dom(base + "/llm", tmp_path / "chromium")
            assert 'id="workers-ready">2<' in dom and 'id="workers-expected">2<' in dom, dom[-3000:]
        outs = []
        for users in (4, 2):  # a second start on the same workers is a second complete run
            before = sim.stats()
            done = _run_over_workers(base, proc, log, users)
            truth = sim.stats()
            assert done["run"]["error"] is None, done["run"]["error"]
            out = Path(done["run"]["out_dir"])
            outs.append(out)
            run = json.loads((out / "run.json").read_text())
            req = run["metrics"]["requests"]
            by = _records(out)
            assert sorted(by) == [0, 1] and all(by.values())  # both workers' records, in the run folder
            records = [r for lines in by.values() for r in lines]
            # the merged counts are the records in the folder and what the engine received in this run
            received = truth["requests_received"] - before["requests_received"]
            assert req["completed"] == len(records) == received > 0
            assert req["ok"] == sum(r["outcome"] == "ok" for r in records)
            assert req["cancelled"] == 0  # the stop drained on each worker
            assert run["status"] == "completed" and run["config"]["processes"] == 2
            assert run["config"]["load"]["concurrency"] == users
            assert run["run_id"] == out.name and (out / "report.html").exists()
            assert done["verdict"]["status"] == run["verdict"]["status"]
            assert done["overall"]["requests"]["ok"] == req["ok"]
            # each worker kept its own copy of this run's records where it was told (--out DIR/<run id>/)
            for i in range(2):
                (copy,) = tmp_path.glob(f"w*/{out.name}/records-w{i}.jsonl")
                assert read_lines([copy]) == by[i]
            assert all(w.poll() is None for w in workers)  # they stay for the next start
        assert outs[0] != outs[1]
        assert _stats(base)["workers"]["ready"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        for i, w in enumerate(workers):  # the master told them to quit
            assert w.wait(timeout=20) == 0, (tmp_path / f"w{i}.log").read_text()
    finally:
        _stop_all(workers)


def test_a_worker_killed_during_a_ui_run_is_named_in_its_verdict(ui_master: Any, tmp_path: Path) -> None:
    base, proc, log, port, sim = ui_master
    workers = _start_workers(port, tmp_path)
    try:
        _wait_for("two workers", lambda: _stats(base)["workers"]["ready"] == 2, 30, proc, log)
        assert _post(base + "/swarm", {"user_count": 4, "spawn_rate": 4, "host": ""})["success"]
        _wait_for(
            "records from both workers",
            lambda: (
                (s := _stats(base))["run"]
                and s["overall"]["requests"]["ok"] >= 10
                and len(_records(Path(s["run"]["out_dir"]))) == 2
            ),
            30,
            proc,
            log,
        )
        victim = workers[0]
        victim.kill()
        victim.wait()
        lost = _wait_for(
            "the master to notice",
            lambda: (
                (s := _stats(base))["workers"]["list"]
                and "lost" in [w["state"] for w in s["workers"]["list"]]
                and s
            ),
            30,
            proc,
            log,
        )
        (gone,) = [w for w in lost["workers"]["list"] if w["state"] == "lost"]
        assert gone["pid"] == victim.pid
        assert _post(base + "/stop")["success"]
        done = _wait_for(
            "the results",
            lambda: (s := _stats(base))["run"]["phase"] in ("done", "failed") and s,
            60,
            proc,
            log,
        )
        out = Path(done["run"]["out_dir"])
        run = json.loads((out / "run.json").read_text())
        assert run["status"] == "interrupted"
        assert f"worker {gone['index']} (" in run["interrupted_reason"], run["interrupted_reason"]
        assert any(f"worker {gone['index']}" in r for r in run["verdict"]["reasons"]), run["verdict"]
        by = _records(out)
        assert run["metrics"]["requests"]["completed"] == sum(len(v) for v in by.values())
        assert len(by[gone["index"]]) > 0  # what it reported before it died is kept
        assert (out / "report.html").exists()
        assert workers[1].poll() is None  # the other stays for the next start
        assert _stats(base)["workers"]["expected"] == 2
    finally:
        _stop_all(workers)


def test_ui_processes_runs_local_workers_and_stops_them(tmp_path: Path) -> None:
    """`loadtest ui --processes 2` with an open-loop profile: two local worker processes split the
    schedule (one dispatcher each); SIGTERM mid-run writes the run as interrupted and the UI ends its
    workers."""
    prof = write_profile(tmp_path / "ui-p.yaml", name="ui-p", load={"rate": 40.0}, duration_s=30)
    web = _free_port()
    log = tmp_path / "ui.log"
    reports = tmp_path / "reports"
    args = ["ui", "--profile", str(prof), "--web-port", str(web), "--processes", "2"]
    args += ["--engine-speedup", "8", "--generator-health", GENERATOR_HEALTH, "--reports-dir", str(reports)]
    with log.open("wb") as logf:
        proc = subprocess.Popen([*CLI, *args], stdout=logf, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{web}"
    try:
        _wait_for("two local workers", lambda: _stats(base)["workers"]["ready"] == 2, 40, proc, log)
        children = [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "loadtest.locust.worker" in " ".join(p.cmdline())
        ]
        assert len(children) == 2
        assert _post(base + "/swarm", {"user_count": 4, "spawn_rate": 4, "host": ""})["success"]
        live = _wait_for(
            "requests",
            lambda: (s := _stats(base))["run"] and s["overall"]["requests"]["ok"] >= 10 and s,
            30,
            proc,
            log,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=40) == 0, log.read_text()
        out = Path(live["run"]["out_dir"])
        run = json.loads((out / "run.json").read_text())
        assert run["status"] == "interrupted" and run["interrupted_reason"] == "SIGTERM"
        by = _records(out)
        assert sorted(by) == [0, 1] and all(by.values())
        assert run["metrics"]["requests"]["completed"] == sum(len(v) for v in by.values()) > 0
        # the schedule is split, not multiplied: each arrival sent once, by one of the two workers
        ids = [int(r["id"].split("-")[1]) for lines in by.values() for r in lines]
        assert len(ids) == len(set(ids))
        assert {i % 2 for i in (int(r["id"].split("-")[1]) for r in by[0])} == {0}
        assert not list(out.glob("worker-*.records.jsonl"))  # the local copies were only insurance
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive
        assert sorted(p.name for p in reports.glob("ui-worker-*.log")) == [
            "ui-worker-0.log",
            "ui-worker-1.log",
        ]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()  # its local workers leave once their parent is gone


@pytest.mark.parametrize(
    "ui_master", [{"args": ["--api-key-env", "LT_UI_KEY"], "env": {"LT_UI_KEY": "sk-ui-only"}}], indirect=True
)
def test_a_start_a_worker_cannot_set_up_fails_naming_it_and_the_workers_stay(
    ui_master: Any, tmp_path: Path
) -> None:
    """The API key's variable is set where the UI runs, not where the workers do: each start fails with
    the worker and the fix named, nothing is sent, and the workers stay connected for the next start."""
    base, proc, log, port, sim = ui_master
    workers = _start_workers(port, tmp_path)
    try:
        _wait_for("two workers", lambda: _stats(base)["workers"]["ready"] == 2, 30, proc, log)
        before = sim.stats()["requests_received"]
        for _ in range(2):
            assert _post(base + "/swarm", {"user_count": 2, "spawn_rate": 2, "host": ""})["success"]
            failed = _wait_for(
                "the start to fail",
                lambda: (s := _stats(base))["runs"] and s["runs"][0]["phase"] == "failed" and s,
                30,
                proc,
                log,
            )
            error = failed["runs"][0]["error"]
            assert "could not set up the run" in error and "LT_UI_KEY" in error, error
            assert failed["state"] in ("ready", "stopped") and failed["run"] is None
            _wait_for("the workers back", lambda: _stats(base)["workers"]["ready"] == 2, 20, proc, log)
        assert len(_stats(base)["runs"]) == 2
        assert sim.stats()["requests_received"] == before  # nothing was sent
        assert all(w.poll() is None for w in workers)
        assert "sk-ui-only" not in log.read_text()
    finally:
        _stop_all(workers)


def test_when_every_worker_is_lost_the_ui_run_ends_by_itself(tmp_path: Path) -> None:
    """One worker, killed mid-run: the run stops without a click, names it, and a new worker that joins
    afterwards takes its place for the next start."""
    prof = write_profile(tmp_path / "ui-1.yaml", name="ui-1", load={"concurrency": 2})
    web, port = _free_port(), _free_port()
    log = tmp_path / "ui.log"
    with SimProcess(speedup=8) as sim:
        args = ["ui", "--profile", str(prof), "--host", sim.base_url, "--web-port", str(web)]
        args += ["--expect-workers", "1", "--master-port", str(port), "--generator-health", GENERATOR_HEALTH]
        with log.open("wb") as logf:
            proc = subprocess.Popen(
                [*CLI, *args, "--reports-dir", str(tmp_path / "reports")],
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        base = f"http://127.0.0.1:{web}"
        workers = _start_workers(port, tmp_path, 1)
        try:
            _wait_for("the worker", lambda: _stats(base)["workers"]["ready"] == 1, 30, proc, log)
            assert _post(base + "/swarm", {"user_count": 2, "spawn_rate": 2, "host": ""})["success"]
            _wait_for(
                "reported records",
                lambda: (s := _stats(base))["run"] and _records(Path(s["run"]["out_dir"])),
                30,
                proc,
                log,
            )
            workers[0].kill()
            workers[0].wait()
            done = _wait_for(
                "the run to end by itself",
                lambda: (s := _stats(base))["run"]["phase"] in ("done", "failed") and s,
                40,
                proc,
                log,
            )
            run = json.loads((Path(done["run"]["out_dir"]) / "run.json").read_text())
            assert run["status"] == "interrupted" and "worker 0 (" in run["interrupted_reason"]
            (tmp_path / "again").mkdir()
            workers += _start_workers(port, tmp_path / "again", 1)  # a replacement joins
            _wait_for("the replacement", lambda: _stats(base)["workers"]["ready"] == 1, 30, proc, log)
            assert [w["pid"] for w in _stats(base)["workers"]["list"]] == [0]  # not set up for a run yet
            second = _run_over_workers_one(base, proc, log, done["run"]["id"])
            assert (
                second["run"]["id"] != done["run"]["id"]
                and second["run"]["error"] is None
                and second["overall"]["requests"]["ok"] > 0
            )
            assert _records(Path(second["run"]["out_dir"])).keys() == {0}
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            _stop_all(workers)


def _run_over_workers_one(base: str, proc: subprocess.Popen, log: Path, previous: str) -> dict[str, Any]:
    """A start on one worker after the run ``previous``: some requests, then stop and its results."""
    assert _post(base + "/swarm", {"user_count": 2, "spawn_rate": 2, "host": ""})["success"]
    _wait_for(
        "requests of the new run",
        lambda: (s := _stats(base))["run"]["id"] != previous and s["overall"]["requests"]["ok"] >= 5,
        30,
        proc,
        log,
    )
    assert _post(base + "/stop")["success"]
    return _wait_for(
        "the results", lambda: (s := _stats(base))["run"]["phase"] in ("done", "failed") and s, 60, proc, log
    )
