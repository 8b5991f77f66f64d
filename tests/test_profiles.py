"""Traffic profiles: schema errors name file and key path, flat == list form, loader fuzz, the CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.profile.loader import ProfileError, load_profile, shipped_profiles
from loadtest.profile.schema import Empirical, Profile
from tests.conftest import run_cli

FIXED = {"dist": "fixed", "value": 16}
SESSION = {"turns": {"dist": "uniform", "min": 1, "max": 4}, "think_time_s": {"dist": "fixed", "value": 2}}
AGENT = {
    "prefix_tokens": 20000,
    "turns": {"dist": "fixed", "value": 3},
    "calls_per_turn": {"dist": "uniform", "min": 2, "max": 10},
    "tool_result_tokens": {"dist": "lognormal", "median": 400, "sigma": 1.0},
    "think_time_s": {"dist": "empirical", "points": [[0, 0.5], [0.5, 2], [1, 30]]},
}


def chat(name: str, **kw: Any) -> dict[str, Any]:
    """A valid chat scenario."""
    return {"name": name, "input_tokens": FIXED, "output_tokens": FIXED, **kw}


def full_profile() -> dict[str, Any]:
    """A valid list-form profile using most features."""
    return {
        "name": "mix",
        "description": "every kind",
        "source": "docs/sources.md §6",
        "load": {"rate": 4, "arrival": "gamma", "cv": 2.0, "max_in_flight": 64},
        "slos": {"ttft_p99": "2s", "tpot_p99": "80ms", "error_rate": "0.5%", "e2e_p99.9": "12s"},
        "scenarios": [
            chat("chat", weight=3, salt=True, system_prompt_tokens=64, prefix={"groups": 4, "tokens": 512}),
            chat("multi", kind="multi_turn", session=SESSION, images={"count": 2, "detail": "low"}),
            chat("agent", kind="agent", agent=AGENT, reasoning=True),
            {
                "name": "emp",
                "input_tokens": {
                    "dist": "empirical",
                    "points": [[0, 10], [0.5, 1020], [0.9, 2735], [1, 8000]],
                },
                "output_tokens": {"dist": "normal", "mean": 100, "std": 20, "max": 300},
            },
        ],
    }


def write(tmp_path: Path, data: Any, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    return str(e.value)


FLAT = {"name": "flat", "input_tokens": FIXED, "output_tokens": FIXED, "load": {"concurrency": 2}}

# (case, profile data or raw YAML text, key path expected in the message, another expected fragment)
BROKEN: list[tuple[str, Any, str, str]] = [
    ("unknown_key", {**FLAT, "bogus": 1}, "  bogus: unknown key", "allowed keys here: name,"),
    (
        "unknown_nested_key",
        {**FLAT, "load": {"concurrency": 2, "speed": 1}},
        "load.speed:",
        "concurrency, rate",
    ),
    ("bad_dist", {**FLAT, "output_tokens": {"dist": "gamma", "k": 2}}, "output_tokens:", "fixed, uniform"),
    ("missing_output", {"name": "x", "input_tokens": FIXED}, "output_tokens:", "required for kind chat"),
    (
        "missing_output_list",
        {"name": "x", "scenarios": [chat("a"), {"name": "b", "input_tokens": FIXED}]},
        "scenarios[1].output_tokens:",
        "required",
    ),
    ("gamma_without_cv", {**FLAT, "load": {"rate": 2, "arrival": "gamma"}}, "load.cv:", "needs cv"),
    ("cv_with_poisson", {**FLAT, "load": {"rate": 2, "cv": 1.5}}, "load.cv:", "gamma only"),
    ("two_modes", {**FLAT, "load": {"concurrency": 2, "rate": 3}}, "load:", "exactly one load mode"),
    (
        "stages_mixed",
        {**FLAT, "load": {"stages": [{"duration_s": 5, "rate": 1}, {"duration_s": 5, "concurrency": 2}]}},
        "load.stages[1]:",
        "same mode",
    ),
    (
        "stage_two_levels",
        {**FLAT, "load": {"stages": [{"duration_s": 5, "rate": 1, "concurrency": 2}]}},
        "load.stages[0]:",
        "exactly one",
    ),
    (
        "duplicate_names",
        {"name": "x", "scenarios": [chat("a"), chat("a")]},
        "scenarios[1].name:",
        "used twice",
    ),
    (
        "multi_turn_no_session",
        {"name": "x", "scenarios": [chat("a"), chat("b", kind="multi_turn")]},
        "scenarios[1].session:",
        "needs session",
    ),
    (
        "bad_session_dist",
        {
            "name": "x",
            "scenarios": [
                chat("a"),
                chat(
                    "b",
                    kind="multi_turn",
                    session={**SESSION, "turns": {"dist": "lognormal", "median": -1, "sigma": 1}},
                ),
            ],
        },
        "scenarios[1].session.turns.median:",
        "greater than 0",
    ),
    (
        "agent_no_agent",
        {"name": "x", "scenarios": [chat("a", kind="agent")]},
        "scenarios[0].agent:",
        "needs agent",
    ),
    (
        "empirical_not_increasing",
        {**FLAT, "input_tokens": {"dist": "empirical", "points": [[0, 1], [0.5, 9], [0.5, 10], [1, 11]]}},
        "input_tokens.points[2][0]:",
        "strictly increasing",
    ),
    (
        "empirical_not_ending_at_1",
        {**FLAT, "input_tokens": {"dist": "empirical", "points": [[0, 1], [0.9, 9]]}},
        "input_tokens.points:",
        "last 1",
    ),
    (
        "empirical_values_down",
        {**FLAT, "input_tokens": {"dist": "empirical", "points": [[0, 5], [1, 4]]}},
        "input_tokens.points[1][1]:",
        "non-decreasing",
    ),
    ("bad_slo_key", {**FLAT, "slos": {"TTFT-p99": "2s"}}, "slos.TTFT-p99:", "not an SLO key"),
    ("bad_slo_value", {**FLAT, "slos": {"ttft_p99": "2 parsecs"}}, "slos.ttft_p99:", "is not a duration"),
    (
        "trace_kind_without_trace",
        {"name": "x", "scenarios": [{"name": "t", "kind": "trace"}]},
        "scenarios[0].kind:",
        "needs load.trace",
    ),
    (
        "completions_images",
        {"name": "x", "api": "completions", "scenarios": [chat("a", images={})]},
        "scenarios[0].images:",
        "completions",
    ),
    ("both_forms", {**FLAT, "scenarios": [chat("a")]}, "input_tokens:", "not both"),
    (
        "speedup_and_rate",
        {**FLAT, "load": {"trace": {"path": "t.csv", "speedup": 2, "target_rate": 3}}},
        "load.trace.target_rate:",
        "at most one",
    ),
    (
        "wrong_type_deep",
        {"name": "x", "scenarios": [chat("a", prefix={"groups": "many", "tokens": 4})]},
        "scenarios[0].prefix.groups:",
        "valid integer",
    ),
    (
        "scenario_not_mapping",
        {"name": "x", "scenarios": [chat("a"), 5]},
        "scenarios[1]:",
        "expected a mapping",
    ),
    ("yaml_syntax", "name: x\nload: {concurrency: 2\n", "line 3", "not valid YAML"),
    ("non_mapping", "- name: x\n- load: 3\n", "top level is a list", "mapping"),
    ("empty", "", "file is empty", "mapping"),
    ("comments_only", "# nothing here\n", "file is empty", "mapping"),
]


@pytest.mark.parametrize(("case", "data", "where", "what"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_profiles_name_file_key_path_and_fix(
    tmp_path: Path, case: str, data: Any, where: str, what: str
) -> None:
    path = write(tmp_path, data, f"{case}.yaml")
    msg = error_of(path)
    assert msg.startswith(str(path)), msg
    assert where in msg and what in msg, msg
    assert msg.rstrip().endswith("see docs/profiles.md"), msg


def test_flat_form_equals_list_form(tmp_path: Path) -> None:
    flat = {**FLAT, "system_prompt_tokens": 32, "ignore_eos": False, "salt": True}
    listed = {
        "name": "flat",
        "load": {"concurrency": 2},
        "scenarios": [chat("flat", system_prompt_tokens=32, ignore_eos=False, salt=True)],
    }
    a, _ = load_profile(str(write(tmp_path, flat, "a.yaml")))
    b, _ = load_profile(str(write(tmp_path, listed, "b.yaml")))
    assert a == b
    sc = a.scenarios[0]
    assert sc.system_prompt_tokens == 32 and not sc.ignore_eos and sc.salt


def test_full_profile_defaults_weights_and_lookup(tmp_path: Path) -> None:
    prof, _ = load_profile(str(write(tmp_path, full_profile())))
    assert prof.scenario_weights() == pytest.approx(
        {"chat": 0.5, "multi": 1 / 6, "agent": 1 / 6, "emp": 1 / 6}
    )
    assert prof.scenario("agent").agent.max_context_tokens == 131072
    assert prof.scenario("multi").images.width == 512
    with pytest.raises(KeyError):
        prof.scenario("nope")
    assert Profile.model_validate(prof.model_dump(mode="json")) == prof  # `profiles show` output round-trips


def test_load_modes_and_trace_path_resolution(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    trace = {"path": "traces/conv.csv", "format": "azure", "window_s": [0, 600], "target_rate": 5}
    data = {"name": "t", "load": {"trace": trace}, "scenarios": [{"name": "replay", "kind": "trace"}]}
    prof, _ = load_profile(str(write(tmp_path / "sub", data)))
    assert prof.load.trace.path == str((tmp_path / "sub" / "traces" / "conv.csv").resolve())
    assert prof.load.mode == "trace"
    stages = [{"duration_s": 10, "rate": 1}, {"duration_s": 30, "rate": 8, "ramp": True}]
    prof, _ = load_profile(str(write(tmp_path, {**FLAT, "load": {"stages": stages, "arrival": "constant"}})))
    assert prof.load.mode == "rate" and prof.load.stages[1].ramp
    prof, _ = load_profile(
        str(write(tmp_path, {**FLAT, "load": {"stages": [{"duration_s": 5, "concurrency": 4}]}}))
    )
    assert prof.load.mode == "concurrency"


def test_empirical_interpolates() -> None:
    e = Empirical(dist="empirical", points=[(0, 10), (0.5, 100), (1, 1000)])
    assert [e.quantile(u) for u in (0, 0.25, 0.5, 0.75, 1)] == [10, 55, 100, 550, 1000]


def test_shipped_profiles_validate() -> None:
    assert shipped_profiles()
    for name in shipped_profiles():
        prof, _ = load_profile(name)
        assert prof.scenarios


def test_missing_and_unknown_profile() -> None:
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile("/nonexistent/p.yaml")
    with pytest.raises(ProfileError, match="unknown profile 'no-such-name'"):
        load_profile("no-such-name")


# --- fuzz: whatever the YAML holds, the loader answers with a Profile or a ProfileError ---

KEYS = st.sampled_from(
    [
        "name",
        "load",
        "scenarios",
        "dist",
        "value",
        "points",
        "rate",
        "concurrency",
        "stages",
        "trace",
        "kind",
        "session",
        "agent",
        "turns",
        "input_tokens",
        "output_tokens",
        "slos",
        "cv",
        "arrival",
        "weight",
        "images",
        "prefix",
        "x",
        "",
        "<<",
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(
        ["fixed", "uniform", "lognormal", "empirical", "gamma", "multi_turn", "agent", "trace", "2s", "chat"]
    )
)
TREES = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(KEYS | st.text(max_size=6), kids, max_size=5),
    max_leaves=25,
)


def _loads_cleanly(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        load_profile(str(path))
    except ProfileError as e:
        assert str(path) in str(e)


FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(tree=TREES)
def test_fuzz_random_structures(tmp_path: Path, tree: Any) -> None:
    _loads_cleanly(tmp_path, yaml.safe_dump(tree))


@FUZZ
@given(text=st.text(max_size=80))
def test_fuzz_random_text(tmp_path: Path, text: str) -> None:
    _loads_cleanly(tmp_path, text)


def _mutate(data: Any, ops: list[tuple[int, int, Any]]) -> Any:
    """Apply (choice, op, value) edits along random paths of a copy of ``data``."""
    data = copy.deepcopy(data)
    for choice, op, value in ops:
        node = data
        while isinstance(node, dict | list) and node and choice % 3:
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            key = keys[choice % len(keys)]
            if not isinstance(node[key], dict | list) or not node[key]:
                break
            node, choice = node[key], choice // 3
        if isinstance(node, dict) and node:
            key = list(node)[choice % len(node)]
            if op == 0:
                del node[key]
            elif op == 1:
                node[key] = value
            else:
                node[str(value)[:8]] = value
        elif isinstance(node, list) and node:
            if op:
                node[choice % len(node)] = value
            else:
                node.pop(choice % len(node))
    return data


@FUZZ
@given(ops=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2), TREES), min_size=1, max_size=4))
def test_fuzz_mutated_valid_profile(tmp_path: Path, ops: list[tuple[int, int, Any]]) -> None:
    _loads_cleanly(tmp_path, yaml.safe_dump(_mutate(full_profile(), ops)))


# --- the CLI ---


def test_cli_list_show_validate(tmp_path: Path) -> None:
    res = run_cli(["profiles", "list"])
    assert res.returncode == 0, res.stderr
    assert "interactive-chat" in res.stdout and "closed loop" in res.stdout

    res = run_cli(["profiles", "show", "interactive-chat"])
    assert res.returncode == 0, res.stderr
    shown = yaml.safe_load(res.stdout)
    assert shown["scenarios"][0]["salt"] is False and shown["load"]["max_in_flight"] is None
    assert shown["engine"]["gpu"] and "slos" in shown

    good = write(tmp_path, full_profile(), "good.yaml")
    bad = write(tmp_path, {**FLAT, "load": {"rate": 2, "arrival": "gamma"}}, "bad.yaml")
    res = run_cli(["profiles", "validate", str(good)])
    assert res.returncode == 0 and f"OK {good}" in res.stdout
    res = run_cli(["profiles", "validate", str(good), str(bad)])
    assert res.returncode == 2 and f"OK {good}" in res.stdout
    assert (
        f"{bad}: invalid profile" in res.stderr and "load.cv" in res.stderr and "Traceback" not in res.stderr
    )

    res = run_cli(["profiles", "show", str(bad)])
    assert res.returncode == 2 and "load.cv" in res.stderr
    shown = yaml.safe_load(run_cli(["profiles", "show", str(good)]).stdout)
    assert json.loads(json.dumps(shown))["scenarios"][2]["agent"]["tools"] == 8
