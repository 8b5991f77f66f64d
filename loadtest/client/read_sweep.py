"""Reads taken between the event loop's polls: after a millisecond of other work with no read, a request
that wakes or is about to wait reads every connection that has data, so that data's kernel receive
time is taken before the next data on the same connection arrives and the kernel merges the two into
one read and one time.

The event loop polls its sockets only between passes, and one pass runs every greenlet that is ready:
on a loaded core that can be tens of milliseconds of finished answers being parsed, recorded and sent
again, while first tokens wait unread. A read is what takes a token's time (``SO_TIMESTAMPNS``), so the
sweep bounds how long data sits unread to about ``SWEEP_AFTER_NS`` plus one step of one request's own
work (its answer's parse and record, or the next request's build and send), however long the pass.
The loop still reads every socket itself: the sweep only reads earlier, and a read that finds nothing
returns at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING

from gevent.monkey import get_original

if TYPE_CHECKING:
    from select import epoll

_epoll = get_original("select", "epoll")  # gevent's select has no epoll; this one is never waited on
_EPOLLIN, _EPOLLET = get_original("select", "EPOLLIN"), get_original("select", "EPOLLET")

# Reads are swept once the loop has gone this long without one (1 ms: well under any token gap a
# serving engine leaves, and far more than the sweep's own system call)
SWEEP_AFTER_NS = 1_000_000


class ReadSweep:
    """The process's connections awaiting data, by file descriptor, in an epoll set of their own
    (edge-triggered: each arrival is reported once; the event loop's own poll still sees what is left)."""

    __slots__ = ("_set", "_reads", "last_read_ns")

    def __init__(self) -> None:
        self._set: epoll | None = None  # made at the first connection
        self._reads: dict[int, Callable[[], None]] = {}
        self.last_read_ns = 0  # set by every read the event loop makes

    def add(self, fd: int, on_ready: Callable[[], None]) -> None:
        """Sweep ``fd``: ``on_ready()`` is called when data came and it was not read for a while."""
        if self._set is None:
            self._set = _epoll()
        ep = self._set
        try:
            ep.register(fd, _EPOLLIN | _EPOLLET)
        except FileExistsError:  # a number closed elsewhere and reused: take it over
            ep.modify(fd, _EPOLLIN | _EPOLLET)
        self._reads[fd] = on_ready

    def remove(self, fd: int) -> None:
        """Stop sweeping ``fd`` (before it is closed, so that a reused number is never read for it)."""
        if self._reads.pop(fd, None) is not None and self._set is not None:
            with contextlib.suppress(OSError, ValueError):
                self._set.unregister(fd)

    def due(self) -> None:
        """A request woke or is about to wait: sweep if the loop has not read for ``SWEEP_AFTER_NS``."""
        if perf_counter_ns() - self.last_read_ns > SWEEP_AFTER_NS and self._reads:
            self.sweep()

    def sweep(self) -> None:
        """Read every connection that has data now (a zero-timeout poll of the set)."""
        self.last_read_ns = perf_counter_ns()
        if self._set is None:
            return
        reads = self._reads
        for fd, _ in self._set.poll(0):
            on_ready = reads.get(fd)
            if on_ready is not None:
                on_ready()

    def forget(self) -> None:
        """In a forked child: the parent's set (shared with it) and its connections are not this
        process's; the child makes its own at its first connection."""
        if self._set is not None:
            self._set.close()  # this process's copy of the descriptor only
        self._set = None
        self._reads.clear()


SWEEP = ReadSweep()
os.register_at_fork(after_in_child=SWEEP.forget)
