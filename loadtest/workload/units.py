"""A unit of work (one arrival's request or session) and its steps, the calls it sends one after another."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.client.openai import PreparedRequest
from loadtest.client.record import RequestRecord


@dataclass(slots=True)
class Step:
    """One call of a unit: the request, and how long the user thinks before sending it. ``parallel``:
    units run side by side before it (a recorded agent's subagents), the call waiting for all of them
    (each starts after its own first step's ``think_before_s``)."""

    request: PreparedRequest
    think_before_s: float = 0.0
    parallel: tuple[Unit, ...] = ()


class Unit:
    """One arrival's work: ``next(last)`` gives the next call after ``last`` finished, or None."""

    scenario: str

    def next(self, last: RequestRecord | None) -> Step | None:
        raise NotImplementedError
