"""Event-loop pacing for many slow streams: each turn of gevent's loop collects the reads of a short
interval, so one ``epoll_wait`` serves many sockets (read times are the kernel's, so they do not move)."""

from __future__ import annotations

from time import perf_counter

import gevent
from gevent import monkey

_sleep = monkey.get_original("time", "sleep")


def batch_reads(interval_s: float) -> None:
    """Start at most one loop turn per ``interval_s``: a turn that comes sooner first waits out the rest
    (a blocking sleep, before the loop polls). Nothing waits when the loop is idle or slow."""
    if interval_s <= 0:
        return
    loop = gevent.get_hub().loop
    last = [0.0]

    def pace() -> None:
        wait = last[0] + interval_s - perf_counter()
        if wait > 0:
            _sleep(wait)
        last[0] = perf_counter()

    watcher = loop.prepare(ref=False)
    watcher.start(pace)
    _watchers.append(watcher)


_watchers: list[object] = []
