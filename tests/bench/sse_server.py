"""Raw asyncio OpenAI-style SSE servers for the client benchmarks: 'batched' (framed like vLLM by default) and
truth-logging 'paced'."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import socket
import struct
import time
from time import perf_counter_ns
from typing import Any

import msgspec

# Every word is one llama3 token, and so is each word in any concatenation of them.
WORDS = (" the", " of", " and", " to", " in", " a", " is", " that", " for", " it", " was", " on")
CHUNK_BASE: dict[str, Any] = {
    "id": "chatcmpl-9f8e7",
    "object": "chat.completion.chunk",
    "created": 1700000000,
    "model": "m-bench",
}
DONE = b"data: [DONE]\n\n"
_enc = msgspec.json.Encoder()


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + _enc.encode(obj) + b"\n\n"


def role_event() -> bytes:
    delta = {"role": "assistant", "content": ""}
    return sse(
        {**CHUNK_BASE, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
    )


def content_event(i: int) -> bytes:
    delta = {"content": WORDS[i % len(WORDS)]}
    return sse({**CHUNK_BASE, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


def finish_event() -> bytes:
    return sse(
        {**CHUNK_BASE, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]}
    )


def usage_event(n: int) -> bytes:
    usage = {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n}
    return sse({**CHUNK_BASE, "choices": [], "usage": usage})


def chunked(data: bytes) -> bytes:
    """One HTTP/1.1 chunked-transfer frame."""
    return b"%x\r\n" % len(data) + data + b"\r\n"


FRAMINGS = ("chunked", "coalesced", "content-length")
COALESCE_EVENTS = 16  # coalesced framing: events per chunk, as a buffering proxy forwards them


def batched_response(tokens: int, framing: str = "chunked") -> bytes:
    """The whole response in one write. ``chunked``: one HTTP chunk per SSE event, as vLLM and SGLang
    send; ``coalesced``: COALESCE_EVENTS events per chunk (a proxy that buffers); ``content-length``:
    one body, no chunking (the framing that favours a client most)."""
    events = [
        role_event(),
        *(content_event(i) for i in range(tokens)),
        finish_event() + usage_event(tokens) + DONE,
    ]
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: keep-alive\r\n"
    if framing == "content-length":
        body = b"".join(events)
        return (head + f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body
    per = 1 if framing == "chunked" else COALESCE_EVENTS
    chunks = [b"".join(events[i : i + per]) for i in range(0, len(events), per)]
    body = b"".join(chunked(c) for c in chunks) + b"0\r\n\r\n"
    return (head + "Transfer-Encoding: chunked\r\n\r\n").encode("latin-1") + body


PACED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Connection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
)


class Server:
    """Request dispatch and the paced server's ground truth (perf_counter_ns after each write)."""

    def __init__(self, mode: str, tokens: int, ttft_s: float, itl_s: float, framing: str = "chunked") -> None:
        self.mode = mode
        self.tokens = tokens
        self.ttft_ns = int(ttft_s * 1e9)
        self.itl_ns = int(itl_s * 1e9)
        self.loop = asyncio.get_running_loop()
        self.batched = batched_response(tokens, framing)
        self.paced_first = PACED_HEAD + chunked(role_event())
        self.paced_frames = [chunked(content_event(i)) for i in range(tokens)]
        self.paced_tail = chunked(finish_event() + usage_event(tokens) + DONE) + b"0\r\n\r\n"
        # request id -> [arrival_ns, token_1_write_ns, ..., token_n_write_ns]
        self.truth: dict[str, list[int]] = {}
        self.heads: dict[str, int] = {}  # request id -> its response headers' write
        self.lateness_ns: list[int] = []  # actual minus intended time of every timed write
        self.cpu0 = time.process_time()
        self.wall0 = perf_counter_ns()
        self.requests = 0

    def handle(self, t: Conn, method: str, path: str, headers: dict[str, str], arrival_ns: int) -> None:
        if method == "GET" and path.startswith("/truth"):
            self._send_truth(t)
            return
        if method != "POST":
            body = b"not found"
            t.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            return
        self.requests += 1
        if self.mode == "batched":
            t.write(self.batched)
            return
        rid = headers.get("x-request-id", f"anon-{self.requests}")
        times = [arrival_ns]
        self.truth[rid] = times
        t.write(self.paced_first)
        self.heads[rid] = perf_counter_ns()
        _PacedStream(self, t, arrival_ns, times).schedule()

    def _send_truth(self, t: Conn) -> None:
        now = perf_counter_ns()
        body = _enc.encode(
            {
                "requests": self.truth,
                "heads": self.heads,
                "lateness_ns": self.lateness_ns,
                "server_cpu_s": time.process_time() - self.cpu0,
                "server_wall_s": (now - self.wall0) / 1e9,
                "requests_served": self.requests,
            }
        )
        self.truth = {}
        self.heads = {}
        self.lateness_ns = []
        self.cpu0 = time.process_time()
        self.wall0 = now
        self.requests = 0
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        t.write(head + body)


