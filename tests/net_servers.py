"""What stands between a client and an endpoint, for the network tests: a logging forward proxy
(absolute form and CONNECT), a TLS-terminating relay, and a server that logs the headers it gets."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import socketserver
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

HEAD_LIMIT = 64 * 1024


@dataclass
class Logged:
    """One request a server or proxy saw: method, target (as on the request line) and headers."""

    method: str
    target: str
    headers: dict[str, str] = field(default_factory=dict)


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The request head up to its blank line, and the bytes read past it."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            return b"", b""
        buf += data
        if len(buf) > HEAD_LIMIT:
            return b"", b""
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _parse(head: bytes) -> Logged:
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Logged(method, target, headers)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    socks = [a, b]
    try:
        while True:
            readable, _, _ = select.select(socks, [], [], 30)
            if not readable:
                return
            for s in readable:
                data = s.recv(65536)
                if not data:
                    return
                (b if s is a else a).sendall(data)
    except OSError:
        return


class _Server:
    """A threaded TCP server on a loopback port; ``with`` starts and stops it."""

    def __init__(self) -> None:
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner.handle(self.request, self.client_address)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.lock = threading.Lock()

    def handle(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self.thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class ForwardProxy(_Server):
    """An HTTP forward proxy: absolute-form requests (one per upstream connection, answered with
    ``Connection: close``) and CONNECT tunnels. ``log``: every request it got; ``upstream_ports``: the
    local port of every connection it opened to a server (a relay behind it can tell them apart)."""

    def __init__(self, refuse_connect: bool = False) -> None:
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log: list[Logged] = []
        self.upstream_ports: set[int] = set()
        self.refuse_connect = refuse_connect

    def _upstream(self, host: str, port: int) -> socket.socket:
        up = socket.create_connection((host, port), timeout=30)
        with self.lock:
            self.upstream_ports.add(up.getsockname()[1])
        return up

    def handle(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        with contextlib.suppress(OSError):
            while True:
                head, rest = _read_head(sock)
                if not head:
                    return
                req = _parse(head)
                with self.lock:
                    self.log.append(req)
                if req.method == "CONNECT":
                    host, _, port = req.target.rpartition(":")
                    if self.refuse_connect:
                        sock.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                        return
                    with self._upstream(host, int(port)) as up:
                        sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        if rest:
                            up.sendall(rest)
                        _pipe(sock, up)
                    return
                if not self._forward(sock, req, head, rest):
                    return

    def _forward(self, sock: socket.socket, req: Logged, head: bytes, rest: bytes) -> bool:
        """One absolute-form request to its server in origin form; its answer back, then the end."""
        u = urlsplit(req.target)
        if not u.hostname:
            sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return False
        length = int(req.headers.get("content-length", "0") or 0)
        body = rest
        while len(body) < length:
            data = sock.recv(65536)
            if not data:
                return False
            body += data
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        lines = head.decode("latin-1").split("\r\n")[1:]
        kept = [ln for ln in lines if not ln.lower().startswith(("connection:", "proxy-"))]
        out = "\r\n".join([f"{req.method} {target} HTTP/1.1", *kept, "Connection: close"]) + "\r\n\r\n"
        with self._upstream(u.hostname, u.port or 80) as up:
            up.sendall(out.encode("latin-1") + body)
            answer, more = _read_head(up)
            if not answer:
                return False
            lines = answer.decode("latin-1").split("\r\n")
            kept = [lines[0]] + [
                ln for ln in lines[1:] if not ln.lower().startswith(("connection:", "keep-alive:"))
            ]
            sock.sendall(("\r\n".join([*kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + more)
            while data := up.recv(65536):
                sock.sendall(data)
        return False

    def requests(self, method: str) -> list[Logged]:
        with self.lock:
            return [r for r in self.log if r.method == method]


class TlsRelay(_Server):
    """Terminates TLS with ``context`` and relays the plain bytes to ``upstream`` (host, port);
    ``peers``: the client port of every connection it accepted."""

    def __init__(self, context: ssl.SSLContext, upstream: tuple[str, int]) -> None:
        super().__init__()
        self.context, self.upstream = context, upstream
        self.url = f"https://127.0.0.1:{self.port}"
        self.peers: set[int] = set()
        self.handshakes_failed = 0

    def handle(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        with self.lock:
            self.peers.add(peer[1])
        try:
            tls = self.context.wrap_socket(sock, server_side=True)
        except (OSError, ssl.SSLError):
            with self.lock:
                self.handshakes_failed += 1
            return
        with contextlib.suppress(OSError), tls, socket.create_connection(self.upstream, timeout=30) as up:
            _pipe(tls, up)


class HeaderLog:
    """An HTTP server that logs each request's headers and answers GET with ``body`` (Prometheus text
    by default) or ``status`` with a JSON error ``message``."""

    def __init__(
        self, body: str = "vllm:num_requests_running 1\n", status: int = 200, message: str = ""
    ) -> None:
        owner = self
        self.log: list[Logged] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                owner.log.append(Logged("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
                if status != 200:
                    data = json.dumps(
                        {"error": {"message": message, "type": "invalid_request_error"}}
                    ).encode()
                    ctype = "application/json"
                else:
                    data, ctype = body.encode(), "text/plain; version=0.0.4"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HeaderLog:
        self.thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
