"""Shared benchmark plumbing: server processes, CPU pinning and the closed-loop gevent client driver."""

from __future__ import annotations

import http.client
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns
from typing import Any, NamedTuple

import gevent
import msgspec

from loadtest.client.openai import OpenAIClient, PreparedRequest
from loadtest.client.record import RequestRecord
from loadtest.gc_tuning import tune_gc
from loadtest.metrics.recorder import Recorder
from loadtest.results.record_log import RecordLog
from loadtest.tokens.tokenizer import get_tokenizer

HERE = Path(__file__).resolve().parent
CLIENT_CPU = 0
SERVER_CPU = 1


def prepare_process(cpu: int = CLIENT_CPU) -> None:
    """Pin this (client) process to one CPU and allow many sockets. Call after monkey.patch_all()."""
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        raise SystemExit("the benchmark must call gevent.monkey.patch_all() before anything else")
    os.sched_setaffinity(0, {cpu})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """Stop a child by its pid: terminate, wait, then kill."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class ServerProcess:
    """A tests/bench/sse_server.py child process; stopped by its pid (terminate, wait, kill)."""

    def __init__(self, mode: str, *extra: str, cpu: int = SERVER_CPU) -> None:
        cmd = [sys.executable, str(HERE / "sse_server.py"), mode, "--cpu", str(cpu), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "READY":
            self.stop()
            raise SystemExit(f"{mode} server did not start (got {line!r})")
        self.port = int(line[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def get_json(self, path: str) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return msgspec.json.decode(resp.read())
        finally:
            conn.close()

    def stop(self) -> None:
        stop_process(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class CoreHog:
    """A process spinning on one CPU for as long as it is held: the noisy neighbour of a shared core (a CI
    runner's other job). Stopped by its pid."""

    def __init__(self, cpu: int) -> None:
        cmd = ["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"]
        self.proc = subprocess.Popen(cmd)

    def stop(self) -> None:
        stop_process(self.proc)

    def __enter__(self) -> CoreHog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cpu_jiffies() -> dict[int, tuple[int, int]]:
    """Per-CPU (busy, total) jiffies from /proc/stat: shows what else ran on the pinned cores."""
    out: dict[int, tuple[int, int]] = {}
    with open("/proc/stat") as f:
        for row in f:
            if row.startswith("cpu") and row[3].isdigit():
                name, *vals = row.split()
                v = [int(x) for x in vals[:8]]
                idle = v[3] + v[4]
                out[int(name[3:])] = (sum(v) - idle, sum(v))
    return out


def busy_share(a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]]) -> dict[int, float]:
    return {c: (b[c][0] - a[c][0]) / max(1, b[c][1] - a[c][1]) for c in a if c in b}


class Finished(NamedTuple):
    """What a benchmark keeps of a finished request: only atomic values, so the collector skips it
    (a production run keeps nothing per request in memory; records go to the record log)."""

    request_id: str
    wire_id: str  # the X-Request-Id it was sent with: the paced server's truth is keyed by it
    outcome: str
    error: str
    sent_ns: int
    first_token_ns: int
    chunk_ns: array
    completion_tokens_client: int

    @classmethod
    def of(cls, rec: RequestRecord) -> Finished:
        return cls(
            rec.request_id,
            rec.wire_id or "",
            rec.outcome,
            rec.error,
            rec.sent_ns,
            rec.first_token_ns,
            array("q", rec.chunk_ns),
            rec.completion_tokens_client,
        )


