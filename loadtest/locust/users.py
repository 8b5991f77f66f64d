"""Locust users: a closed-loop user per concurrent stream, and an open-loop dispatcher per worker."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Iterable, Iterator

import gevent
from gevent.pool import Group
from locust import User, constant, task
from locust.exception import StopUser

from loadtest.client.balancer import StreamClient
from loadtest.locust.context import RunContext
from loadtest.locust.sending import run_closed_loop, run_unit
from loadtest.schedule.arrivals import split
from loadtest.workload.builder import Step, Unit, Workload

IDLE_SPARE = 8  # open loop: idle keep-alive connections kept beyond the number of units in flight
# Open loop: units are built ahead of their time (a trace's burst of arrivals at one timestamp too),
# so that the schedule lag measures sending, not building: up to LOOKAHEAD_S ahead, AHEAD_MAX units.
LOOKAHEAD_S = 1.0
AHEAD_MAX = 512


def _context(user: User) -> RunContext:
    ctx = getattr(user.environment, "loadtest", None)
    if ctx is None:
        raise RuntimeError("no loadtest run context on this Locust environment")
    return ctx


@dataclasses.dataclass(slots=True)
class Arrival:
    """One scheduled unit, its first call built: ``offset`` seconds after the dispatcher's start."""

    index: int
    offset: float
    unit: Unit
    first: Step | None


class Ahead:
    """A worker's share of the schedule, each unit built before its time: the arrivals of the start
    (a burst at t = 0) before the schedule starts, later ones in the slack before each send, up to
    ``LOOKAHEAD_S`` ahead (a later burst is ready when its time comes)."""

    def __init__(self, workload: Workload, arrivals: Iterable[tuple[int, float]]) -> None:
        self._workload = workload
        self._source: Iterator[tuple[int, float]] = iter(arrivals)
        self._peek = next(self._source, None)
        self.pending: deque[Arrival] = deque()

    def build_next(self) -> bool:
        """Build the next scheduled unit into ``pending``; False when the schedule is over."""
        if self._peek is None:
            return False
        index, offset = self._peek
        self._peek = next(self._source, None)
        unit = self._workload.unit(index)
        self.pending.append(Arrival(index, offset, unit, unit.next(None)))
        return True

    def may_build(self, now_s: float) -> bool:
        """Whether the next unit is due within ``LOOKAHEAD_S`` of ``now_s`` (and room is left)."""
        return (
            self._peek is not None and len(self.pending) < AHEAD_MAX and self._peek[1] <= now_s + LOOKAHEAD_S
        )

    def prefill(self, until_s: float) -> None:
        """Build every unit due by ``until_s`` (at most ``AHEAD_MAX``)."""
        while self._peek is not None and self._peek[1] <= until_s and len(self.pending) < AHEAD_MAX:
            self.build_next()


class ClosedLoopUser(User):
    """One concurrent stream: runs the next unit (a request or a whole session) as soon as the last ended.

    The stream's one Locust task runs its units one after the other, each followed by Locust's own wait
    (``User.wait``: zero here, and where Locust stops a user between units). That wait yields to the
    event loop, which then serves every ready socket in one pass (running units back to back without it
    cost 25 % more CPU a request on 2-token answers, tests/bench/bench_run_capacity.py --only short);
    Locust's scheduling of a new task per unit is left out. The loop is ``sending.run_closed_loop``
    (compiled), which also backs off after a failed unit."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.ctx = _context(self)
        self.client = self.ctx.new_client()

    def on_stop(self) -> None:
        self.client.close()

    @task
    def units(self) -> None:
        run_closed_loop(self, self.ctx, self.client)  # compiled: the loop, the backoff and the wait


class OpenLoopUser(User):
    """This worker's share of the global arrival schedule; each arrival runs on time, never waiting for replies."""

    wait_time = constant(0)
    fixed_count = 0

    def on_start(self) -> None:
        self.ctx = _context(self)
        self.requests = Group()
        self.idle: list[StreamClient] = []

    def _run(self, unit: Unit, first: Step | None, sched_ns: int, sched_epoch: float) -> None:
        client = self.idle.pop() if self.idle else self.ctx.new_client()
        try:
            run_unit(self.ctx, client, unit, first, sched_ns, sched_epoch)
        finally:
            # The pool follows the load: after a backlog, connections beyond what is in use (plus a few
            # spare) are closed rather than held for the rest of the run.
            if len(self.idle) < max(IDLE_SPARE, len(self.requests)):
                self.idle.append(client)
            else:
                client.close()

    @task
    def dispatch(self) -> None:
        ctx = self.ctx
        ahead = Ahead(ctx.workload, split(ctx.workload.arrival_offsets(), ctx.worker_index, ctx.n_workers))
        ahead.prefill(0.0)  # the arrivals at t = 0 are built before the schedule starts
        t0_ns, t0_epoch = RunContext.now()
        try:
            while ahead.pending or ahead.build_next():
                a = ahead.pending[0]
                sched_ns = t0_ns + int(a.offset * 1e9)
                now_ns = time.perf_counter_ns()
                if sched_ns > now_ns:
                    if not ctx.stopping and ahead.may_build((now_ns - t0_ns) / 1e9):
                        ahead.build_next()  # in the slack before this send: not counted as generator lag
                        gevent.sleep(0)  # the units just started send first
                        continue
                    gevent.sleep((sched_ns - now_ns) / 1e9)
                ahead.pending.popleft()
                if ctx.stopping or not ctx.take_unit():
                    break
                self._start(a, sched_ns, t0_epoch)
            self.requests.join()  # drain: units already started finish normally
        except gevent.GreenletExit:
            self.requests.kill(block=True)  # interrupted: in-flight requests are recorded as cancelled
            raise
        finally:
            for c in self.idle:
                c.close()
        raise StopUser()

    def _start(self, a: Arrival, sched_ns: int, t0_epoch: float) -> None:
        """Start one arrival's unit, unless the profile's in-flight cap is reached (counted, not sent)."""
        cap = self.ctx.profile.load.max_in_flight
        if cap is not None and self.ctx.in_flight >= cap:
            self.ctx.skip_arrival()
            return
        self.requests.spawn(self._run, a.unit, a.first, sched_ns, t0_epoch + a.offset)
