"""The closed loop's units, built a block at a time (RunContext.next_closed_loop_unit): each stream gets
exactly the unit of the next index, as if built alone; no more are built than may be issued; a unit that
cannot be built fails in its own turn; units that build slowly are built one at a time; a block stops
once it has held the event loop its span."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from loadtest.locust import context as context_module
from loadtest.locust.context import CLOSED_LOOP_BLOCK, RunContext
from loadtest.locust.settings import RunSettings
from loadtest.workload.units import Unit
from tests.conftest import write_profile


@pytest.fixture(autouse=True)
def _every_build_counts_as_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """How long a build takes is the machine's; the tests say which builds are fast."""
    monkeypatch.setattr(context_module, "BLOCK_BUILD_MAX_NS", 10**12)
    monkeypatch.setattr(context_module, "BLOCK_SPAN_NS", 10**12)


@contextmanager
def _context(tmp_path: Path, worker: int = 0, workers: int = 1, **settings: Any) -> Iterator[RunContext]:
    prof = write_profile(tmp_path / "p.yaml", input_tokens={"dist": "uniform", "min": 8, "max": 900})
    run = RunSettings("r", str(prof), "http://127.0.0.1:9", str(tmp_path / "out"), 1.0, 7, **settings)
    ctx = RunContext(run, worker, workers, None)
    try:
        yield ctx
    finally:
        ctx.close()


def _first(unit: Unit) -> tuple[str, Any]:
    step = unit.next(None)
    assert step is not None
    return step.request.request_id, step.request.body


class _Counting:
    """Wraps the context's ``build_unit``: the indices built, in order; ``fail`` raises for one index."""

    def __init__(self, ctx: RunContext, fail: int | None = None) -> None:
        self.built: list[int] = []
        self._unit, self._fail = ctx.build_unit, fail
        ctx.build_unit = self

    def __call__(self, index: int) -> Unit:
        self.built.append(index)
        if index == self._fail:
            raise ValueError(f"unit {index} cannot be built")
        return self._unit(index)


def test_each_stream_gets_the_next_index_s_unit_as_if_built_alone(tmp_path: Path) -> None:
    with _context(tmp_path, worker=1, workers=3) as ctx:
        counting = _Counting(ctx)
        got = [_first(ctx.next_closed_loop_unit()) for _ in range(2 * CLOSED_LOOP_BLOCK + 3)]
        want = [_first(counting._unit(1 + 3 * k)) for k in range(len(got))]
        assert got == want  # this worker's indices (1, 4, 7, ...), in order, bodies and ids alike
        assert len({body["messages"][-1]["content"] for _, body in got}) == len(got)
        assert counting.built == [1 + 3 * k for k in range(3 * CLOSED_LOOP_BLOCK)]  # three blocks


def test_no_more_units_are_built_than_max_requests_may_issue(tmp_path: Path) -> None:
    with _context(tmp_path, max_requests=5) as ctx:
        counting = _Counting(ctx)
        taken = 0
        while ctx.take_unit():  # as ClosedLoopUser.one_unit: take, then build
            ctx.next_closed_loop_unit()
            taken += 1
        assert taken == 5 and counting.built == [0, 1, 2, 3, 4]


def test_a_unit_that_cannot_be_built_fails_in_its_own_turn(tmp_path: Path) -> None:
    with _context(tmp_path) as ctx:
        counting = _Counting(ctx, fail=3)
        ids = [_first(ctx.next_closed_loop_unit())[0] for _ in range(3)]
        with pytest.raises(ValueError, match="unit 3 cannot be built"):
            ctx.next_closed_loop_unit()
        after = _first(ctx.next_closed_loop_unit())[0]
        assert [i.rsplit("-", 1)[1] for i in [*ids, after]] == ["0", "1", "2", "4"]
        assert counting.built == [0, 1, 2, 3, 3, 4, *range(5, 4 + CLOSED_LOOP_BLOCK)]


def test_units_that_build_slowly_are_built_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(context_module, "BLOCK_BUILD_MAX_NS", 0)
    with _context(tmp_path) as ctx:
        counting = _Counting(ctx)
        for _ in range(5):
            ctx.next_closed_loop_unit()
        assert counting.built == [0, 1, 2, 3, 4]


def test_a_block_stops_once_it_has_held_the_loop_its_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(context_module, "BLOCK_SPAN_NS", 0)  # every unit built ahead is past the span
    with _context(tmp_path) as ctx:
        counting = _Counting(ctx)
        got = [_first(ctx.next_closed_loop_unit())[0].rsplit("-", 1)[1] for _ in range(5)]
        assert got == ["0", "1", "2", "3", "4"]
        assert counting.built == [0, 1, 2, 3, 4, 5]  # the unit itself and one ahead, each time
