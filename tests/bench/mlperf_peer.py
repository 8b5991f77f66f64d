"""The MLPerf Endpoints client as a peer in bench_run_capacity.py: its whole benchmark command, and its
HTTP client alone (mlperf_client_driver.py), pinned to the client core against the same servers.

The MLPerf Endpoints client needs Python 3.12 or newer. Point ``--mlperf-endpoints`` at its
``inference-endpoint`` command; where that Python lives in a system image of its own (a chroot),
``--mlperf-root`` names the image: the command then runs chrooted into it, and the files the bench
writes for it (the prompt dataset) go under ``ROOT/tmp``. The process tree's CPU (the main process,
its HTTP workers, its metrics and event-logging services) is read with psutil from this side.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
CLIENT_CPU = "0"


@dataclass(frozen=True)
class Peer:
    """Where the MLPerf Endpoints client is: its command, the image it runs in, a tokenizer in it."""

    command: str  # the inference-endpoint executable, as a path inside ``root``
    root: Path = Path("/")
    tokenizer: str | None = None  # a tokenizer folder inside ``root`` (its token metrics); none: not given

    def argv(self, *args: str) -> list[str]:
        prefix = ["taskset", "-c", CLIENT_CPU]
        if self.root != Path("/"):
            prefix += ["chroot", str(self.root)]
        return [*prefix, "env", "HF_HUB_OFFLINE=1", *args]

    @property
    def python(self) -> str:
        return str(Path(self.command).parent / "python")

    def scratch(self) -> tuple[Path, str]:
        """A folder for files the peer reads: its path here and inside the image."""
        inside = f"/tmp/bench-mlperf-{time.time_ns()}"
        here = self.root / inside.lstrip("/")
        here.mkdir(parents=True)
        return here, inside


class TreeCpu:
    """The CPU seconds of a process and all its descendants, sampled every 0.1 s (a process that has
    ended keeps its last reading). A descendant that pins itself elsewhere (the MLPerf Endpoints
    client's workers set their own affinity) is put back on the client core."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.1)

    def sample(self) -> float:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            try:
                if p.cpu_affinity() != [int(CLIENT_CPU)]:
                    p.cpu_affinity([int(CLIENT_CPU)])
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            self.seen[p.pid] = max(self.seen.get(p.pid, 0.0), t.user + t.system)
        return sum(self.seen.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def measure_benchmark(peer: Peer, url: str, concurrency: int, samples: int, tokens: int) -> dict[str, Any]:
    """``inference-endpoint benchmark online --load-pattern concurrency``: ``samples`` streamed chat
    completions, ``concurrency`` at a time. The CPU is counted from the start of its performance phase
    to its metrics aggregator's last record (every event and token it accounts for, its tokenization
    of the answers included)."""
    here, inside = peer.scratch()
    with (here / "prompts.jsonl").open("w") as f:
        for i in range(samples):
            f.write(json.dumps({"prompt": f"Tell me a long story, number {i}."}) + "\n")
    cmd = peer.argv(peer.command, "benchmark", "online", "--model", "m-bench", "--endpoints", url)
    cmd += ["--dataset", f"{inside}/prompts.jsonl", "--load-pattern", "concurrency"]
    cmd += ["--concurrency", str(concurrency), "--num-samples", str(samples), "--duration", "0s"]
    cmd += ["--workers", "1", "--streaming", "on", "--no-cpu-affinity", "--report-dir", f"{inside}/report"]
    cmd += ["--max-output-tokens", str(tokens)]
    if peer.tokenizer:
        cmd += ["--tokenizer", peer.tokenizer]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cpu = TreeCpu(proc.pid)
    marks: dict[str, tuple[float, float]] = {}
    log: list[str] = []
    assert proc.stdout is not None
    for raw in proc.stdout:
        log.append(raw)
        if "Starting phase: performance" in raw:
            marks["start"] = (time.monotonic(), cpu.sample())
        elif "Aggregator finalized" in raw:
            marks["end"] = (time.monotonic(), cpu.sample())
    proc.wait(timeout=600)
    cpu.stop()
    text = "".join(log)
    completed = re.search(r"Total samples completed: (\d+)", text)
    failed = re.search(r"Total samples failed: (\d+)", text)
    if proc.returncode or not completed or "start" not in marks or "end" not in marks:
        raise SystemExit(f"the MLPerf Endpoints benchmark failed ({proc.returncode}): {text[-3000:]}")
    if failed and int(failed.group(1)):
        raise SystemExit(f"the MLPerf Endpoints benchmark had {failed.group(1)} failed samples")
    (t0, c0), (t1, c1) = marks["start"], marks["end"]
    return {
        "responses": int(completed.group(1)),
        "events": int(completed.group(1)) * tokens,
        "cpu_s": c1 - c0,
        "wall_s": t1 - t0,
    }


def measure_client(
    peer: Peer, url: str, concurrency: int, seconds: float, warmup: float, expect_chars: int
) -> dict[str, Any]:
    """The MLPerf Endpoints HTTP client alone (tests/bench/mlperf_client_driver.py), one worker process."""
    source = (HERE / "mlperf_client_driver.py").read_text()
    cmd = peer.argv(peer.python, "-c", source, url, str(concurrency), str(seconds))
    cmd += ["--warmup", str(warmup), "--expect", str(expect_chars)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pinned = TreeCpu(proc.pid)  # keeps its worker on the client core; the driver counts its own CPU
    stdout, stderr = proc.communicate(timeout=seconds + warmup + 180)
    pinned.stop()
    rows = [r for r in stdout.splitlines() if r.startswith("{")]
    if proc.returncode or not rows:
        raise SystemExit(f"the MLPerf Endpoints client failed ({proc.returncode}): {stderr[-3000:]}")
    out: dict[str, Any] = json.loads(rows[-1])
    if out["errors"] or out["short"] or not out["responses"]:
        raise SystemExit(f"the MLPerf Endpoints client: {out}")
    return out
