"""The session header: every call of a multi-turn chat or an agent carries its session's id, so a
session-aware router can keep the conversation on one replica."""

from __future__ import annotations

import json
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from loadtest.profile.loader import ProfileError, load_profile
from loadtest.sim import SimProcess
from tests.conftest import read_lines, run_cli, write_profile

SESSION = {"turns": {"dist": "fixed", "value": 3}, "think_time_s": {"dist": "fixed", "value": 0.0}}
AGENT = {
    "prefix_tokens": 120,
    "tools": 2,
    "turns": {"dist": "fixed", "value": 2},
    "calls_per_turn": {"dist": "fixed", "value": 2},
    "tool_result_tokens": {"dist": "fixed", "value": 16},
    "think_time_s": {"dist": "fixed", "value": 0},
}


def _engine_log(sim: SimProcess) -> dict[str, dict[str, str]]:
    """The engine's request log: each chat request's headers, by the X-Request-Id it carried."""
    with urllib.request.urlopen(sim.base_url + "/sim/requests", timeout=10) as r:
        items = json.load(r)
    return {
        it["headers"]["x-request-id"]: it["headers"]
        for it in items
        if it["path"].endswith("/chat/completions") and "x-request-id" in it["headers"]
    }


def _run(sim: SimProcess, prof: Path, out: Path, *extra: str) -> list[dict[str, Any]]:
    res = run_cli(
        ["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(out), "--no-telemetry"]
        + ["--max-requests", "6", "--concurrency", "3", *extra],
        timeout=120,
    )
    assert res.returncode in (0, 10), res.stderr[-2000:]
    return [ln for ln in read_lines(sorted(out.glob("records*.jsonl"))) if ln.get("wire_id")]


def _sessions(records: list[dict[str, Any]], log: dict[str, dict[str, str]], header: str) -> dict[str, set]:
    """Each session of the records (its calls' ids up to the last dot) → the header values the engine saw."""
    seen: dict[str, set] = defaultdict(set)
    for rec in records:
        seen[rec["id"].rsplit(".", 1)[0]].add(log[rec["wire_id"]].get(header))
    return seen


@pytest.mark.parametrize(
    ("scenario", "option", "header"),
    [
        ({"kind": "multi_turn", "session": SESSION}, [], "x-session-id"),
        ({"kind": "agent", "agent": AGENT}, ["--session-header", "X-Conversation"], "x-conversation"),
    ],
)
def test_every_call_of_a_session_carries_its_id(
    tmp_path: Path, scenario: dict[str, Any], option: list[str], header: str
) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        input_tokens={"dist": "fixed", "value": 24},
        output_tokens={"dist": "fixed", "value": 6},
        **scenario,
    )
    with SimProcess(speedup=20) as sim:
        records = _run(sim, prof, tmp_path / "run", *option)
        log = _engine_log(sim)
    assert records and all(rec["wire_id"] in log for rec in records)
    seen = _sessions(records, log, header)
    assert len(seen) == 6  # every session the run issued
    assert all(len(v) == 1 for v in seen.values())  # one id on every call of a session ...
    ids = [next(iter(v)) for v in seen.values()]
    assert None not in ids and len(set(ids)) == len(ids)  # ... and a different one per session
    assert all(sid == session for session, sid in zip(seen, ids, strict=True))  # the session's own name
    assert sum(len([r for r in records if r["id"].startswith(s + ".")]) for s in seen) == len(records)
    assert max(len([r for r in records if r["id"].startswith(s + ".")]) for s in seen) > 1  # several calls


def test_none_sends_no_session_header_and_a_bad_name_is_a_usage_error(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", kind="multi_turn", session=SESSION)
    with SimProcess(speedup=20) as sim:
        records = _run(sim, prof, tmp_path / "run", "--session-header", "none")
        log = _engine_log(sim)
    assert records and not any("x-session-id" in log[rec["wire_id"]] for rec in records)
    res = run_cli(
        ["run", "--profile", str(prof), "--session-header", "bad name", "--out", str(tmp_path / "x")]
    )
    assert res.returncode == 2
    assert "--session-header" in res.stderr and "'bad name' is not a valid HTTP header name" in res.stderr


def test_the_profile_names_the_header_or_none(tmp_path: Path) -> None:
    prof, _ = load_profile(str(write_profile(tmp_path / "a.yaml", request={"session_header": None})))
    assert prof.request.session_header is None
    prof, _ = load_profile(str(write_profile(tmp_path / "b.yaml")))
    assert prof.request.session_header == "X-Session-ID"
    with pytest.raises(ProfileError, match="session_header") as err:
        load_profile(str(write_profile(tmp_path / "c.yaml", request={"session_header": "Host"})))
    assert "c.yaml" in str(err.value) and "null for none" in str(err.value)
