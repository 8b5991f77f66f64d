"""The read sweep: data that arrives while the event loop is busy with other greenlets is read (and its
kernel receive time taken) when a request next waits, not merged with the next data by a late read."""

from __future__ import annotations

import gevent
import pytest
from gevent.monkey import get_original

from loadtest.client.http import Connection, Endpoint
from loadtest.client.read_sweep import SWEEP

_socket = get_original("socket", "socket")
_start_thread = get_original("_thread", "start_new_thread")
_blocking_sleep = get_original("time", "sleep")

FIRST_AFTER_S, SECOND_AFTER_S = 0.02, 0.05  # the two events' writes after the request arrived


def _serve_two_events(listener: object) -> None:
    """An OS thread (the event loop's stalls do not delay it): one request, answered with headers at
    once, one SSE event 20 ms later and another at 50 ms, then the end of the body."""
    conn, _ = listener.accept()  # type: ignore[attr-defined]
    with conn:
        while b"\r\n\r\n" not in conn.recv(65536):
            pass
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        _blocking_sleep(FIRST_AFTER_S)
        conn.sendall(b"b\r\ndata: one\n\n\r\n")
        _blocking_sleep(SECOND_AFTER_S - FIRST_AFTER_S)
        conn.sendall(b"b\r\ndata: two\n\n\r\n0\r\n\r\n")
        conn.recv(1)  # until the client closes


def _busy_loop(sweep_between: bool) -> None:
    """Another greenlet's long work, holding the event loop past both events' arrival (as a loaded
    loop's pass does); in between, with ``sweep_between``, a request reaches its wait."""
    gevent.sleep(0.005)  # the request goes out and its headers are read
    _blocking_sleep(FIRST_AFTER_S + 0.015)  # the first event arrives meanwhile, unread
    if sweep_between:
        SWEEP.due()
    _blocking_sleep(SECOND_AFTER_S - FIRST_AFTER_S)  # and the second


@pytest.mark.parametrize("sweep_between", [True, False])
def test_data_that_arrives_during_a_long_pass_keeps_its_own_receive_time(sweep_between: bool) -> None:
    listener = _socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    _start_thread(_serve_two_events, (listener,))
    conn = Connection(Endpoint.parse(f"http://127.0.0.1:{listener.getsockname()[1]}"))
    try:
        busy = gevent.spawn(_busy_loop, sweep_between)
        resp = conn.request(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", read_timeout=5)
        busy.join()
    finally:
        conn.close()
        listener.close()
    assert resp.status == 200 and resp.complete
    assert b"".join(resp.chunks) == b"data: one\n\ndata: two\n\n"
    if sweep_between:  # two reads, each with its event's own kernel time, 30 ms apart
        assert len(resp.times) == 2, resp.chunks
        gap_ms = (resp.times[1] - resp.times[0]) / 1e6
        assert 20 <= gap_ms <= 40, gap_ms
    else:  # without the sweep one late read takes both, with the second's time: what the sweep prevents
        assert len(resp.times) == 1, resp.chunks


def test_a_closed_connection_leaves_the_sweep() -> None:
    listener = _socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    _start_thread(_serve_two_events, (listener,))
    conn = Connection(Endpoint.parse(f"http://127.0.0.1:{listener.getsockname()[1]}"))
    try:
        conn.request(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", read_timeout=5)
        assert conn.sock is not None
        fd = conn.sock.fileno()
        assert fd in SWEEP._reads
    finally:
        conn.close()
        listener.close()
    assert fd not in SWEEP._reads  # a later socket given the same number is never read for this one
