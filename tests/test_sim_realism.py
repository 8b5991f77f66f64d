"""The embedded engine against real use: agents' prompts cached where templates put tools, agent
turns that end in a plain answer, token counters that move while requests run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from loadtest.client.record import RequestRecord
from loadtest.profile.loader import load_profile
from loadtest.sim import SimProcess
from loadtest.workload.builder import Workload
from tests.conftest import read_lines, run_cli, write_profile


def test_the_shipped_agent_profile_is_mostly_cached_and_its_turns_end_in_answers(tmp_path: Path) -> None:
    """long-context-agent on its own embedded engine: the 20k-token system + tools head and the
    conversation are a prefix-cache hit (tools rendered in the head as Llama 3.1's template does;
    after the conversation they were re-prefilled every call: 49 % cached); a turn's last call is
    answered in text, the others with tool calls."""
    out = tmp_path / "agent"
    res = run_cli(
        ["run", "--profile", "long-context-agent", "--duration", "20s", "--out", str(out)], timeout=240
    )
    assert res.returncode in (0, 11), res.stderr  # 11: too few samples for the p99 SLOs in 20 s
    run = json.loads((out / "run.json").read_text())
    assert run["prefix_cache"]["hit_rate"] >= 0.85, run["prefix_cache"]
    tok = run["metrics"]["tokens"]
    assert tok["usage_cached_total"] >= 0.85 * tok["usage_input_total"]
    recs = [r for r in read_lines([out / "records.jsonl"]) if r["outcome"] == "ok"]
    reasons = Counter(r["finish_reason"] for r in recs)
    assert reasons["tool_calls"] > 0 and reasons["length"] > 0, reasons  # plain answers (ignore_eos)


def test_an_agent_turns_last_call_asks_for_a_text_answer() -> None:
    """Every call but a turn's last leaves the model free to call a tool; the last says tool_choice
    "none" (its tools still in the prompt, so the cached head stays), and the next call is a new turn."""
    profile, _ = load_profile("long-context-agent")
    unit = Workload(profile).unit(0)
    step, calls = unit.next(None), []
    while step is not None:
        body = step.request.body
        calls.append((body.get("tool_choice"), body["messages"][-1]["role"], "tools" in body))
        plain = body.get("tool_choice") == "none"
        answer = RequestRecord(request_id="r", outcome="ok")
        answer.answer_text, answer.tool_calls_text = ("done.", "") if plain else ("", '{"path": "a"}')
        step = unit.next(answer)
    assert all(has_tools for _, _, has_tools in calls)
    lasts = [k for k, (choice, _, _) in enumerate(calls) if choice == "none"]
    assert lasts and lasts[-1] == len(calls) - 1  # the session ends with an answer
    for k, (choice, role, _) in enumerate(calls):
        assert (role == "user") == (k == 0 or k - 1 in lasts), (k, calls)  # a new turn after each answer
        assert choice in (None, "none")


def test_generation_tokens_per_s_is_non_zero_while_long_requests_run(tmp_path: Path) -> None:
    """Two requests of 600 tokens outlast the 3 s load: the server's tokens/s series reads the engine's
    decoding every second, not 0 until a request completes (vLLM counts tokens per step)."""
    prof = write_profile(
        tmp_path / "p.yaml",
        output_tokens={"dist": "fixed", "value": 600},
        ignore_eos=True,
        load={"concurrency": 2},
        duration_s=3,
    )
    with SimProcess(speedup=1) as sim:
        res = run_cli(["run", "--profile", str(prof), "--host", sim.base_url, "--out", str(tmp_path / "o")])
    assert res.returncode == 0, res.stderr
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    records = [json.loads(x) for x in (tmp_path / "o" / "records.jsonl").read_text().splitlines()]
    first_done_s = min(r["e2e_us"] for r in records) / 1e6
    series = run["telemetry"]["series"]
    rates = series["generation_tokens_per_s"]
    assert first_done_s > 3.0  # no request completed during the load
    assert len(rates) >= 2 and all(r > 100 for r in rates), rates  # two streams decoding, each second
    assert series["prompt_tokens_per_s"][0] > 0  # the prompts count at their first token, not at the end
