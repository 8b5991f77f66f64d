"""The closed loop's start ramp: how fast its streams start (at once, ``--ramp-up``, or a rate the host sustains)
and starting them in small batches, each after the last one was taken in."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import gevent
from gevent.event import Event
from locust.runners import Runner

from loadtest.locust.host_cpu import HostCpu
from loadtest.profile.load import Load

# Up to this many streams per process start at once: a few hundred connections and first requests take
# a loop a few tens of milliseconds.
AT_ONCE_STREAMS = 500
# The default start rate, streams a second per process. One start (the Locust user, its connection and
# its first request) took about 250 µs of a core when 13,368 streams started at once (docs/deploy.md,
# "One host's ceiling"): 1,000 a second is a quarter of a core, leaving the rest for the streams running.
STARTS_PER_S = 1_000.0
# The default ramp takes at most this share of the run (a longer one is --ramp-up's to ask for).
MAX_RAMP_SHARE = 1 / 3
# Streams start in batches this far apart; each batch waits for the last to be taken in (a busy loop,
# or a master waiting for its workers' word, spaces them further: the ramp slows with the host).
STEP_S = 0.1
# A default ramp also watches the host: a batch waits while the generator's processes on this host use more
# than HOLD_ABOVE of the cores they may use (locust/host_cpu.py), so that starting streams does not take
# the CPU the running ones need. It waits until the ramp has taken HOLD_MAX_FACTOR times its plan at most:
# a host the running streams alone saturate would otherwise never start the rest (its run's health check
# then says the host is saturated). A ramp set by --ramp-up keeps its own pace.
HOLD_ABOVE = 0.9
HOLD_MAX_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class RampPlan:
    """How ``streams`` closed-loop streams start: over ``seconds`` (0: at once); ``source`` is ``set``
    (``--ramp-up`` / ``load.ramp_up_s``) or ``default``."""

    streams: int
    seconds: float
    source: str

    def describe(self) -> str:
        """For the start-up line."""
        if self.seconds <= 0:
            return f"{self.streams:,} streams start at once"
        how = (
            "--ramp-up / load.ramp_up_s"
            if self.source == "set"
            else f"the default: {STARTS_PER_S:,.0f} a second per process, at most "
            f"{MAX_RAMP_SHARE:.0%} of the run; --ramp-up sets it"
        )
        return (
            f"{self.streams:,} streams start over {self.seconds:.1f} s ({how}); the judged window "
            "begins after the last one started"
        )


def plan_ramp(streams: int, ramp_up_s: float | None, duration_s: float, processes: int) -> RampPlan:
    """The ramp of ``streams`` streams: ``ramp_up_s`` when set, else at once up to AT_ONCE_STREAMS per
    process and beyond that at STARTS_PER_S per process, at most MAX_RAMP_SHARE of ``duration_s``."""
    if ramp_up_s is not None:
        return RampPlan(streams, max(0.0, ramp_up_s), "set")
    per = max(1, processes)
    if streams <= AT_ONCE_STREAMS * per:
        return RampPlan(streams, 0.0, "default")
    seconds = min(streams / (STARTS_PER_S * per), max(0.0, duration_s) * MAX_RAMP_SHARE)
    return RampPlan(streams, round(seconds, 3), "default")


@dataclass(frozen=True, slots=True)
class Ramp:
    """What the start took: planned ``planned_s``, from the first start to the last stream taken in
    ``took_s``, of which ``held_s`` batches waited for the host's CPU; ``end_epoch``: when the judged
    window may begin (a step after the last batch of a ramp; the first start when the streams started at
    once)."""

    planned_s: float
    took_s: float
    end_epoch: float
    source: str
    held_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "planned_s": self.planned_s,
            "took_s": self.took_s,
            "source": self.source,
            "held_s": self.held_s,
        }


def start_streams(runner: Runner, plan: RampPlan, stop: Event, host: HostCpu) -> Ramp | None:
    """Start ``plan.streams`` users on ``runner`` in batches STEP_S apart (one batch when at once), a
    default ramp's batches held while ``host`` is busy; the ramp when every stream started, None when
    ``stop`` came first."""
    n = plan.streams
    watch = plan.source == "default" and plan.seconds > 0
    held = 0.0
    steps = max(1, math.ceil(plan.seconds / STEP_S))
    taken = Event()
    counts: list[int] = [0]

    def spawned(user_count: int, **_kw: Any) -> None:
        counts[0] = user_count
        taken.set()

    events = runner.environment.events.spawning_complete
    events.add_listener(spawned)
    started = time.time()
    hold_until = time.monotonic() + HOLD_MAX_FACTOR * plan.seconds
    try:
        for i in range(1, steps + 1):
            if watch and i > 1:
                held += _hold_while_busy(host, hold_until, stop)
            target = math.ceil(n * i / steps)
            taken.clear()
            runner.start(target, spawn_rate=float(target))  # this batch in one dispatch
            next_at = time.monotonic() + (STEP_S if i < steps else 0.0)
            while counts[0] < target:  # taken in: a busy loop or slow workers make the ramp wait
                if stop.is_set():
                    return None
                taken.wait(timeout=STEP_S)
                taken.clear()
            if stop.wait(timeout=max(0.0, next_at - time.monotonic())):
                return None
    finally:
        events.remove_listener(spawned)
    took = time.time() - started
    if plan.seconds <= 0:  # at once: the start is the warm-up's business, as it always was
        return Ramp(0.0, round(took, 3), started, plan.source)
    gevent.sleep(STEP_S)  # the last batch's first requests are scheduled before the window begins
    return Ramp(plan.seconds, round(took, 3), time.time(), plan.source, round(held, 3))


def _hold_while_busy(host: HostCpu, until: float, stop: Event) -> float:
    """Wait a step at a time while ``host`` used more than HOLD_ABOVE of its cores in the last one (until
    ``until`` at the latest); the seconds waited."""
    waited = 0.0
    while host.share() > HOLD_ABOVE and time.monotonic() < until:
        if stop.wait(timeout=STEP_S):
            break
        waited += STEP_S
    return waited


def plan_for(load: Load, duration_s: float, processes: int) -> RampPlan | None:
    """The start ramp of a profile's load (None unless it is a constant closed loop: stages ramp per stage)."""
    if load.concurrency is None:
        return None
    return plan_ramp(load.concurrency, load.ramp_up_s, duration_s, processes)
