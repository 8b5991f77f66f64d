"""Recorded agent sessions replayed with AgentX's options against the embedded engine: t* (each conversation
starts at a sampled parent call, its recorded input carrying the earlier context), first-turn cache busting
(no cached prefix shared across replays of one recording), and open loop by conversation arrivals."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from loadtest.sim import SimProcess
from loadtest.traces.cctraces import read_cc_conversations
from loadtest.workload.agent_replay import start_call
from tests.conftest import read_lines, run_cli

SAMPLE = Path(__file__).resolve().parents[1] / "traffic_profiles" / "traces" / "cc-traces-sample.jsonl"
SPEEDUP = 4.0


def _replay(tmp: Path, load: dict[str, Any], duration_s: int, **spec: Any) -> dict[str, Any]:
    """One replay of the sample against a fresh engine (a prefix cache that evicts nothing): the record
    lines, the engine's truth by record id, run.json."""
    prof = tmp / "p.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": "agentx-options",
                "api": "chat",
                "duration_s": duration_s,
                "load": load,
                "judging": {"generator_health": "warn"},
                "scenarios": [
                    {
                        "name": "cc",
                        "kind": "agent_trace",
                        "agent_trace": {"path": str(SAMPLE), "speedup": SPEEDUP, **spec},
                    }
                ],
            }
        )
    )
    out = tmp / "run"
    with SimProcess(gpu="H200", speedup=20, extra_args=["--kv-blocks", "400000"]) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(out)], timeout=180)
        truth = sim.truth()
    assert res.returncode in (0, 10), res.stderr[-3000:]
    lines = read_lines(sorted(out.glob("records*.jsonl")))
    by_wire = {t["request_id"]: t for t in truth}
    return {
        "lines": lines,
        "truth": {r["id"]: by_wire[r["wire_id"]] for r in lines if r["wire_id"] in by_wire},
        "run": json.loads((out / "run.json").read_text()),
    }


def _units(lines: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    by: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in lines:
        by[int(r["id"].split(".", 1)[0].rsplit("-", 1)[1])].append(r)
    return by


def test_t_star_starts_each_conversation_at_its_sampled_call_with_the_recorded_prefix(tmp_path: Path) -> None:
    convs = read_cc_conversations(SAMPLE)
    got = _replay(tmp_path, {"concurrency": 2}, 6, start="sampled")
    units = _units(got["lines"])
    starts = {u: start_call(convs[u % len(convs)], "cc", u) for u in units}
    assert any(k > 0 for k in starts.values()), starts  # the draw moved some starts off the beginning
    checked = 0
    for u, recs in units.items():
        conv, k = convs[u % len(convs)], starts[u]
        first = got["truth"].get(f"cc-{u}.0")
        if first is None:
            continue
        # The first call is the sampled one: its recorded input, the earlier context included.
        assert first["prompt_tokens"] == conv.parent_calls[k].input_tokens, (u, k)
        assert first["completion_tokens"] == conv.parent_calls[k].output_tokens, (u, k)
        parent = [r for r in recs if ".a" not in r["id"]]
        if any(r.get("session_last") for r in recs) and all(r["outcome"] == "ok" for r in recs):
            assert len(parent) == len(conv.parent_calls) - k, (u, k)  # the rest, from there on
        checked += 1
    assert checked >= 2
    assert got["run"]["conversations"]["started"] == len(units)  # each unit one conversation


@pytest.mark.parametrize("bust", [True, False])
def test_first_turn_cache_busting_shares_no_prefix_across_replays_of_one_recording(
    tmp_path: Path, bust: bool
) -> None:
    """One conversation at a time: unit 2 replays unit 0's recorded session after it ended. Busted, no
    first call finds a cached prefix of another conversation; without, the replay's first call finds
    the earlier replay's whole prompt cached."""
    got = _replay(tmp_path, {"concurrency": 1}, 8, cache_bust_first_turn=bust)
    firsts = {u: got["truth"][f"cc-{u}.0"] for u in _units(got["lines"]) if f"cc-{u}.0" in got["truth"]}
    assert {0, 1, 2} <= set(firsts), sorted(firsts)
    again = [u for u in firsts if u >= 2]  # a second replay of a recorded session
    cached = {u: firsts[u]["cached_tokens"] for u in again}
    print("first calls' cached tokens", {u: f["cached_tokens"] for u, f in firsts.items()})
    if bust:
        assert all(f["cached_tokens"] == 0 for f in firsts.values()), cached
    else:
        assert all(cached[u] >= 0.9 * firsts[u]["prompt_tokens"] for u in again), cached


def test_open_loop_starts_one_conversation_per_arrival_and_later_calls_follow_their_delays(
    tmp_path: Path,
) -> None:
    convs = read_cc_conversations(SAMPLE)
    rate, duration = 1.5, 6
    got = _replay(tmp_path, {"rate": rate, "arrival": "constant"}, duration)
    units = _units(got["lines"])
    # One conversation per arrival: each unit's first call at its own scheduled time, 1 / rate apart.
    first_t = sorted(
        next(r["t"] for r in recs if r["id"].endswith(".0") and ".a" not in r["id"])
        for recs in units.values()
    )
    gaps = [b - a for a, b in zip(first_t, first_t[1:], strict=False)]
    assert len(first_t) >= rate * duration - 2, len(first_t)
    assert all(abs(g - 1 / rate) < 0.25 for g in gaps), gaps
    assert got["run"]["conversations"]["started"] == len(units)
    # Later parent calls follow their recorded delays (sped up) after the previous one ended, not the
    # arrival schedule.
    waited = 0
    for u, recs in units.items():
        conv = convs[u % len(convs)]
        by_id = {r["id"]: r for r in recs}
        for k in range(1, len(conv.parent_calls)):
            cur, prev = by_id.get(f"cc-{u}.{k}"), by_id.get(f"cc-{u}.{k - 1}")
            step = conv.steps.index(conv.parent_calls[k])
            if (
                cur is None
                or prev is None
                or not isinstance(conv.steps[step - 1], type(conv.parent_calls[k]))
            ):
                continue  # not sent, or waited from a fan-out's join
            gap = cur["t"] - (prev["t"] + prev["e2e_us"] / 1e6)
            assert gap >= 0.9 * conv.parent_calls[k].delay_before_s / SPEEDUP, (u, k, gap)
            waited += 1
    assert waited >= 3
