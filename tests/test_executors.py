"""Each load mode is one executor (locust/executors.py): its k6-style name, open or closed loop, the
Locust user class that drives it, and the one line that describes it."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.locust.executors import ConstantStreams, ScheduledArrivals, StreamStages, executor_for
from loadtest.locust.users import ClosedLoopUser, OpenLoopUser
from loadtest.profile.load import EXECUTORS, Load

CASES: list[tuple[dict[str, Any], str, bool, str]] = [
    ({"concurrency": 8}, "constant-streams", False, "8 concurrent streams (closed loop)"),
    ({"rate": 2.5}, "arrival-rate", True, "2.5 req/s poisson (open loop)"),
    ({"rate": 4, "arrival": "gamma", "cv": 2}, "arrival-rate", True, "4 req/s gamma CV 2 (open loop)"),
    ({"trace": {"path": "dir/t.csv"}}, "trace-replay", True, "trace replay of t.csv (open loop)"),
    (
        {"stages": [{"duration_s": 5, "concurrency": 2}, {"duration_s": 5, "concurrency": 6, "ramp": True}]},
        "stages",
        False,
        "stages 2 → 6 streams",
    ),
    (
        {"stages": [{"duration_s": 5, "rate": 1}, {"duration_s": 5, "rate": 3}]},
        "stages",
        True,
        "stages 1 → 3 req/s",
    ),
]


@pytest.mark.parametrize(("load", "name", "open_loop", "text"), CASES)
def test_every_load_mode_is_one_executor(load: dict[str, Any], name: str, open_loop: bool, text: str) -> None:
    spec = Load.model_validate(load)
    ex = executor_for(spec)
    assert spec.executor == ex.name == name and name in EXECUTORS
    assert spec.open_loop is ex.open_loop is open_loop
    assert ex.user_class is (OpenLoopUser if open_loop else ClosedLoopUser)
    assert spec.describe() == text


def test_closed_loop_stages_keep_their_counts_durations_and_ramps() -> None:
    spec = Load.model_validate(
        {"stages": [{"duration_s": 5, "concurrency": 2}, {"duration_s": 7, "concurrency": 6, "ramp": True}]}
    )
    assert executor_for(spec) == StreamStages(((2, 5.0, False), (6, 7.0, True)))
    assert executor_for(Load.model_validate({"concurrency": 3})) == ConstantStreams(3)
    assert isinstance(executor_for(Load.model_validate({"rate": 1})), ScheduledArrivals)
