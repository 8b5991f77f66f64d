"""Keep-alive reuse of the client's connection: a pooled connection the server closed or poisoned is
replaced before the next send (and the response says which request opened a connection), and a request
larger than the socket's send buffer goes out whole."""

from __future__ import annotations

import gevent
import pytest
from fault_servers import FaultServer

from loadtest.client.http import Connection, Endpoint


def _request(body: bytes) -> bytes:
    """A GET of the server's /health (its answer: 200 "ok"), carrying ``body``."""
    head = f"GET /health HTTP/1.1\r\nHost: h\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@pytest.mark.parametrize(("then", "connections"), [("keep", 1), ("close", 3), ("poison", 3)])
def test_a_pooled_connection_is_reused_or_replaced_before_the_next_send(then: str, connections: int) -> None:
    with FaultServer([], after=then) as srv:
        conn = Connection(Endpoint.parse(srv.base_url))
        opened = []
        try:
            for _ in range(3):
                if then != "keep" and conn.sock is not None:  # let the server's close or extra bytes arrive
                    gevent.sleep(0.05)
                resp = conn.request(_request(b"{}"), read_timeout=5)
                assert resp.status == 200 and resp.complete and resp.body == b"ok"
                opened.append(resp.opened)
        finally:
            conn.close()
        assert srv.connections == connections
        # each response says whether its request opened the connection, and how long that took
        assert sum(o is not None for o in opened) == connections and opened[0] is not None
        assert all(o.connect_ns > 0 and o.tls_ns == 0 and o.tunnel_ns == 0 for o in opened if o is not None)
        assert srv.request_sizes == [2, 2, 2]


def test_a_request_larger_than_the_send_buffer_goes_out_whole() -> None:
    body = b"x" * (8 << 20)  # far past a loopback socket's send buffer: the first send is partial
    with FaultServer([]) as srv:
        conn = Connection(Endpoint.parse(srv.base_url))
        try:
            resp = conn.request(_request(body), read_timeout=30)
            assert resp.status == 200 and resp.body == b"ok"
        finally:
            conn.close()
        assert srv.request_sizes == [len(body)]
