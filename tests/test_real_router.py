"""Recorded agent sessions through vllm-router in front of two real vLLM engines: session affinity by X-Session-ID.

The shipped cc-traces sample is replayed through the router with loadtest's session header on every call.
With the router's consistent-hash policy every call of one conversation lands on one replica (each
engine's own request log names the X-Request-Id of every request it received) and both replicas get
conversations; with round robin, the calls of a conversation are split. ``--metrics-url r1,r2`` gives
each replica's own figures side by side (run.json ``telemetry.replicas``, the report's replica table).
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_engines import (
    CLI,
    ROOT,
    ServedVllm,
    VllmRouter,
    agent_trace_profile,
    engine_python,
    pid_alive,
    run_load,
)
from summary_sections import add_lines

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServedVllm]]:
    """Two vLLM CPU engines, started side by side, logging the id of every request they receive."""
    engine_python("router")  # skips, saying how to install it, before any engine starts
    model = tmp_path_factory.mktemp("tiny-llama") / "tiny-llama"
    subprocess.run([*CLI[:1], str(ROOT / "servers" / "tiny_llama.py"), str(model)], check=True, timeout=120)
    served = [
        ServedVllm(model, tmp_path_factory.mktemp(f"vllm{i}"), extra_args="--enable-log-requests")
        for i in (1, 2)
    ]
    try:
        for s in served:
            s.wait_ready()
        yield served
    finally:
        for s in served:
            s.stop()
    pids = [p["pid"] for s in served for p in s.server.get("processes", [])]
    assert len(pids) == 2 and not any(pid_alive(p) for p in pids), "a vLLM outlived its launcher"


def _replay(
    replicas: list[ServedVllm], policy: str, tmp: Path, duration_s: int
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, set[int]]]:
    """The sample replayed through the router with ``policy``: run.json, the records, and per
    conversation (its session id) the replicas whose own log received its calls."""
    before = [set(r.received()) for r in replicas]
    with VllmRouter([r.url for r in replicas], policy, tmp / "router.log") as router:
        metrics = ",".join(r.url + "/metrics" for r in replicas)
        res, run, records = run_load(
            [
                "--profile",
                str(agent_trace_profile(tmp / "p.json", duration_s, 2)),
                "--host",
                router.url,
                "--metrics-url",
                metrics,
            ],
            tmp / "o",
            env={"LOADTEST_STATE_DIR": str(replicas[0].state_dir)},
        )
        router_log = router.tail()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + router_log
    received = [set(r.received()) - b for r, b in zip(replicas, before, strict=True)]
    by_session: dict[str, set[int]] = defaultdict(set)
    for rec in records:
        assert rec["outcome"] == "ok", (rec["outcome"], rec["error"])
        on = [i for i, ids in enumerate(received) if rec["wire_id"] in ids]
        assert len(on) == 1, (rec["wire_id"], on)  # one engine received it, exactly once
        by_session[rec["session"]].add(on[0])
    return run, records, by_session


def test_consistent_hash_keeps_every_conversation_on_one_replica(
    replicas: list[ServedVllm], tmp_path: Path
) -> None:
    run, records, by_session = _replay(replicas, "consistent_hash", tmp_path, 20)
    calls = defaultdict(int)
    for rec in records:
        calls[rec["session"]] += 1
    assert len(by_session) >= 4 and max(calls.values()) >= 9  # whole recorded conversations went through
    assert all(len(on) == 1 for on in by_session.values()), dict(by_session)
    assert {next(iter(on)) for on in by_session.values()} == {0, 1}, dict(by_session)  # both got some
    # each replica's own figures: its finished requests are the calls its log received (within the
    # requests in flight when the first and the last poll were taken)
    tel = run["telemetry"]
    assert "mixed_instances" not in tel
    per = tel["replicas"]
    assert [p["url"] for p in per] == [r.url + "/metrics" for r in replicas]
    for i, p in enumerate(per):
        mine = sum(calls[s] for s, on in by_session.items() if on == {i})
        assert mine - 2 <= p["requests"] <= mine + 1, (p, mine)  # + the preflight, on one of them
        assert p["prefix_cache_hit_rate"] > 0.2 and p["generation_tokens_per_s"] > 0, p
    assert not any("warm prefix cache" in n for n in run["notes"])  # recorded reuse is expected reuse
    html = (tmp_path / "o" / "report.html").read_text()
    assert 'id="replica-table"' in html and replicas[1].url in html
    lines = [
        "vllm-router consistent_hash: conversations per replica "
        + ", ".join(f"r{i + 1} {sum(on == {i} for on in by_session.values())}" for i in range(2)),
        "vllm-router consistent_hash: requests per replica (their /metrics) "
        + ", ".join(
            f"r{i + 1} {p['requests']} (prefix-cache hit {p['prefix_cache_hit_rate']:.2f})"
            for i, p in enumerate(per)
        ),
    ]
    add_lines("real engines", lines)
    print("\n" + "\n".join(lines))


def test_round_robin_splits_the_calls_of_a_conversation(replicas: list[ServedVllm], tmp_path: Path) -> None:
    run, records, by_session = _replay(replicas, "round_robin", tmp_path, 8)
    split = [s for s, on in by_session.items() if len(on) == 2]
    assert split, dict(by_session)  # the control: without a session policy, conversations are split
    per = run["telemetry"]["replicas"]
    assert all(p["requests"] > 0 for p in per)
    lines = [
        f"vllm-router round_robin: {len(split)} of {len(by_session)} conversations split over both replicas"
    ]
    add_lines("real engines", lines)
    print("\n" + "\n".join(lines))
