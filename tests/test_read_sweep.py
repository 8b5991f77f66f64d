"""The read sweep: data that arrives while the event loop is busy with other greenlets is read (and its
kernel receive time taken) when a request next waits, not merged with the next data by a late read."""

from __future__ import annotations

from time import perf_counter_ns

import gevent
import pytest
from gevent.monkey import get_original

from loadtest.client.http import Connection, Endpoint
from loadtest.client.read_sweep import SWEEP

_socket = get_original("socket", "socket")
_start_thread = get_original("_thread", "start_new_thread")
_os_lock = get_original("_thread", "allocate_lock")
_blocking_sleep = get_original("time", "sleep")

GAP_S = 0.03  # between the two events' writes


class _TwoEvents:
    """An OS thread (the event loop's stalls do not hold it up) answering one request: headers at once,
    one SSE event, another ``GAP_S`` later, then the end of the body. Each write's time is kept, and
    ``written`` is released after each, so the test can hold the loop until a write is in."""

    def __init__(self) -> None:
        self.listener = _socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.received = False  # the request is in
        self.written = [_os_lock(), _os_lock()]  # each released once its event is written
        for lock in self.written:
            lock.acquire()
        self.times: list[int] = []
        _start_thread(self._serve, ())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            while b"\r\n\r\n" not in conn.recv(65536):
                pass
            self.received = True
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            _blocking_sleep(0.01)
            for event, written in zip(
                (b"b\r\ndata: one\n\n\r\n", b"b\r\ndata: two\n\n\r\n0\r\n\r\n"), self.written, strict=True
            ):
                conn.sendall(event)
                self.times.append(perf_counter_ns())
                written.release()
                _blocking_sleep(GAP_S)
            conn.recv(1)  # until the client closes


def _hold_the_loop(srv: _TwoEvents, sweep_between: bool) -> None:
    """Another greenlet's long work, holding the event loop until both events are in (as a loaded loop's
    pass does); in between, with ``sweep_between``, a request reaches its wait."""
    while not srv.received:  # the request goes out
        gevent.sleep(0.001)
    gevent.sleep(0.002)  # its headers are read (the first event comes 10 ms after them)
    first, second = srv.written
    assert first.acquire(timeout=10)  # blocks the whole thread, loop included, until the event is in
    _blocking_sleep(0.002)
    if sweep_between:
        SWEEP.due()
    assert second.acquire(timeout=10)
    _blocking_sleep(0.002)


@pytest.mark.parametrize("sweep_between", [True, False])
def test_data_that_arrives_during_a_long_pass_keeps_its_own_receive_time(sweep_between: bool) -> None:
    srv = _TwoEvents()
    conn = Connection(Endpoint.parse(srv.url))
    try:
        held = gevent.spawn(_hold_the_loop, srv, sweep_between)
        resp = conn.request(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", read_timeout=5)
        held.join()
    finally:
        conn.close()
        srv.listener.close()
    assert resp.status == 200 and resp.complete
    assert b"".join(resp.chunks) == b"data: one\n\ndata: two\n\n"
    if sweep_between:  # two reads, each with its event's own kernel receive time
        assert len(resp.times) == 2, resp.chunks
        for got, wrote in zip(resp.times, srv.times, strict=True):
            assert -10_000_000 < got - wrote < 5_000_000, (got - wrote) / 1e6  # its write's, not a gap later
    else:  # without the sweep one late read takes both, with the second's time: what the sweep prevents
        assert len(resp.times) == 1, resp.chunks
        assert abs(resp.times[0] - srv.times[1]) < 10_000_000


def test_a_closed_connection_leaves_the_sweep() -> None:
    srv = _TwoEvents()
    conn = Connection(Endpoint.parse(srv.url))
    try:
        conn.request(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", read_timeout=5)
        assert conn.sock is not None
        fd = conn.sock.fileno()
        assert fd in SWEEP._reads
    finally:
        conn.close()
        srv.listener.close()
    assert fd not in SWEEP._reads  # a later socket given the same number is never read for this one
