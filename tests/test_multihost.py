"""A distributed run across real network interfaces: master, two workers and the engine each in their own
network namespace with its own address (tests/netns.py), and a worker whose link goes down mid-run."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ended_lines, read_lines, write_profile
from tests.netns import Lab, unavailable

_WHY = unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

ENGINE_PORT, MASTER_PORT, LIVE_PORT = 8000, 5557, 9646
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def lab() -> Iterator[Lab]:
    lab = Lab().open(["master", "w0", "w1", "engine"])
    try:
        yield lab
    finally:
        lab.close()
        assert lab.leftovers() == [], lab.leftovers()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "loadtest.cli.main", *args]


def _get(lab: Lab, node: str, url: str) -> str:
    """``url`` fetched from inside ``node``'s namespace (this process's namespace reaches none of them)."""
    code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
    done = lab.run(node, [sys.executable, "-c", code])
    if done.returncode != 0:
        raise RuntimeError(f"GET {url} from {node}: {done.stderr.strip()[-400:]}")
    return done.stdout


def _start_engine(lab: Lab, tmp: Path) -> str:
    addr = lab.nodes["engine"].address
    argv = [sys.executable, "-m", "loadtest.sim", "--host", addr, "--port", str(ENGINE_PORT)]
    lab.start("engine", [*argv, "--speedup", "4", "--parent-pid", str(os.getpid())], tmp / "engine.log", tmp)
    url = f"http://{addr}:{ENGINE_PORT}"
    deadline = time.monotonic() + 60
    while True:
        try:
            _get(lab, "master", f"{url}/health")  # across the bridge, from the master's namespace
            return url
        except RuntimeError:
            if time.monotonic() > deadline:
                raise AssertionError((tmp / "engine.log").read_text()) from None
            time.sleep(0.5)


def _start_run(
    lab: Lab, tmp: Path, prof: Path, engine: str, extra: list[str] | None = None
) -> tuple[object, list]:
    master_addr = lab.nodes["master"].address
    master = lab.start(
        "master",
        _cli("master", "--profile", str(prof), "--host", engine, "--expect-workers", "2")
        + ["--master-bind-host", master_addr, "--master-port", str(MASTER_PORT), "--out", str(tmp / "run")]
        + ["--generator-health", "warn", *(extra or [])],
        tmp / "master.log",
        tmp,
    )
    workers = [
        lab.start(
            f"w{i}",
            _cli("worker", "--master-host", master_addr, "--master-port", str(MASTER_PORT))
            + ["--out", str(tmp / f"w{i}")],
            tmp / f"w{i}.log",
            tmp,
        )
        for i in range(2)
    ]
    return master, workers


def _live(lab: Lab, node: str, url: str) -> dict | None:
    """One scrape of the master's live metrics from ``node``, by the project's telemetry parser."""
    code = (
        f"import json; from loadtest.telemetry.scrape import scrape; s = scrape({url!r}, 2.0); "
        "h = s.buckets.get('loadtest_ttft_seconds', {}); "
        "print(json.dumps({'total': s.total, 'ttft': h.get(float('inf'))}))"
    )
    done = lab.run(node, [sys.executable, "-c", code])
    return json.loads(done.stdout) if done.returncode == 0 else None


def _lines_by_worker(out: Path) -> dict[int, list[dict]]:
    return {int(p.stem.split("-w")[1]): read_lines([p]) for p in sorted(out.glob("records-w*.jsonl"))}


def _env_ok() -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def test_every_message_crosses_a_real_interface_and_counts_match_the_engine(lab: Lab, tmp_path: Path) -> None:
    _env_ok()
    prof = write_profile(tmp_path / "p.yaml", load={"rate": 10.0}, duration_s=4)
    engine = _start_engine(lab, tmp_path)
    live_url = f"http://{lab.nodes['master'].address}:{LIVE_PORT}/metrics"
    live = ["--prometheus-port", str(LIVE_PORT), "--prometheus-bind-host", lab.nodes["master"].address]
    master, workers = _start_run(lab, tmp_path, prof, engine, [*live, "--prometheus-hold", "30"])
    # Each process in a namespace of its own, none in this one's.
    ours, deadline = os.readlink("/proc/self/ns/net"), time.monotonic() + 10
    while ours in (spaces := {os.readlink(f"/proc/{p.pid}/ns/net") for p in lab.procs}):
        assert time.monotonic() < deadline, "a process never entered its namespace"
        time.sleep(0.05)  # `ip netns exec` enters it, then execs the command
    assert len(spaces) == 4
    # The fleet watched live: the master's Prometheus endpoint scraped from a worker's namespace.
    during, final, deadline = [], None, time.monotonic() + 90
    while final is None and master.poll() is None and time.monotonic() < deadline:
        got = _live(lab, "w1", live_url)
        if got is not None and got["total"].get("loadtest_run_finished") == 1.0:
            final = got
        elif got is not None and got["total"].get("loadtest_requests_total"):
            during.append(got["total"]["loadtest_requests_total"])
        time.sleep(0.3)
    assert master.wait(timeout=90) == 0, (tmp_path / "master.log").read_text()
    for w in workers:
        assert w.wait(timeout=30) == 0, (tmp_path / "w0.log").read_text()
    stats = json.loads(_get(lab, "w0", f"{engine}/sim/stats"))
    out = tmp_path / "run"
    run = json.loads((out / "run.json").read_text())
    by = _lines_by_worker(out)
    records = [r for lines in by.values() for r in lines]
    req = run["metrics"]["requests"]
    assert run["status"] == "completed" and sorted(by) == [0, 1] and all(by.values())
    # What the merge counts is what the engine, two hops away, received and finished.
    assert req["completed"] == stats["requests_received"] == len(records) > 0
    assert req["ok"] == stats["requests_completed"] == sum(r["outcome"] == "ok" for r in records)
    assert run["metrics"]["latency_ms"]["ttft"]["count"] == req["ok"]
    # The master polled the engine's /metrics across the bridge too.
    assert len(run["telemetry"]["t"]) >= 2
    # Its live figures grew during the run and ended equal to run.json's.
    assert during and during == sorted(during) and during[0] < req["completed"], during
    assert final is not None
    assert final["total"]["loadtest_requests_total"] == req["completed"]
    assert final["ttft"] == run["metrics"]["latency_ms"]["ttft"]["count"]
    assert final["total"]["loadtest_output_tokens_total"] == run["metrics"]["tokens"]["output_total"]


def test_a_worker_cut_off_mid_run_is_named_and_its_records_recovered(lab: Lab, tmp_path: Path) -> None:
    _env_ok()
    prof = write_profile(
        tmp_path / "p.yaml", load={"rate": 8.0}, output_tokens={"dist": "fixed", "value": 32}, duration_s=10
    )
    engine = _start_engine(lab, tmp_path)
    master, workers = _start_run(lab, tmp_path, prof, engine)
    out = tmp_path / "run"
    deadline = time.monotonic() + 60
    while not (len(counts := ended_lines(out, "records-w*.jsonl")) == 2 and all(counts)):
        assert time.monotonic() < deadline, (tmp_path / "master.log").read_text()
        time.sleep(0.2)
    lab.cut("w0")  # the worker keeps running; nothing it sends reaches the master or the engine
    own = next((tmp_path / "w0").glob("records-w*.jsonl"))
    victim = int(own.stem.split("-w")[1])
    (shipped_at_cut,) = ended_lines(out, f"records-w{victim}.jsonl")
    code = master.wait(timeout=90)
    log = (tmp_path / "master.log").read_text()
    assert code == 1, log
    assert "Traceback" not in log
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted"
    reason = run["interrupted_reason"]
    # Named: its index and its pid (the namespaces share the host's pid space), and why.
    assert f"worker {victim} (" in reason and f"pid {workers[0].pid})" in reason, reason
    assert "no heartbeat" in reason, reason
    assert f"worker {1 - victim} (" not in reason, reason
    assert any(f"worker {victim}" in n for n in run["notes"]), run["notes"]
    verdict = [ln for ln in log.splitlines() if ln.startswith("verdict:")][-1]  # the command's last line
    # What happened to the run leads, before what its partial figures say about the endpoint.
    assert verdict.split("): ", 1)[1].startswith(f"interrupted: worker {victim} ("), verdict
    reasons = log[: log.rindex("verdict:")].rstrip().splitlines()
    first = next(ln for ln in reasons if ln.startswith("  - "))
    assert first.startswith(f"  - interrupted: worker {victim} ("), reasons[-6:]
    # Recovered as with a killed worker: what it finished but never reported came from its own copy
    # (the same file system), so the folder holds more of its lines than the master had at the cut,
    # and they are a prefix of that copy.
    by = _lines_by_worker(out)
    assert len(by[victim]) > shipped_at_cut, (len(by[victim]), shipped_at_cut)
    assert "had not reported were taken from" in log, log
    assert by[victim] == read_lines([own])[: len(by[victim])]
    req = run["metrics"]["requests"]
    assert req["completed"] == sum(len(v) for v in by.values())
    assert req["ok"] == sum(r["outcome"] == "ok" for v in by.values() for r in v)
    stats = json.loads(_get(lab, "w1", f"{engine}/sim/stats"))
    assert req["ok"] <= stats["requests_completed"]
