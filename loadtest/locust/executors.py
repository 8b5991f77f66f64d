"""The load as executors: how each load mode starts Locust users and keeps them for the run's duration."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar, Protocol

from gevent.event import Event
from locust.runners import Runner

from loadtest.locust.host_cpu import HostCpu
from loadtest.locust.ramp import Ramp, plan_ramp, start_streams
from loadtest.locust.users import ClosedLoopUser, OpenLoopUser
from loadtest.profile.load import Load


class Executor(Protocol):
    """One load mode: its name (``Load.executor``), its user class, and how it drives the runner."""

    @property
    def name(self) -> str: ...

    @property
    def open_loop(self) -> bool: ...

    @property
    def user_class(self) -> type: ...

    def drive(
        self, runner: Runner, duration_s: float, processes: int, stop: Event, host: HostCpu
    ) -> Ramp | None:
        """Start the users and keep the load until ``duration_s`` ends or ``stop`` is set (a closed loop's
        start watches ``host``'s CPU); the closed loop's start ramp (None for the other loads, or when
        ``stop`` came before every stream started)."""
        ...


def _spawn_rate(n: int) -> float:
    return max(100.0, n * 10.0)  # all at once, in practice


@dataclass(frozen=True, slots=True)
class ScheduledArrivals:
    """Open loop (arrival-rate, trace-replay, rate stages): one dispatcher user per worker process follows
    the workload's arrival schedule, which already holds the rate, the trace's times or the stages."""

    name: str
    open_loop: ClassVar[bool] = True
    user_class: ClassVar[type] = OpenLoopUser

    def drive(
        self, runner: Runner, duration_s: float, processes: int, stop: Event, host: HostCpu
    ) -> Ramp | None:
        runner.start(processes, spawn_rate=_spawn_rate(processes))
        stop.wait(timeout=duration_s)
        return None


@dataclass(frozen=True, slots=True)
class ConstantStreams:
    """Closed loop: ``streams`` users, each sending its next unit as soon as the last ended, started over
    ``ramp_up_s`` (None: at once for a few hundred a process, else at a rate the host sustains;
    locust/ramp.py). The duration counts from the first start."""

    streams: int
    ramp_up_s: float | None = None
    name: ClassVar[str] = "constant-streams"
    open_loop: ClassVar[bool] = False
    user_class: ClassVar[type] = ClosedLoopUser

    def drive(
        self, runner: Runner, duration_s: float, processes: int, stop: Event, host: HostCpu
    ) -> Ramp | None:
        deadline = time.monotonic() + duration_s
        plan = plan_ramp(self.streams, self.ramp_up_s, duration_s, processes)
        ramp = start_streams(runner, plan, stop, host)
        if ramp is not None:
            stop.wait(timeout=max(0.0, deadline - time.monotonic()))
        return ramp


@dataclass(frozen=True, slots=True)
class StreamStages:
    """Closed loop in stages: the user count changes per stage (a ramp spreads the change over the stage)."""

    stages: tuple[tuple[int, float, bool], ...]  # (streams, seconds, ramp)
    name: ClassVar[str] = "stages"
    open_loop: ClassVar[bool] = False
    user_class: ClassVar[type] = ClosedLoopUser

    def drive(
        self, runner: Runner, duration_s: float, processes: int, stop: Event, host: HostCpu
    ) -> Ramp | None:
        deadline = time.monotonic() + duration_s
        previous = 0
        for n, seconds, ramp in self.stages:
            rate = max(0.1, abs(n - previous) / seconds) if ramp else _spawn_rate(n)
            runner.start(n, spawn_rate=rate)
            previous = n
            wait = min(seconds, deadline - time.monotonic())
            if wait <= 0 or stop.wait(timeout=wait):
                return None
        return None


def executor_for(load: Load) -> Executor:
    """The executor of a profile's load (the only place that maps load modes to how they are driven)."""
    if load.open_loop:
        return ScheduledArrivals(load.executor)
    if load.stages:
        return StreamStages(tuple((int(s.concurrency or 0), s.duration_s, s.ramp) for s in load.stages))
    return ConstantStreams(int(load.concurrency or 1), load.ramp_up_s)
