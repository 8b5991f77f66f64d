"""The runs of one `loadtest ui` session: each run's entry (kept for the runs list) and the live run."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gevent.event import Event

from loadtest.contracts.run_document import Verdict
from loadtest.locust.live_series import LiveSeries
from loadtest.locust.settings import RunSettings
from loadtest.locust.ui_stats import DASHBOARD_PATH

if TYPE_CHECKING:  # importing locust monkey-patches the process: only where a run happens
    from loadtest.locust.ui_sources import LiveRun


@dataclass
class RunEntry:
    """One run of this UI session as the runs list shows it (kept after the run's context is let go)."""

    id: str
    profile: str
    load: str
    users: int | None  # closed loop: the start form's user count (the run's streams); open loop: None
    out: Path
    started_epoch: float
    ended_epoch: float | None = None
    phase: str = "running"  # running → draining → finalizing → done (or failed)
    verdict: Verdict | None = None
    report: Path | None = None
    error: str | None = None
    user_changes: list[tuple[float, int]] = field(
        default_factory=list
    )  # (s since start, users): Locust's Edit

    @property
    def report_url(self) -> str | None:
        return f"{DASHBOARD_PATH}/runs/{self.id}/report" if self.report is not None else None

    def to_data(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "profile": self.profile,
            "load": self.load,
            "users": self.users,
            "out_dir": str(self.out),
            "started_epoch": self.started_epoch,
            "ended_epoch": self.ended_epoch,
            "phase": self.phase,
            "verdict": None if self.verdict is None else self.verdict.status,
            "report_url": self.report_url,
            "error": self.error,
            "user_changes": [list(c) for c in self.user_changes],
        }

    def notes(self) -> list[str]:
        """run.json notes: a user count changed while the run ran (the load records the one it started with)."""
        if not self.user_changes:
            return []
        steps = ", ".join(f"{n} at {t:g} s" for t, n in self.user_changes)
        return [
            f"note: the user count changed during the run (Locust's Edit): {self.users} at the start, then "
            f"{steps}; config.load records the {self.users} streams it started with"
        ]


@dataclass
class UiRun:
    """The run in progress (or the last one): where its numbers come from, settings, live series, entry."""

    live: LiveRun
    settings: RunSettings
    entry: RunEntry
    series: LiveSeries
    interrupted_reason: str | None = None
    done: Event = field(default_factory=Event)

    @property
    def out(self) -> Path:
        return self.entry.out

    @property
    def phase(self) -> str:
        return self.entry.phase


def new_run_dir(root: Path, profile_name: str) -> Path:
    """A fresh ``<root>/<timestamp>-<profile>`` folder (suffixed when one already exists)."""
    base = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile_name}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    out.mkdir(parents=True)
    return out
