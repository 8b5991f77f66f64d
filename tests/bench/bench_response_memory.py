"""Peak memory of a whole `loadtest run` fed huge and endless responses, against a run fed small ones.

A raw-socket server (its own process, pinned to CPU 1) answers every request the same way:

- ``small``: a 4-token chat stream, chunked, one chunk per event (the baseline);
- ``json50``: one 50 MB non-streamed chat completion (``Content-Length``), for ``stream: false``;
- ``stream50``: a 50 MB chat stream, chunked, one chunk per event of about 4 KB of content;
- ``endless``: content events as fast as the socket takes them, never an end.

`loadtest run` (pinned to CPU 0, 4 streams, closed loop) runs for ``--duration`` s against each; the
generator process's RSS is sampled every 10 ms (psutil) while the load runs (from the first finished
request for ``--duration`` s; the results written after are not this benchmark's subject). Each line is the peak, and the peak above the
baseline run's peak per byte of what the 4 streams held at once: a 50 MB answer within its size cap is
read (``ok``), an endless one stops at the cap (``protocol_error``), and neither may cost more than a few
times what it is allowed to hold.

    .venv/bin/python tests/bench/bench_response_memory.py [--duration 6] [--mb 50]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtest.client.adapters.base import CAP_BYTES_PER_TOKEN, CAP_MIN_BYTES  # noqa: E402

STREAMS = 4
WORD = " the"  # one token in every tokenizer the tool ships
BIG_TOKENS = 16384  # max_tokens of the 50 MB cases: a cap of 64 MiB, above what they send
ENDLESS_TOKENS = 64  # max_tokens of the endless case: the 8 MiB minimum cap


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(content: str | None, finish: str | None = None, usage: int | None = None) -> bytes:
    obj: dict = {"object": "chat.completion.chunk", "model": "m", "choices": []}
    if usage is None:
        delta = {} if content is None else {"content": content}
        obj["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    else:
        obj["usage"] = {"prompt_tokens": 8, "completion_tokens": usage, "total_tokens": 8 + usage}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _answer(mode: str, mb: int, sock: socket.socket) -> None:
    """Write one whole answer in ``mode`` (``endless`` returns only when the client goes away)."""
    if mode == "json50":
        n = mb * 10**6 // len(WORD)
        body = json.dumps(
            {
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": WORD * n},
                        "finish_reason": "length",
                    }
                ],
                "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n},
            }
        ).encode()
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        sock.sendall(head + body)
        return
    per_event = 1024 if mode != "small" else 1
    frame = _chunk(_event(WORD * per_event))
    sock.sendall(STREAM_HEAD + _chunk(_event("")))
    if mode == "endless":
        while True:
            sock.sendall(frame * 16)
    events = 4 if mode == "small" else mb * 10**6 // len(frame)
    for _ in range(events // 64):
        sock.sendall(frame * 64)
    sock.sendall(frame * (events % 64))
    tail = _event(None, "length") + _event(None, usage=events * per_event) + b"data: [DONE]\n\n"
    sock.sendall(_chunk(tail) + b"0\r\n\r\n")


def _serve_connection(mode: str, mb: int, sock: socket.socket) -> None:
    buf = b""
    try:
        while True:
            while b"\r\n\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = next(
                (
                    int(h.split(b":", 1)[1])
                    for h in head.split(b"\r\n")
                    if h.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(buf) < length:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            buf = buf[length:]
            _answer(mode, mb, sock)
    except OSError:
        return
    finally:
        sock.close()


def serve(mode: str, mb: int) -> None:
    """The server process: prints ``READY <port>``, then answers every request in ``mode`` (a thread each)."""
    os.sched_setaffinity(0, {1})
    lsock = socket.create_server(("127.0.0.1", 0), backlog=64)
    print(f"READY {lsock.getsockname()[1]}", flush=True)
    while True:
        conn, _ = lsock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_connection, args=(mode, mb, conn), daemon=True).start()


def _profile(folder: Path, mode: str, duration_s: float) -> Path:
    tokens = {"small": 4, "endless": ENDLESS_TOKENS}.get(mode, BIG_TOKENS)
    prof = folder / f"{mode}.yaml"
    prof.write_text(
        json.dumps(
            {
                "name": f"memory-{mode}",
                "input_tokens": {"dist": "fixed", "value": 8},
                "output_tokens": {"dist": "fixed", "value": tokens},
                "system_prompt_tokens": 0,
                "stream": mode != "json50",
                "load": {"concurrency": STREAMS},
                "duration_s": duration_s,
            }
        )
    )
    return prof


def run_case(mode: str, mb: int, duration_s: float, folder: Path) -> tuple[float, Counter[str]]:
    """Peak RSS (MiB) of one `loadtest run` against ``mode``, and its records' outcome counts."""
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", mode, "--mb", str(mb)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        out = folder / f"out-{mode}"
        cmd = ["taskset", "-c", "0", sys.executable, "-m", "loadtest.cli.main", "run"]
        cmd += ["--profile", str(_profile(folder, mode, duration_s)), "--out", str(out)]
        cmd += ["--host", f"http://127.0.0.1:{port}", "--endpoint-check", "none", "--warmup", "0"]
        gen = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        peak, log, load_end = 0, out / "records.jsonl", float("inf")
        try:
            p = psutil.Process(gen.pid)
            while (
                gen.poll() is None and time.monotonic() < load_end
            ):  # the load, not the results written after
                try:
                    peak = max(peak, p.memory_info().rss)
                except psutil.Error:
                    break
                if load_end == float("inf") and log.exists() and log.stat().st_size:
                    load_end = time.monotonic() + duration_s  # from the first finished request
                time.sleep(0.01)
            gen.wait(timeout=120)
        finally:
            if gen.poll() is None:
                gen.kill()
            _, err = gen.communicate()
        if not (out / "run.json").exists():
            raise SystemExit(f"{mode}: the run wrote no run.json:\n{err.decode(errors='replace')[-2000:]}")
        lines = (out / "records.jsonl").read_text().splitlines()
        return peak / 2**20, Counter(json.loads(ln)["outcome"] for ln in lines if ln)
    finally:
        server.kill()
        server.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--mb", type=int, default=50, help="size of each huge response in MB")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.mb)
        return 0
    endless_cap = max(CAP_MIN_BYTES, ENDLESS_TOKENS * CAP_BYTES_PER_TOKEN)
    held = {
        "json50": STREAMS * args.mb * 10**6,
        "stream50": STREAMS * args.mb * 10**6,
        "endless": STREAMS * endless_cap,
    }
    expect = {"small": "ok", "json50": "ok", "stream50": "ok", "endless": "protocol_error"}
    print(f"response_cap_big: {max(CAP_MIN_BYTES, BIG_TOKENS * CAP_BYTES_PER_TOKEN) / 2**20:.0f} MiB")
    print(f"response_cap_endless: {endless_cap / 2**20:.0f} MiB")
    with tempfile.TemporaryDirectory(prefix="bench-response-memory-") as tmp:
        base = 0.0
        for mode in ("small", "json50", "stream50", "endless"):
            peak, outcomes = run_case(mode, args.mb, args.duration, Path(tmp))
            if set(outcomes) != {expect[mode]}:
                raise SystemExit(f"{mode}: expected only {expect[mode]}, got {dict(outcomes)}")
            print(f"rss_peak_{mode}: {peak:.0f} MiB")
            print(f"requests_{mode}: {sum(outcomes.values())} requests")
            if mode == "small":
                base = peak
                continue
            print(f"rss_above_baseline_per_held_byte_{mode}: {(peak - base) * 2**20 / held[mode]:.2f} x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
