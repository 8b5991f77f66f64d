"""A pytest plugin that lets several pytest processes share one suite, a test file at a time.

`dev.py test` starts N pytest processes with `-p shard_claims` and the same `LOADTEST_SHARD_DIR`. Every
process collects the whole suite, then repeatedly claims the next unclaimed test file (an exclusive create of a
claim file in that folder, so two processes never run the same file) and runs it whole; files are taken
longest first (by `tests/durations.json`, refreshed from the last sharded run), so the processes end together.
Files with a `real_engine` test wait until `LOADTEST_ENGINES_READY` exists (the engines install while the rest
runs) and run one at a time across processes (a shared lock), because a real engine on a CPU wants the cores.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
_DEFAULT_S_PER_TEST = 1.5


@dataclass
class TestFile:
    """One test file's collected items, what it is expected to take and whether it needs a real engine."""

    path: str
    items: list[pytest.Item] = field(default_factory=list)
    estimate_s: float = 0.0
    real_engine: bool = False


def _files(items: list[pytest.Item]) -> list[TestFile]:
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    files: dict[str, TestFile] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        tf = files.setdefault(path, TestFile(path))
        tf.items.append(item)
        tf.real_engine = tf.real_engine or item.get_closest_marker("real_engine") is not None
    for tf in files.values():
        tf.estimate_s = known.get(tf.path, _DEFAULT_S_PER_TEST * len(tf.items))
    return sorted(files.values(), key=lambda tf: -tf.estimate_s)


class Claims:
    """The claim folder shared by the processes: one file per claimed test file, a lock for the real engines."""

    def __init__(self, folder: Path, engines_ready: Path | None) -> None:
        self.folder = folder
        self.engines_ready = engines_ready
        self._real_lock: int | None = None

    def claim(self, tf: TestFile) -> bool:
        name = hashlib.sha1(tf.path.encode()).hexdigest()[:16]
        try:
            fd = os.open(self.folder / f"claim-{name}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, f"{os.getpid()} {tf.path}\n".encode())
        os.close(fd)
        return True

    def ready(self) -> bool:
        return self.engines_ready is None or self.engines_ready.exists()

    def lock_real(self) -> bool:
        fd = os.open(self.folder / "real-engine.lock", os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._real_lock = fd
        return True

    def unlock_real(self) -> None:
        if self._real_lock is not None:
            os.close(self._real_lock)  # closing the descriptor drops the lock
            self._real_lock = None


def _next_file(claims: Claims, pending: list[TestFile]) -> TestFile | None:
    """The next file this process runs: a real-engine file when the engines are ready and no other process
    runs one, else the longest other file; None when every file is claimed."""
    while pending:
        if claims.ready() and any(tf.real_engine for tf in pending) and claims.lock_real():
            for tf in [tf for tf in pending if tf.real_engine]:
                pending.remove(tf)
                if claims.claim(tf):
                    return tf
            claims.unlock_real()
        for tf in [tf for tf in pending if not tf.real_engine]:
            pending.remove(tf)
            if claims.claim(tf):
                return tf
        if pending:
            time.sleep(1.0)  # only real-engine files are left: wait for the install or the other process
    return None


def _claimed(claims: Claims, files: list[TestFile]) -> Iterator[TestFile]:
    pending = list(files)
    while (tf := _next_file(claims, pending)) is not None:
        try:
            yield tf
        finally:
            claims.unlock_real()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    folder = os.environ.get("LOADTEST_SHARD_DIR")
    if not folder or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    ready = os.environ.get("LOADTEST_ENGINES_READY")
    claims = Claims(Path(folder), Path(ready) if ready else None)
    files = _files(session.items)
    (Path(folder) / f"collected-{os.getpid()}.json").write_text(json.dumps([i.nodeid for i in session.items]))
    timings = Path(folder) / f"files-{os.getpid()}.jsonl"
    for tf in _claimed(claims, files):
        start = time.monotonic()
        for i, item in enumerate(tf.items):
            nextitem = tf.items[i + 1] if i + 1 < len(tf.items) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        with timings.open("a") as f:
            f.write(json.dumps({"path": tf.path, "seconds": round(time.monotonic() - start, 2)}) + "\n")
    return True


_OUTCOMES: dict[str, tuple[str, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's outcome (failed if any phase failed) and its time over setup, call and teardown."""
    outcome, seconds = _OUTCOMES.get(report.nodeid, ("passed", 0.0))
    if report.failed and outcome not in ("failed", "error"):
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped and outcome == "passed":
        outcome = "skipped"
    _OUTCOMES[report.nodeid] = (outcome, seconds + report.duration)


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = os.environ.get("LOADTEST_SHARD_DIR")
    if folder:
        rows = [{"nodeid": k, "outcome": o, "seconds": round(s, 3)} for k, (o, s) in _OUTCOMES.items()]
        (Path(folder) / f"tests-{os.getpid()}.json").write_text(json.dumps(rows))
