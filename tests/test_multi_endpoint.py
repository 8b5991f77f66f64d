"""Several endpoints in one run: per-endpoint breakdown, a faulty replica named in the verdict, sticky sessions."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from conftest import read_lines, run_cli, write_profile

from loadtest.client.balancer import Balancer, read_hosts_file, session_slot
from loadtest.client.openai import PreparedRequest
from loadtest.sim import SimProcess


def _req(session: str | None = None) -> PreparedRequest:
    return PreparedRequest("r", "chat", {}, 1, session=session)


def test_balancer_modes() -> None:
    rr = Balancer(3, "round-robin")
    assert [rr.pick(_req()) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    lo = Balancer(3, "least-outstanding")
    lo.outstanding[:] = [4, 0, 2]
    assert lo.pick(_req()) == 1
    st = Balancer(3, "session")
    picks = {st.pick(_req("chat-7")) for _ in range(5)}
    assert picks == {session_slot("chat-7", 3)}


def test_hosts_file_errors(tmp_path: Path) -> None:
    f = tmp_path / "hosts.txt"
    f.write_text("# replicas\nhttp://a:1\n\nhttp://b:2  # second\n")
    assert read_hosts_file(f) == ["http://a:1", "http://b:2"]
    f.write_text("# nothing\n")
    res = run_cli(["run", "--hosts-file", str(f), "--duration", "1", "--out", str(tmp_path / "o")])
    assert res.returncode == 2 and "no URL in it" in res.stderr


def test_three_replicas_one_faulty(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 6}, duration_s=3)
    out = tmp_path / "run"
    sims = [SimProcess(speedup=20, seed=i, faults="http_503=100%" if i == 2 else None) for i in range(3)]
    try:
        for s in sims:
            s.start()
        hosts_file = tmp_path / "hosts.txt"
        hosts_file.write_text(sims[2].base_url + "\n")
        args = ["run", "--profile", str(prof), "--host", sims[0].base_url, "--host", sims[1].base_url]
        args += ["--hosts-file", str(hosts_file), "--out", str(out)]
        res = run_cli(args, timeout=120)
        served = [s.stats()["requests_received"] for s in sims]
    finally:
        for s in sims:
            s.stop()
    assert res.returncode in (0, 10, 11, 12), res.stderr
    run = json.loads((out / "run.json").read_text())
    per = run["metrics"]["per_endpoint"]
    assert [e["url"] for e in per["endpoints"]] == [s.base_url for s in sims]
    rows = per["endpoints"]
    assert rows[2]["error_rate"] == 1.0 and rows[0]["error_rate"] == 0.0 and rows[1]["error_rate"] == 0.0
    assert rows[0]["ok"] > 0 and rows[1]["ok"] > 0  # the others carry on
    assert rows[2]["by_outcome"] == {"http_5xx": rows[2]["requests"]}
    assert all(r["requests"] > 0 for r in rows) and per["imbalance"] >= 1.0
    named = [r for r in run["verdict"]["reasons"] if r.startswith("replica 2 ")]
    assert named and sims[2].base_url in named[0]
    assert not any(r.startswith(("replica 0 ", "replica 1 ")) for r in run["verdict"]["reasons"])
    check = next(c for c in run["verdict"]["checks"] if c["name"] == "replica_2_errors")
    assert check["passed"] is False and check["blocking"] is False
    lines = read_lines(sorted(out.glob("records*.jsonl")))
    counts = defaultdict(int)
    for ln in lines:
        counts[ln["endpoint"]] += 1
    assert [counts[i] for i in range(3)] == [r["requests"] for r in rows]
    # every request the client sent reached the replica its record names (the server counts agree)
    assert served == [counts[i] for i in range(3)]
    html = (out / "report.html").read_text()
    assert 'id="endpoints"' in html and sims[2].base_url in html
    # telemetry sums every replica's /metrics
    assert run["telemetry"]["url"].split(",") == [s.base_url + "/metrics" for s in sims]


def test_sticky_sessions(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "mt.yaml",
        kind="multi_turn",
        input_tokens={"dist": "fixed", "value": 32},
        output_tokens={"dist": "fixed", "value": 8},
        session={"turns": {"dist": "fixed", "value": 3}, "think_time_s": {"dist": "fixed", "value": 0.0}},
        load={"concurrency": 6},
        duration_s=3,
    )
    out = tmp_path / "run"
    sims = [SimProcess(speedup=20, seed=i) for i in range(3)]
    try:
        for s in sims:
            s.start()
        args = ["run", "--profile", str(prof), "--balance", "session", "--out", str(out), "--no-telemetry"]
        for s in sims:
            args += ["--host", s.base_url]
        res = run_cli(args, timeout=120)
    finally:
        for s in sims:
            s.stop()
    assert res.returncode in (0, 10, 11), res.stderr
    lines = read_lines(sorted(out.glob("records*.jsonl")))
    by_session: dict[str, set[int]] = defaultdict(set)
    for ln in lines:
        by_session[ln["id"].rsplit(".", 1)[0]].add(ln["endpoint"])
    multi = [k for k in by_session if sum(ln["id"].startswith(k + ".") for ln in lines) > 1]
    assert len(multi) >= 3  # sessions with several turns happened
    assert all(len(v) == 1 for v in by_session.values())  # every turn of a session on one replica
    assert len({next(iter(v)) for v in by_session.values()}) >= 2  # sessions spread over replicas
    run = json.loads((out / "run.json").read_text())
    assert run["endpoint"]["balance"] == "session" and len(run["endpoint"]["replicas"]) == 3
