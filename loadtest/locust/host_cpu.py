"""The CPU the generator's processes on this host use together, as a share of the cores they may use."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import psutil


def usable_cores() -> int:
    """The cores this process may run on (its affinity, which the workers it starts inherit)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class HostCpu:
    """This process and ``pids`` together: ``share()`` is their CPU since the last call over the usable
    cores (1.0: every core busy). Processes that share cores are measured together: each alone can look
    half idle on a saturated core. A process that ended counts no more."""

    def __init__(self, pids: Iterable[int] = ()) -> None:
        self.cores = usable_cores()
        self._procs = [psutil.Process()]
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                self._procs.append(psutil.Process(pid))
        self.share()  # the first interval starts now

    def share(self) -> float:
        """The processes' CPU since the last call, as a share of the usable cores."""
        used = 0.0
        for p in self._procs:
            with contextlib.suppress(psutil.Error):
                used += p.cpu_percent(None)
        return used / 100.0 / self.cores
