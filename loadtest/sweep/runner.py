"""Runs one sweep point as a `loadtest run` process against the sweep's endpoint; forwards Ctrl-C to it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from loadtest.contracts.sweep_document import SweepPoint
from loadtest.sweep.ladder import LoadPoint
from loadtest.sweep.model import point_entry, read_run_json

RUN_LOG = "run.log"  # the point's console output, next to its run.json
ACCURACY_LOG = "accuracy.log"  # an accuracy run's console output, next to its accuracy.json
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _last_error_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("loadtest: error:")]
    pick = errors[-1] if errors else next((ln for ln in reversed(lines) if ln), "")
    return pick.removeprefix("loadtest: error:").strip()


@dataclass(frozen=True)
class AccuracyRuns:
    """``loadtest accuracy SPEC`` after the points at ``at`` (their concurrency; None: every point), at
    the point's concurrency, into its folder; ``args``: what the command needs besides (``--model``,
    the key's source)."""

    spec: str
    at: frozenset[int] | None = None
    args: tuple[str, ...] = ()

    def wants(self, point: LoadPoint) -> bool:
        return point.concurrency is not None and (self.at is None or point.concurrency in self.at)


class PointRunner:
    """Runs points one at a time. ``run_args`` are the `loadtest run` options every point shares
    (profile, --host, --duration, SLOs ...). A SIGINT/SIGTERM to the sweep is forwarded once to the
    running point (started in its own session, so a terminal Ctrl-C reaches the sweep only), which then
    writes its results as interrupted; ``interrupted`` names the signal."""

    def __init__(self, sweep_dir: Path, run_args: list[str], accuracy: AccuracyRuns | None = None) -> None:
        self.sweep_dir = sweep_dir
        self.run_args = run_args
        self.accuracy = accuracy
        self.interrupted: str | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._forwarded = False

    # ---- signals ------------------------------------------------------------------------------
    def install_signal_handlers(self) -> Callable[[], None]:
        """Catch SIGINT and SIGTERM; returns a function that puts the previous handlers back."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.interrupted is None:
            self.interrupted = signal.Signals(signum).name
            print(f"\nsweep: {self.interrupted}: stopping after the running point", file=sys.stderr)
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        child = self._child
        if child is not None and not self._forwarded and child.poll() is None:
            self._forwarded = True
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    # ---- one point ----------------------------------------------------------------------------
    def command(self, point: LoadPoint, out: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "loadtest.cli.main",
            "run",
            *self.run_args,
            *point.run_args(),
            "--out",
            str(out),
        ]

    def run(self, index: int, point: LoadPoint) -> SweepPoint:
        """Run ``point`` into ``points/NN-label`` and return its sweep.json entry."""
        rel = point.folder(index)
        out = self.sweep_dir / rel
        out.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"  # run.log follows the run as it goes
        log = out / RUN_LOG
        code = self._child_run(self.command(point, out), log, env)
        run = read_run_json(out)
        if run is None:
            why = _last_error_line(log) or f"exit code {code}"
            return point_entry(
                index,
                point.label,
                point.concurrency,
                point.rate,
                status="failed",
                reason=why,
                rel_dir=rel,
                exit_code=code,
                offline=point.offline,
                duration_s=point.duration_s,
            )
        status = "interrupted" if run.status == "interrupted" else "completed"
        reason = run.interrupted_reason if status == "interrupted" else None
        if status == "completed" and self.accuracy is not None and self.accuracy.wants(point):
            self._accuracy(point, out, env)
        return point_entry(
            index,
            point.label,
            point.concurrency,
            point.rate,
            status=status,
            run=run,
            reason=reason,
            rel_dir=rel,
            exit_code=code,
            offline=point.offline,
            duration_s=point.duration_s,
        )

    def _accuracy(self, point: LoadPoint, out: Path, env: dict[str, str]) -> None:
        """The accuracy run right after its point, at the same concurrency against the same endpoint: its
        accuracy.json (a missed target included) goes into the bundle; a run that could not score says
        why in accuracy.log, and the bundle's accuracy rules then name the point."""
        assert self.accuracy is not None and point.concurrency is not None
        host = self.run_args[self.run_args.index("--host") + 1] if "--host" in self.run_args else None
        cmd = [sys.executable, "-m", "loadtest.cli.main", "accuracy", self.accuracy.spec, *self.accuracy.args]
        cmd += ["--concurrency", str(point.concurrency), "--out", str(out)]
        if host:
            cmd += ["--host", host]
        self._child_run(cmd, out / ACCURACY_LOG, env)

    def _child_run(self, cmd: list[str], log: Path, env: dict[str, str]) -> int:
        """``cmd`` as the running child (its own session, its output in ``log``) until it exits: a signal
        to the sweep is forwarded to it once; its exit code."""
        with log.open("wb") as fh:
            self._forwarded = False
            self._child = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                if self.interrupted:  # a signal that came while the process was being started
                    self._forward(signal.Signals[self.interrupted].value)
                return self._child.wait()
            finally:
                self._child = None

    def skipped(self, index: int, point: LoadPoint, why: str) -> SweepPoint:
        """The entry of a point that was not run: ``dir`` names the folder it would have had (not created)."""
        return point_entry(
            index,
            point.label,
            point.concurrency,
            point.rate,
            rel_dir=point.folder(index),
            status="skipped",
            exit_code=None,
            reason=why,
            offline=point.offline,
            duration_s=point.duration_s,
        )
