"""A reverse proxy on loopback that buffers responses as nginx's ``proxy_buffering on`` does, or passes them.

Each client connection gets its own upstream connection; requests go upstream as they come. Responses come
back either as read (``block=0``: pass-through) or held until ``block`` bytes are buffered or the response
is complete (its chunked terminator, or its Content-Length), then written in one ``sendall``. ``writes``
counts the writes to clients, ``reads`` the reads from upstream.
"""

from __future__ import annotations

import contextlib
import socket
import threading

_CHUNKED_END = b"\r\n0\r\n\r\n"


class _ResponseEnd:
    """Where the response being relayed ends: after its head, a chunked terminator or a Content-Length."""

    def __init__(self) -> None:
        self.head = b""
        self.head_done = False
        self.chunked = False
        self.remaining = 0
        self.tail = b""

    def feed(self, data: bytes) -> bool:
        """Account ``data`` (the next bytes upstream sent); True when the response is complete."""
        if not self.head_done:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return False
            head, body = self.head[:end].lower(), self.head[end + 4 :]
            self.head_done = True
            self.tail = b"\r\n"  # the head's own end: an empty chunked body is its terminator alone
            self.chunked = b"transfer-encoding: chunked" in head
            length = next((ln for ln in head.split(b"\r\n") if ln.startswith(b"content-length:")), None)
            self.remaining = int(length.split(b":", 1)[1]) if length else 0
            data = body
            if not self.chunked and length is None:
                return True  # no body the proxy can delimit: pass it on
        if self.chunked:
            self.tail = (self.tail + data)[-len(_CHUNKED_END) :]
            return self.tail == _CHUNKED_END
        self.remaining -= len(data)
        return self.remaining <= 0


class BufferingProxy:
    """``with BufferingProxy(upstream_port, block=65536) as p: p.base_url``; ``block=0`` passes every read on."""

    def __init__(self, upstream_port: int, block: int = 65536) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.block = block
        self.reads = 0
        self.writes = 0
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> BufferingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=30)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _requests(client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                upstream.sendall(data)
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    def _responses(self, upstream: socket.socket, client: socket.socket) -> None:
        held = bytearray()
        end = _ResponseEnd()
        try:
            while data := upstream.recv(65536):
                with self._lock:
                    self.reads += 1
                if not self.block:
                    self._write(client, data)
                    continue
                held += data
                complete = end.feed(data)
                if complete or len(held) >= self.block:
                    self._write(client, bytes(held))
                    held.clear()
                if complete:
                    end = _ResponseEnd()
            if held:
                self._write(client, bytes(held))
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)

    def _write(self, client: socket.socket, data: bytes) -> None:
        client.sendall(data)
        with self._lock:
            self.writes += 1