@dataclass
class LoadResult:
    """One closed-loop run; counters and CPU time cover only the measurement window."""

    concurrency: int
    wall_s: float
    cpu_s: float
    records: list[Finished] = field(default_factory=list)  # finished inside the window
    outcomes: dict[str, int] = field(default_factory=dict)
    events: int = 0  # token-carrying content events counted by the client in ok records
    core_busy: dict[int, float] = field(default_factory=dict)  # whole-core busy share in the window

    @property
    def cpu_util(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s else 0.0

    @property
    def ok(self) -> int:
        return self.outcomes.get("ok", 0)


def run_closed_loop(
    base_url: str,
    concurrency: int,
    measure_s: float,
    warmup_s: float = 1.0,
    ramp_s: float = 0.0,
    max_tokens: int = 250,
    tag: str = "run",
) -> LoadResult:
    """N greenlets, each with its own OpenAIClient, send back to back; one shared Recorder.

    Greenlet i starts at ``i / N * ramp_s`` (spreads paced streams' phases). The window opens after
    ``ramp_s + warmup_s``; records finished inside it, and the process CPU time spent in it, count.
    """
    tokenizer = get_tokenizer("llama3")
    recorder = Recorder()
    # As in a real run: every finished request is also written to a record log.
    log = RecordLog(Path(tempfile.mkdtemp(prefix="loadtest-bench-")) / "records.jsonl")
    finished: list[Finished] = []
    stop = False
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": max_tokens}

    def user(i: int) -> None:
        if ramp_s:
            gevent.sleep(i * ramp_s / concurrency)
        client = OpenAIClient(base_url, "bench-model", tokenizer, worker=i)
        k = 0
        try:
            while not stop:
                req = PreparedRequest(
                    f"{tag}-u{i}-{k}", "chat", body, prompt_tokens=12, requested_output_tokens=max_tokens
                )
                rec = client.send(req, perf_counter_ns(), time.time())
                recorder.add(rec)
                log.write(rec)
                finished.append(Finished.of(rec))
                k += 1
        finally:
            client.close()

    tune_gc()  # what the run runtime does before starting users
    users = [gevent.spawn(user, i) for i in range(concurrency)]
    gevent.sleep(ramp_s + warmup_s)
    n0, cpu0, t0, j0 = len(finished), time.process_time(), perf_counter_ns(), cpu_jiffies()
    gevent.sleep(measure_s)
    n1, cpu1, t1, j1 = len(finished), time.process_time(), perf_counter_ns(), cpu_jiffies()
    stop = True
    gevent.joinall(users, timeout=30)
    gevent.killall([u for u in users if not u.dead])
    recorder.flush()
    log.close()
    shutil.rmtree(log.path.parent, ignore_errors=True)
    window = finished[n0:n1]
    outcomes: dict[str, int] = {}
    events = 0
    for rec in window:
        outcomes[rec.outcome] = outcomes.get(rec.outcome, 0) + 1
        if rec.outcome == "ok":
            events += len(rec.chunk_ns)
    return LoadResult(concurrency, (t1 - t0) / 1e9, cpu1 - cpu0, window, outcomes, events, busy_share(j0, j1))


def check_complete(res: LoadResult, tokens: int, what: str) -> None:
    """Correctness: every request in the window ok, every content event counted, tokens agree."""
    bad = {k: v for k, v in res.outcomes.items() if k != "ok"}
    if bad or not res.ok:
        errors = {r.outcome: r.error for r in res.records if r.outcome != "ok"}
        raise SystemExit(f"{what}: non-ok outcomes {bad} (ok={res.ok}): {errors}")
    for rec in res.records:
        if len(rec.chunk_ns) != tokens or rec.completion_tokens_client != tokens:
            raise SystemExit(
                f"{what}: request {rec.request_id} counted {len(rec.chunk_ns)} events / "
                f"{rec.completion_tokens_client} tokens, expected {tokens}"
            )
    assert res.events == res.ok * tokens


def print_cores(prefix: str, res: LoadResult) -> None:
    """Busy share of the client and server cores in the window; client core minus client = other processes."""
    busy = res.core_busy
    if CLIENT_CPU in busy:
        line(f"{prefix}_core{CLIENT_CPU}_busy", busy[CLIENT_CPU] * 100, "%", "{:.1f}")
        other = max(0.0, busy[CLIENT_CPU] - res.cpu_util)
        line(f"{prefix}_core{CLIENT_CPU}_other_processes", other * 100, "%", "{:.1f}")
    if SERVER_CPU in busy:
        line(f"{prefix}_core{SERVER_CPU}_busy", busy[SERVER_CPU] * 100, "%", "{:.1f}")


def line(name: str, value: float | int | str, unit: str = "", fmt: str = "{:.0f}") -> None:
    """Print one ``name: value unit`` result line."""
    v = fmt.format(value) if isinstance(value, float) else str(value)
    print(f"{name}: {v}{' ' + unit if unit else ''}", flush=True)
