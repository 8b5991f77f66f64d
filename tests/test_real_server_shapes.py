"""What real servers do that broke the client: request ids, empty streams, context limits, odd model lists."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from conftest import CLI, read_lines, run_cli, write_profile
from fault_servers import FaultServer

from loadtest.sim.process import SimProcess


def _run(tmp_path: Path, host: str, *extra: str, **profile: object) -> tuple[int, str, list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    overrides: dict[str, object] = {"load": {"concurrency": 2}, "duration_s": 2, **profile}
    prof = write_profile(tmp_path / "p.yaml", **overrides)
    out = tmp_path / "out"
    res = run_cli(["run", "--profile", str(prof), "--host", host, "--out", str(out), *extra])
    records = read_lines(sorted(out.glob("records*.jsonl"))) if out.exists() else []
    return res.returncode, res.stdout + res.stderr, records


def test_request_ids_on_the_wire_are_uuids_and_the_record_keeps_both(tmp_path: Path) -> None:
    with FaultServer(["ok"], require_uuid=True) as srv:
        code, log, records = _run(tmp_path, srv.base_url)
        truth = dict(srv.truth)
    assert code == 0, log[-2000:]
    assert records and all(r["outcome"] == "ok" for r in records)
    for r in records:
        assert str(uuid.UUID(r["wire_id"])) == r["wire_id"]
        assert r["id"] != r["wire_id"] and r["id"].rsplit("-", 1)[1].isdigit()  # readable: <scenario>-<n>
    assert set(truth) == {r["wire_id"] for r in records}  # what the server saw is what was recorded
    assert len({r["wire_id"] for r in records}) == len(records)


def test_wire_ids_are_version_4_uuids_and_differ_across_forked_processes() -> None:
    from loadtest.client.openai import new_wire_id

    ids = [new_wire_id() for _ in range(2000)]
    for w in ids:
        u = uuid.UUID(w)
        assert str(u) == w and u.version == 4 and u.variant == uuid.RFC_4122
    assert len(set(ids)) == len(ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its ids must not repeat the parent's generator
        os.write(write, "\n".join(new_wire_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        child = set(f.read().split())
    assert status == 0 and len(child) == 50
    assert not child & {new_wire_id() for _ in range(50)}


def test_profile_headers_replace_or_remove_the_clients_own(tmp_path: Path) -> None:
    # A fixed id (different case) replaces the client's: one header, the profile's value.
    with FaultServer(["ok"]) as srv:
        code, log, records = _run(
            tmp_path / "a", srv.base_url, request={"headers": {"x-request-id": "fixed-1", "Accept": "*/*"}}
        )
        heads = list(srv.heads)
    assert code == 0, log[-2000:]
    assert heads and records
    for head in heads:
        lines = [ln.lower() for ln in head.split("\r\n")[1:]]
        assert [ln for ln in lines if ln.startswith("x-request-id:")] == ["x-request-id: fixed-1"]
        assert [ln for ln in lines if ln.startswith("accept:")] == ["accept: */*"]
    assert {r["wire_id"] for r in records} == {"fixed-1"}
    # null removes it: a server that rejects any non-UUID id is happy without one.
    with FaultServer(["ok"], require_uuid=True) as srv:
        code, log, records = _run(tmp_path / "b", srv.base_url, request={"headers": {"X-Request-Id": None}})
        heads = list(srv.heads)
    assert code == 0, log[-2000:]
    assert heads and not any("x-request-id" in h.lower() for h in heads)
    assert records and all(r["wire_id"] is None and r["outcome"] == "ok" for r in records)


def test_an_empty_stream_is_not_ok(tmp_path: Path) -> None:
    with FaultServer(["ok", "empty_done"]) as srv:
        code, log, records = _run(tmp_path, srv.base_url, "--slo", "error_rate=1%")
        truth = dict(srv.truth)
    assert code != 0, log[-2000:]
    got = Counter((truth[r["wire_id"]], r["outcome"]) for r in records)
    assert set(got) == {("ok", "ok"), ("empty_done", "empty")}, got
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    by = run["metrics"]["requests"]["by_outcome"]
    assert by["empty"] == got[("empty_done", "empty")] > 0
    # Latency figures hold the answers that carried tokens only.
    assert run["metrics"]["latency_ms"]["e2e"]["count"] == by["ok"]
    empty = next(r for r in records if r["outcome"] == "empty")
    assert "no output token" in empty["error"]


def test_context_length_refusals_are_classified(tmp_path: Path) -> None:
    with FaultServer(["ok", "context_400", "bad_request"]) as srv:
        code, log, records = _run(tmp_path, srv.base_url, "--slo", "error_rate=1%")
        truth = dict(srv.truth)
    assert code != 0
    got = {(truth[r["wire_id"]], r["outcome"]) for r in records}
    assert got == {("ok", "ok"), ("context_400", "context_length"), ("bad_request", "http_4xx")}, got


def test_prompts_over_the_served_context_are_refused_or_flagged_before_the_run(tmp_path: Path) -> None:
    with SimProcess(speedup=20, extra_args=["--max-model-len", "1024"]) as sim:
        # Every prompt is longer than the context: refused up front, nothing sent.
        code, log, _ = _run(tmp_path / "all", sim.base_url, input_tokens={"dist": "fixed", "value": 2000})
        assert code == 2, log[-2000:]
        assert "max_model_len" in log and "1024" in log and "--max-model-len" in log
        assert sim.stats()["requests_received"] == 0
        # Some do not fit: said before the run, in run.json, and each is a context_length outcome.
        code, log, records = _run(
            tmp_path / "some",
            sim.base_url,
            "--slo",
            "error_rate=100%",
            input_tokens={"dist": "uniform", "min": 200, "max": 1800},
            output_tokens={"dist": "fixed", "value": 8},
        )
    assert "need more than the model's context of 1024 tokens" in log
    run = json.loads((tmp_path / "some" / "out" / "run.json").read_text())
    assert run["endpoint"]["max_model_len"] == 1024
    assert any("context of 1024 tokens" in n for n in run["notes"])
    assert records
    for r in records:
        over = r["prompt_tokens"] + r["requested_output_tokens"] > 1024
        assert r["outcome"] == ("context_length" if over else "ok"), r
    assert {r["outcome"] for r in records} == {"ok", "context_length"}


def test_endpoint_check_can_be_skipped_or_replaced(tmp_path: Path) -> None:
    with FaultServer(["ok"], models_as_stream=True) as srv:
        code, log, _ = _run(tmp_path / "default", srv.base_url)
        assert code == 1 and "--endpoint-check" in log, log[-2000:]
        for check in ("none", "/health"):
            code, log, records = _run(
                tmp_path / check.strip("/"), srv.base_url, "--endpoint-check", check, "--model", "m"
            )
            assert code == 0, log[-2000:]
            assert records and all(r["outcome"] == "ok" for r in records)
    code, log, _ = _run(tmp_path / "bad", "http://127.0.0.1:9", "--endpoint-check", "health")
    assert code == 2 and "--endpoint-check" in log


def test_a_dead_or_silent_endpoint_fails_with_its_own_failure_first(tmp_path: Path) -> None:
    # Nothing listens (the model check skipped, so the run itself meets the dead port).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    code, log, records = _run(tmp_path / "dead", dead, "--endpoint-check", "none", "--model", "m")
    run = json.loads((tmp_path / "dead" / "out" / "run.json").read_text())
    assert code == 12, log[-2000:]
    assert records and {r["outcome"] for r in records} == {"connect_error"}
    assert "connect_error" in run["verdict"]["reasons"][0], run["verdict"]["reasons"]
    # Accepts the request and never answers: every request times out, and that is the first reason.
    with FaultServer(["never_answer"]) as srv:
        code, log, records = _run(tmp_path / "silent", srv.base_url, "--read-timeout", "1")
    run = json.loads((tmp_path / "silent" / "out" / "run.json").read_text())
    assert code == 12, log[-2000:]
    assert records and {r["outcome"] for r in records} == {"timeout"}
    assert "timeout" in run["verdict"]["reasons"][0], run["verdict"]["reasons"]


@pytest.mark.parametrize("processes", [1, 2])
def test_requests_the_endpoint_never_answers_are_its_timeouts_not_cancellations(
    tmp_path: Path, processes: int
) -> None:
    """Read timeout (300 s) longer than the drain: at the drain's end they are the endpoint's failure."""
    with FaultServer(["ok", "never_answer"]) as srv:
        code, log, records = _run(
            tmp_path, srv.base_url, "--processes", str(processes), client={"drain_timeout_s": 2}
        )
        truth = dict(srv.truth)
    assert code == 12, log[-2000:]
    got = Counter((truth[r["wire_id"]], r["outcome"]) for r in records)
    assert set(got) == {("ok", "ok"), ("never_answer", "timeout")}, got
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["metrics"]["requests"]["cancelled"] == 0
    assert "timeout" in run["verdict"]["reasons"][0], run["verdict"]["reasons"]


def test_a_used_run_folder_is_refused_or_replaced_never_appended_to(tmp_path: Path) -> None:
    with FaultServer(["ok"]) as srv:
        code, log, first = _run(tmp_path, srv.base_url)
        assert code == 0 and first, log[-2000:]
        code, log, _ = _run(tmp_path, srv.base_url)
        assert code == 2 and "already holds a run" in log and "--force" in log
        code, log, second = _run(tmp_path, srv.base_url, "--force")
    assert code == 0, log[-2000:]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    ids = [r["wire_id"] for r in second]
    assert len(ids) == len(set(ids)) == run["metrics"]["requests"]["completed"]  # this run's records only
    assert not {r["wire_id"] for r in first} & set(ids)


@pytest.mark.parametrize("limit", [["--read-timeout", "1"], ["--total-timeout", "1"]])
def test_a_timeout_is_a_timeout_before_or_after_the_headers(tmp_path: Path, limit: list[str]) -> None:
    """One class per cause (docs/metrics.md): the endpoint too slow is `timeout`, whatever the phase."""
    with FaultServer(["ok", "never_answer", "stall_after_headers"]) as srv:
        code, log, records = _run(tmp_path, srv.base_url, *limit)
        truth = dict(srv.truth)
    assert code == 12, log[-2000:]
    got = {(truth[r["wire_id"]], r["outcome"]) for r in records}
    assert got == {("ok", "ok"), ("never_answer", "timeout"), ("stall_after_headers", "timeout")}, got


def test_the_open_loop_connection_pool_shrinks_after_a_backlog(tmp_path: Path) -> None:
    """A burst opens many connections; once the load falls, idle ones beyond a few spare are closed."""
    stages = [{"duration_s": 2, "rate": 150}, {"duration_s": 8, "rate": 2}]
    prof = write_profile(
        tmp_path / "p.yaml",
        load={"arrival": "constant", "stages": stages},
        output_tokens={"dist": "fixed", "value": 64},
    )
    out = tmp_path / "out"
    with SimProcess(speedup=2, max_num_seqs=32) as sim:  # a small batch: the burst queues, so it piles up
        proc = subprocess.Popen(
            [*CLI, "run", "--profile", str(prof), "--host", sim.base_url, "--out", str(out)]
        )
        try:
            peak = late = 0
            t0 = None  # the first request's connection: the schedule's start (the run's own start-up, which
            # a busy machine stretches, does not count)
            while proc.poll() is None:
                n = sum(1 for fd in Path(f"/proc/{proc.pid}/fd").iterdir() if "socket" in _link(fd))
                if n and t0 is None:
                    t0 = time.monotonic()
                peak = max(peak, n)
                if t0 is not None and time.monotonic() - t0 > 6.0:  # the burst (2 s) long answered
                    late = max(late, n)
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    print(f"connections: peak {peak}, after the burst {late}")
    assert peak > 45, peak  # the burst really needed many connections (a kept pool stays at its peak)
    assert late < peak - 25, (peak, late)  # and they did not stay open through the calm stage


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:
        return ""
