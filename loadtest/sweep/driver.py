"""The order of a sweep's runs: ladders with the saturation stop, the offline point, the rate search."""

from __future__ import annotations

from collections.abc import Callable

from loadtest.contracts.sweep_document import SweepPoint
from loadtest.fmt import fmt_ms, fmt_num, fmt_pct
from loadtest.sweep.analysis import endpoint_dead, saturation
from loadtest.sweep.ladder import LoadPoint, rate_point
from loadtest.sweep.runner import PointRunner
from loadtest.sweep.search import Bisection


def point_line(p: SweepPoint) -> str:
    """One console line per point."""
    head = f"  {p.index:>2} {p.label:<9}"
    if p.status in ("skipped", "failed"):
        return f"{head} {p.status}: {p.reason or ''}"
    verdict = p.verdict or "no verdict"
    if p.status == "interrupted":
        verdict = f"interrupted, {verdict}"
    return (
        f"{head} {verdict:<11} {fmt_num(p.output_tps):>10} output tok/s  "
        f"{fmt_num(p.tps_per_user):>8} tok/s/user  TTFT p90 {fmt_ms(p.ttft_p90_ms)} ms  "
        f"TPOT p90 {fmt_ms(p.tpot_p90_ms)} ms  errors {fmt_pct(p.error_rate)}  {p.dir}"
    )


def point_why(p: SweepPoint) -> str | None:
    """The line under a completed point whose verdict is not a pass: its verdict's first reason; for a
    point too short to judge (invalid), a warning that it proves nothing, with the sweep's option."""
    if p.status != "completed" or p.verdict in (None, "pass") or not p.reason:
        return None
    if p.verdict == "invalid":
        why = p.reason.replace("--duration ", "--point-duration ")
        return f"       warning: {p.label} cannot be judged, it proves nothing either way: {why}"
    return f"       {p.reason}"


class Sweep:
    """Runs points through ``runner`` and keeps their sweep.json entries in run order. ``halted``
    says why no further point may run (interrupted, a point could not run, or the endpoint failed
    every request of a point: more load cannot help a dead endpoint); ``stopped_because``
    is the reason the sweep ended before its last point (halted, saturation, or the search's end)."""

    def __init__(
        self,
        runner: PointRunner,
        echo: Callable[[str], None] = print,
        checkpoint: Callable[[], None] | None = None,
    ) -> None:
        self.runner = runner
        self.echo = echo
        self.checkpoint = checkpoint  # called after every point: sweep.json so far survives a kill
        self.points: list[SweepPoint] = []
        self.halted: str | None = None
        self.stopped_because: str | None = None

    def _run(self, point: LoadPoint) -> SweepPoint:
        index = len(self.points)
        c = point.concurrency
        load = f"{c} stream{'s' if c != 1 else ''}" if c is not None else f"{point.rate:g} req/s"
        self.echo(f"  {index:>2} {point.label:<9} running ({load}; live log {point.folder(index)}/run.log)")
        entry = self.runner.run(index, point)
        self.points.append(entry)
        self.echo(point_line(entry))
        if (why := point_why(entry)) is not None:
            self.echo(why)
        if self.checkpoint is not None:
            self.checkpoint()
        if self.runner.interrupted:
            self.halted = f"interrupted ({self.runner.interrupted})"
        elif entry.status == "failed":
            self.halted = f"{entry.label} could not run: {entry.reason}"
        elif entry.status == "interrupted":
            self.halted = f"{entry.label} was interrupted ({entry.reason or 'signal'})"
        elif endpoint_dead(entry):
            self.halted = (
                f"{entry.label}: the endpoint failed every request (no successful request; "
                f"see {entry.dir}/run.json)"
            )
        if self.halted:
            self.stopped_because = self.halted
        return entry

    def _skip(self, point: LoadPoint, why: str) -> None:
        entry = self.runner.skipped(len(self.points), point, why)
        self.points.append(entry)
        self.echo(point_line(entry))

    def ladder(self, loads: list[LoadPoint], stop_at_saturation: bool = True) -> None:
        """Run ``loads`` in order; after a stop the rest are listed as skipped with the reason."""
        for point in loads:
            if self.runner.interrupted and not self.halted:
                self.halted = self.stopped_because = f"interrupted ({self.runner.interrupted})"
            if self.stopped_because:
                self._skip(point, self.stopped_because)
                continue
            self._run(point)
            if not self.halted and stop_at_saturation:
                self.stopped_because = saturation(self.points)

    def single(self, point: LoadPoint) -> SweepPoint | None:
        """Run one point (the offline point) unless the sweep is halted; None when skipped."""
        if self.runner.interrupted and not self.halted:
            self.halted = self.stopped_because = f"interrupted ({self.runner.interrupted})"
        if self.halted:
            self._skip(point, self.halted)
            return None
        return self._run(point)

    def search(self, bisection: Bisection) -> None:
        """Run the bisection's rates until it is over or the sweep halts."""
        used = {p.label for p in self.points}
        while not self.halted:
            if self.runner.interrupted:
                self.halted = f"interrupted ({self.runner.interrupted})"
                bisection.stop(self.halted)
                break
            rate = bisection.next_rate()
            if rate is None:
                break
            point = rate_point(rate, bisection.next_duration())
            if point.label in used or point.rate is None or point.rate <= 0:
                bisection.stop(f"the bracket is narrower than the rate's precision ({point.label})")
                break
            used.add(point.label)
            entry = self._run(point)
            if self.halted:
                bisection.stop(self.halted)
                break
            if entry.needs_duration_s is not None:  # proved nothing: too few samples, not a miss
                self.echo(
                    f"       {point.label}: too few samples to judge; again for {entry.needs_duration_s:g} s"
                )
                bisection.record_insufficient(point.rate, entry.needs_duration_s)
                continue
            bisection.record(point.rate, entry.verdict == "pass" and entry.exit_code == 0)
        self.stopped_because = self.halted or bisection.done_because
