"""Keep-alive reuse of the client's connection: a pooled connection the server closed or poisoned is
replaced before the next send, and a request larger than the socket's send buffer goes out whole."""

from __future__ import annotations

import socket
import threading

import gevent
import pytest

from loadtest.client.http import Connection, Endpoint

OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


class _Server:
    """Answers each request with OK; after it, per ``then``: keep the connection, close it, or send
    bytes nobody asked for. Counts connections and the request bytes each request carried."""

    def __init__(self, then: str) -> None:
        self.then = then
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.body_sizes: list[int] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = int(
                    next(
                        ln.split(b":")[1]
                        for ln in head.split(b"\r\n")
                        if ln.lower().startswith(b"content-length")
                    )
                )
                while len(buf) < length:
                    data = conn.recv(1 << 20)
                    if not data:
                        return
                    buf += data
                self.body_sizes.append(length)
                buf = buf[length:]
                conn.sendall(OK + (b"HTTP/1.1 200 OK\r\n" if self.then == "poison" else b""))
                if self.then == "close":
                    conn.shutdown(socket.SHUT_RDWR)
                    return

    def close(self) -> None:
        self.listener.close()


def _request(body: bytes) -> bytes:
    head = f"POST /v1/x HTTP/1.1\r\nHost: h\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@pytest.mark.parametrize(("then", "connections"), [("keep", 1), ("close", 3), ("poison", 3)])
def test_a_pooled_connection_is_reused_or_replaced_before_the_next_send(then: str, connections: int) -> None:
    srv = _Server(then)
    conn = Connection(Endpoint.parse(f"http://127.0.0.1:{srv.port}"))
    try:
        for _ in range(3):
            if then != "keep" and conn.sock is not None:  # let the server's close or extra bytes arrive
                gevent.sleep(0.05)
            resp = conn.request(_request(b"{}"), read_timeout=5)
            assert resp.status == 200 and resp.complete and resp.body == b"ok"
    finally:
        conn.close()
        srv.close()
    assert srv.connections == connections
    assert srv.body_sizes == [2, 2, 2]


def test_a_request_larger_than_the_send_buffer_goes_out_whole() -> None:
    srv = _Server("keep")
    conn = Connection(Endpoint.parse(f"http://127.0.0.1:{srv.port}"))
    body = b"x" * (8 << 20)  # far past a loopback socket's send buffer: the first send is partial
    try:
        resp = conn.request(_request(body), read_timeout=30)
        assert resp.status == 200 and resp.body == b"ok"
    finally:
        conn.close()
        srv.close()
    assert srv.body_sizes == [len(body)]