class _PacedStream:
    """One paced response: token k is written at arrival + TTFT + k * ITL (absolute call_at times)."""

    __slots__ = ("srv", "t", "arrival_ns", "times", "k")

    def __init__(self, srv: Server, t: Conn, arrival_ns: int, times: list[int]) -> None:
        self.srv = srv
        self.t = t
        self.arrival_ns = arrival_ns
        self.times = times
        self.k = 0

    def _due_ns(self) -> int:
        return self.arrival_ns + self.srv.ttft_ns + self.k * self.srv.itl_ns

    def schedule(self) -> None:
        # loop.time() is time.monotonic(): the same CLOCK_MONOTONIC as perf_counter_ns on Linux.
        self.srv.loop.call_at(self._due_ns() / 1e9, self.emit)

    def emit(self) -> None:
        if self.t.is_closing():
            return
        srv = self.srv
        due = self._due_ns()
        start = perf_counter_ns()
        if self.k < srv.tokens:
            self.t.write(srv.paced_frames[self.k])
            self.times.append(perf_counter_ns())
        else:
            self.t.write(srv.paced_tail)
        srv.lateness_ns.append(start - due)
        self.k += 1
        if self.k <= srv.tokens:
            self.schedule()


SO_TIMESTAMPNS = 35  # Linux: the kernel's receive time of the data, with each read
_timespec = struct.Struct("qq")


class Conn:
    """A keep-alive HTTP/1.1 connection on a plain non-blocking socket, read and written from the event
    loop's own callbacks; parses requests by hand (Content-Length bodies only). A request's arrival is
    the kernel's receive time of its read (``SO_TIMESTAMPNS``, on the perf_counter_ns clock), so the
    truth does not count this server's own lateness in reading it against the client."""

    def __init__(self, srv: Server, sock: socket.socket) -> None:
        self.srv = srv
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = b""
        self.out = bytearray()  # what the socket did not take yet
        self.closed = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        srv.loop.add_reader(self.fd, self._on_readable)

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.out:  # behind what waits: in order
            self.out += data
            return
        sent = self._send(data)
        if sent < len(data):
            self.out += data[sent:]
            self.srv.loop.add_writer(self.fd, self._on_writable)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.srv.loop.remove_reader(self.fd)
            self.srv.loop.remove_writer(self.fd)
            self.sock.close()

    def _send(self, data: bytes | bytearray) -> int:
        """The bytes the socket took (all of them when it failed: the connection is closed, they are dropped)."""
        try:
            return self.sock.send(data)
        except BlockingIOError:
            return 0
        except OSError:
            self.close()
            return len(data)

    def _on_writable(self) -> None:
        del self.out[: self._send(self.out)]
        if not self.out:
            self.srv.loop.remove_writer(self.fd)

    def _on_readable(self) -> None:
        try:
            data, anc, _, _ = self.sock.recvmsg(65536, 64)
        except BlockingIOError:
            return
        except OSError:
            data, anc = b"", []
        if not data:
            self.close()
            return
        arrival_ns = perf_counter_ns()
        for level, kind, value in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = _timespec.unpack(value[: _timespec.size])
                arrival_ns = min(
                    arrival_ns, sec * 1_000_000_000 + nsec - (time.time_ns() - perf_counter_ns())
                )
        self._requests(self.buf + data, arrival_ns)

    def _requests(self, buf: bytes, arrival_ns: int) -> None:
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            lines = buf[:end].decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length", "0"))
            if len(buf) < end + 4 + n:
                break
            buf = buf[end + 4 + n :]
            self.srv.handle(self, method, path, headers, arrival_ns)
        self.buf = buf


async def serve(args: argparse.Namespace) -> None:
    srv = Server(args.mode, args.tokens, args.ttft_ms / 1e3, args.itl_ms / 1e3, args.framing)
    listener = socket.create_server((args.host, args.port), backlog=8192)
    listener.setblocking(False)
    conns: set[Conn] = set()

    def accept() -> None:
        for _ in range(64):
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            conns.add(Conn(srv, sock))
        conns.difference_update([c for c in conns if c.closed])

    srv.loop.add_reader(listener.fileno(), accept)
    print(f"READY {listener.getsockname()[1]}", flush=True)
    try:
        await asyncio.Event().wait()  # until the process is stopped
    finally:
        for c in list(conns):
            c.close()
        listener.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mode", choices=("batched", "paced"))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (printed as 'READY <port>')")
    p.add_argument("--cpu", type=int, default=1, help="pin to this CPU (-1 = no pinning)")
    p.add_argument(
        "--tokens", type=int, default=None, help="content events per response (batched 250, paced 49)"
    )
    p.add_argument("--ttft-ms", type=float, default=100.0, help="paced: delay before the first token")
    p.add_argument("--itl-ms", type=float, default=20.0, help="paced: gap between tokens")
    p.add_argument(
        "--framing",
        choices=FRAMINGS,
        default="chunked",
        help="batched: one chunk per event (vLLM, default), several per chunk (a proxy), or one body",
    )
    args = p.parse_args()
    if args.tokens is None:
        args.tokens = 250 if args.mode == "batched" else 49
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
