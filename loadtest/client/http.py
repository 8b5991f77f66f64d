"""A minimal gevent-native HTTP/1.1 client that timestamps every socket read (httptools parser).

On plain TCP a response's reads are made in a callback of the event loop itself (``_LoopReads``: no
greenlet switch per read; the request's greenlet wakes once, when the response ends or needs it). Per
read the hot path makes one ``recvmsg``, takes one timestamp, feeds the parser and keeps the read's body
bytes (the parser's pieces of it joined) and that time; nothing else. On Linux the timestamp is the kernel's receive
time of the data (SO_TIMESTAMPNS), converted to the ``perf_counter_ns`` clock, so time the
generator spends busy elsewhere does not delay what it measures; elsewhere, and for TLS, it is
``perf_counter_ns()`` at the read. Read and total timeouts are enforced by one watchdog greenlet per
process, not by a timer per read. Connections are kept alive and reused, each with the parser and the
read watcher made at its connect; a pooled connection the server has closed is detected before
sending (no hidden retries).
"""

from __future__ import annotations

import contextlib
import errno
import ssl as _ssl
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any, ClassVar
from urllib.parse import urlsplit

import gevent
import httptools
from gevent import get_hub
from gevent import select as gselect
from gevent import socket as gsocket
from gevent import ssl as gssl
from gevent.hub import Waiter
from gevent.monkey import get_original

from loadtest.client.network import NetworkPolicy, Proxy, unreachable
from loadtest.client.read_sweep import SWEEP

_os_poll = get_original("select", "poll")  # the OS's poll: a zero-timeout check, no greenlet machinery

# One read's buffer. Not larger: CPython allocates the whole size for every recv, and glibc serves
# 256 KiB with an mmap and a munmap per read (a send and a read on a socketpair: 14.4 us, at 64 KiB 2.1 us).
RECV_SIZE = 64 * 1024
MAX_HEADER_BYTES = 64 * 1024  # a response whose status line and headers run past this is not an answer
# Kernel receive timestamps (Linux): SO_TIMESTAMPNS / SCM_TIMESTAMPNS = 35, a struct timespec.
SO_TIMESTAMPNS = 35 if sys.platform.startswith("linux") else 0
_ANC_SIZE = 64
_IDLE_EVENTS = gselect.POLLIN | gselect.POLLPRI  # POLLHUP and POLLERR are always reported
_unpack_timespec = struct.Struct("qq").unpack


class _ClockMap:
    """Maps CLOCK_REALTIME (kernel timestamps) onto the perf_counter_ns clock; refreshed every second."""

    offset_ns: ClassVar[int] = 0

    @classmethod
    def refresh(cls) -> None:
        cls.offset_ns = time.time_ns() - perf_counter_ns()


_ClockMap.refresh()
WATCHDOG_PERIOD_S = 1.0  # timeouts are enforced to within a second
_WATCHDOG_SLICE = 200  # connections checked between two yields, so a sweep never stalls the loop


class _Watchdog:
    """Closes connections whose response went silent too long or ran past its deadline (one greenlet)."""

    def __init__(self) -> None:
        # Connections with a request in flight: each leaves in its request's ``finally``.
        self.active: set[Connection] = set()
        self._running = False  # a sweeping greenlet is alive (a plain flag: read once per request)

    def watch(self, conn: Connection) -> None:
        self.active.add(conn)
        if not self._running:
            self._running = True
            gevent.spawn(self._run)

    def _run(self) -> None:
        try:
            while self.active:
                gevent.sleep(WATCHDOG_PERIOD_S)
                _ClockMap.refresh()
                now = perf_counter_ns()
                for i, conn in enumerate(list(self.active)):
                    why = conn.overdue(now)
                    if why:
                        conn.abort(why)
                    if i % _WATCHDOG_SLICE == _WATCHDOG_SLICE - 1:
                        gevent.sleep(0)
        finally:
            self._running = False


_watchdog = _Watchdog()


class HttpFailure(Exception):
    """A request that failed below HTTP: carries the outcome class it maps to."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message


# The paths that end a full API URL: a --host ending with one of them is used as is (docs/api-surface.md,
# "Endpoint URLs"); "/invocations" is a serving platform's single route (Databricks-style model serving).
API_ROUTES = (
    "/chat/completions",
    "/completions",
    "/messages",
    "/responses",
    "/embeddings",
    "/rerank",
    "/invocations",
)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where requests go: scheme, host, port, the path prefix of the API, and what the host's URL fixes.

    ``fixed_path``: the host's path when it already ends with a full API path (every request goes
    there); ``query``: the host's query string with its ``?`` (kept on every request);
    ``target_prefix``: what goes before the path in the request line (the origin, through an HTTP proxy)."""

    scheme: str
    host: str
    port: int
    api_prefix: str  # e.g. "/v1"
    fixed_path: str = ""
    query: str = ""
    target_prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        u = urlsplit(url if "://" in url else f"http://{url}")
        if u.username is not None or u.password is not None:
            bare = u._replace(netloc=u.netloc.rpartition("@")[2]).geturl()
            raise ValueError(
                f"host {bare}: credentials in the URL (user:password@) are never sent and would be "
                "written into the run's files; give the key with --api-key-env or --api-key-file"
            )
        if u.scheme not in ("http", "https", "grpc"):
            raise ValueError(f"host {url!r}: scheme must be http, https or grpc (api kserve_v2_grpc)")
        if u.scheme == "grpc" and (u.path.strip("/") or u.query or not u.netloc.rpartition(":")[2].isdigit()):
            raise ValueError(f"host {url!r}: a gRPC host is grpc://HOST:PORT, with its port and no path")
        if not u.hostname:
            raise ValueError(f"host {url!r}: no host name")
        if u.fragment:
            raise ValueError(f"host {url!r}: a #fragment is never sent; leave it out")
        path = u.path.rstrip("/")
        route = next((r for r in API_ROUTES if path.endswith(r)), "")
        fixed = path if route else ""  # a full API path: every request goes there
        prefix = path.removesuffix(route) if route else path if path.endswith("/v1") else f"{path}/v1"
        try:
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            netloc = u.netloc.rpartition("@")[2]
            raise ValueError(
                f"host {url!r}: the port in {netloc!r} is not a number from 0 to 65535"
                + ("; give each replica its own --host (or separate them with commas)" if "," in url else "")
            ) from None
        return cls(u.scheme, u.hostname, port, prefix, fixed, f"?{u.query}" if u.query else "")

    def api_path(self, route: str) -> str:
        """The request target of an API route: the host's own path when it fixes one, else the route
        under the API prefix; the host's query string always kept."""
        return (self.fixed_path or self.api_prefix + route) + self.query

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ConnectTiming:
    """How a new connection was opened (ns each): the name's resolution, the TCP connect (to the proxy
    when there is one), the proxy's CONNECT tunnel and the TLS handshake (0 when not done)."""

    dns_ns: int
    connect_ns: int
    tunnel_ns: int = 0
    tls_ns: int = 0

    def micros(self) -> list[int]:
        """The phases in µs, in the record line's ``new_connection`` order."""
        return [self.dns_ns // 1000, self.connect_ns // 1000, self.tunnel_ns // 1000, self.tls_ns // 1000]


def _open(host: str, port: int, timeout: float) -> tuple[gsocket.socket, int, int]:
    """A TCP connection to ``host:port`` as ``socket.create_connection`` makes it (each resolved address
    in turn), with the resolution and the connect timed apart (ns)."""
    t0 = perf_counter_ns()
    infos = gsocket.getaddrinfo(host, port, 0, gsocket.SOCK_STREAM)
    t1 = perf_counter_ns()
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = gsocket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except OSError as e:  # TimeoutError among them: the next address, then the last error
            sock.close()
            error = e
            continue
        return sock, t1 - t0, perf_counter_ns() - t1
    raise error or OSError(f"{host} has no address")


class Response:
    """An HTTP response; ``chunks[i]`` is the body bytes of one read (however many HTTP chunks it
    held), which arrived at ``times[i]`` (perf ns).

    A plain class, not a dataclass, as sse.StreamResult: one is made per request."""

    status: int
    headers: dict[str, str]
    headers_ns: int
    chunks: list[bytes]
    times: list[int]
    complete: bool  # the HTTP message ended properly (content-length or final chunk)
    broken: str = ""  # why the body stopped early, if it did
    timed_out: bool = False  # it stopped because a read or total timeout ran out (the endpoint was too slow)
    oversize: bool = False  # it stopped because it passed the request's size cap (an endless or huge answer)
    opened: ConnectTiming | None  # the connection this request opened; None: a kept-alive one

    def __init__(
        self,
        status: int = 0,
        headers: dict[str, str] | None = None,
        headers_ns: int = 0,
        chunks: list[bytes] | None = None,
        times: list[int] | None = None,
        complete: bool = False,
        opened: ConnectTiming | None = None,
    ) -> None:
        self.status, self.headers_ns, self.complete, self.opened = status, headers_ns, complete, opened
        self.headers = {} if headers is None else headers
        self.chunks = [] if chunks is None else chunks
        self.times = [] if times is None else times

    @property
    def broken_outcome(self) -> str:
        """The class of a body that stopped early: ``timeout`` when a timeout cut it, ``protocol_error`` when
        it ran past its size cap, else ``stream_error``."""
        return "timeout" if self.timed_out else "protocol_error" if self.oversize else "stream_error"

    @property
    def body(self) -> bytes:
        """The whole body, joined once: the pieces collapse into one that keeps the last read's time."""
        chunks = self.chunks
        if len(chunks) > 1:
            chunks[:] = [b"".join(chunks)]  # one copy alive at a time, however often it is asked for
            self.times[:] = self.times[-1:]
        return chunks[0] if chunks else b""

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


_NO_RESPONSE = Response()  # what an idle connection's parser points at; never filled


class _Reader:
    """httptools callbacks for one connection's responses, one at a time (``begin`` each); ``now`` is set
    by the read loop before each feed. The parser is made once per connection: llhttp starts the next
    message after a kept-alive one.

    Interim (1xx) responses are skipped (RFC 9110 §15.2): the final response is the answer. Bytes after
    the final response's end are not part of it: they are ignored and poison the connection."""

    __slots__ = (
        "resp",
        "now",
        "keep_alive",
        "done",
        "leftover",
        "end",
        "parser",
        "pieces",
        "on_body",
    )
    __deletable__ = ("parser",)  # the compiled build (mypyc) deletes only what is listed

    def __init__(self) -> None:
        # Each piece of body the parser finds goes straight into this list (no Python frame per HTTP
        # chunk; httptools binds the callback once); the read loop joins one read's pieces into the
        # response's body with the read's time.
        self.pieces: list[bytes] = []
        self.on_body = self.pieces.append
        self.begin(_NO_RESPONSE)
        self.parser = httptools.HttpResponseParser(self)

    def begin(self, resp: Response) -> None:
        """Read ``resp`` next."""
        self.resp = resp
        self.now = 0
        self.keep_alive = True
        self.done = False
        self.leftover = False  # bytes after the response's end arrived: the connection is not reusable
        self.end = 0  # this read's body pieces that belong to the response (later ones came after its end)
        self.pieces.clear()

    def release(self) -> None:
        """The response is its request's now: nothing of it stays with the connection."""
        self.resp = _NO_RESPONSE
        self.pieces.clear()

    def on_message_begin(self) -> None:
        if self.done:
            self.leftover = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.done:
            self.resp.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.done:
            return
        self.resp.status = self.parser.get_status_code()
        self.resp.headers_ns = self.now
        self.keep_alive = self.parser.should_keep_alive()

    def on_message_complete(self) -> None:
        if self.done:
            return
        if 100 <= self.resp.status < 200:  # interim: the final response follows on this connection
            self.resp.status, self.resp.headers_ns = 0, 0
            self.resp.headers.clear()
            return
        self.done = True
        self.end = len(self.pieces)
        self.resp.complete = True

    def settle(self) -> None:
        """After a read: its body pieces become one piece of the response's body with the read's time;
        pieces past the response's end (bytes of a message that was never asked for) are dropped."""
        pieces = self.pieces
        if self.done:
            del pieces[self.end :]
            self.end = 0  # a later read's pieces all come after the end
        if pieces:
            self.resp.chunks.append(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            self.resp.times.append(self.now)
            pieces.clear()


class _LoopReads:
    """Plain TCP: one response's reads, made in a callback of the event loop itself, so a read costs no
    greenlet switch. Per read: one ``recvmsg`` (which also returns the kernel's receive time), the
    parser fed, the read's body settled. The request's greenlet is woken once the response needs it:
    its end, the end of the connection, a failure, a cap passed, or the watchdog's abort."""

    __slots__ = (
        "conn",
        "reader",
        "resp",
        "chunks",
        "times",
        "recvmsg",
        "feed",
        "pieces",
        "watcher",
        "waiter",
        "error",
        "received",
        "max_bytes",
        "fd",
    )
    # the compiled build (mypyc) deletes only what is listed (close)
    __deletable__ = ("conn", "reader", "resp", "chunks", "times", "recvmsg", "feed", "pieces", "watcher")

    def __init__(self, conn: Connection, sock: gsocket.socket, reader: _Reader) -> None:
        self.conn, self.reader = conn, reader
        self.release()
        self.recvmsg = sock._sock.recvmsg
        self.feed = reader.parser.feed_data
        self.pieces = reader.pieces
        self.fd = sock.fileno()
        self.watcher = get_hub().loop.io(self.fd, 1)  # one per connection, started per wait
        self.waiter: Waiter | None = None
        self.error: BaseException | None = None
        self.received = 0
        self.max_bytes = 0
        SWEEP.add(self.fd, self._on_swept)

    def begin(self, max_bytes: int) -> None:
        """Read the reader's current response (after ``_Reader.begin``)."""
        self.resp = resp = self.reader.resp
        self.chunks, self.times = resp.chunks, resp.times  # the same lists, kept in place
        self.received = 0
        self.max_bytes = max_bytes

    def release(self) -> None:
        """The response is its request's now: nothing of it stays with the connection."""
        self.resp = _NO_RESPONSE
        self.chunks, self.times = _NO_RESPONSE.chunks, _NO_RESPONSE.times

    def next(self) -> bytes:
        """Wait until a read needs the request's greenlet; that read's bytes (b"" when the peer closed).
        The bytes are already fed to the parser; a failure to read or parse is raised here."""
        SWEEP.due()  # other connections' data, read now if the loop has not read for a while
        self.waiter = waiter = Waiter()
        self.watcher.start(self._on_readable)
        data: bytes = waiter.get()
        SWEEP.due()  # and again before this response's own work (its parse, its record, the next send)
        error, self.error = self.error, None
        if error is not None:
            try:
                raise error
            finally:
                del error  # the traceback holds this frame: no cycle through the local
        return data

    def close(self) -> None:
        """Stop and free the watcher; drop what it reached (its callback refers back to this object)."""
        self.watcher.stop()
        self.watcher.close()
        del self.watcher, self.reader, self.resp, self.chunks, self.times, self.feed, self.recvmsg, self.conn
        del self.pieces

    def _on_swept(self) -> None:
        if self.waiter is not None:  # a response is awaited: the sweep reads for it
            self._on_readable()

    def _on_readable(self) -> None:
        try:
            try:
                data, anc, _, _ = self.recvmsg(RECV_SIZE, _ANC_SIZE)
            except BlockingIOError:
                return
            reader = self.reader
            SWEEP.last_read_ns = now = perf_counter_ns()
            if anc:
                sec, nsec = _unpack_timespec(anc[0][2])
                arrived = sec * 1_000_000_000 + nsec - _ClockMap.offset_ns
                if reader.now <= arrived < now:
                    now = arrived
            reader.now = now
            if not data or self.conn._aborted:
                self._wake(data)
                return
            self.feed(data)
            pieces = self.pieces
            if len(pieces) == 1 and not reader.done:  # the common case, inline: one piece, its time
                self.chunks.append(pieces.pop())
                self.times.append(now)
            elif pieces:
                reader.settle()
            self.received = received = self.received + len(data)
            if reader.done or (
                received > MAX_HEADER_BYTES
                and (not self.resp.headers_ns or (self.max_bytes and received > self.max_bytes))
            ):
                self._wake(data)
        except BaseException as e:  # noqa: BLE001 - it belongs to the request, not to the event loop
            self._wake(b"", e)

    def _wake(self, data: bytes, error: BaseException | None = None) -> None:
        """Wake the request's greenlet once this callback has returned (so that no frame of the event
        loop still holds the response while the request goes on); ``next`` raises ``error``."""
        self.watcher.stop()
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            self.error = error
            self.watcher.loop.run_callback(waiter.switch, data)


def _free(parse: _Reader | None, loop_reads: _LoopReads | None) -> None:
    """A closed connection's parser and read callback: their reference cycles broken, so that nothing
    they reached waits for the cyclic collector."""
    if loop_reads is not None:
        loop_reads.close()
    if parse is not None:
        parse.release()
        with contextlib.suppress(AttributeError):
            del parse.parser  # it holds the reader's callbacks


class Connection:
    """One keep-alive HTTP/1.1 connection to an endpoint."""

    def __init__(
        self, endpoint: Endpoint, connect_timeout: float = 10.0, network: NetworkPolicy | None = None
    ) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.network = network or NetworkPolicy()
        # resolved once: the proxy this endpoint's requests go through (None: direct)
        self.proxy = self.network.proxy_for(endpoint.origin)
        self._tls: Any = None  # the TLS context, made at the first TLS connect
        self.sock: gsocket.socket | None = None
        self.opened: ConnectTiming | None = None  # how the current connection was opened
        # Set while a request is in flight (read by the watchdog).
        self._reader: _Reader | None = None
        self._read_timeout_ns = 0
        self._deadline_ns = 0
        self._sent_ns = 0
        self._aborted = ""
        self._idle_check: Any = None  # plain TCP: a poll object on the socket (readable while idle = stale)
        # The open connection's parser and (plain TCP) its read callback, made once per connection.
        self._parse: _Reader | None = None
        self._loop_reads: _LoopReads | None = None

    def overdue(self, now: int) -> str:
        """Why the in-flight request should be given up, or "" if it is fine."""
        reader = self._reader
        if reader is None:
            return ""
        if self._deadline_ns and now > self._deadline_ns:
            return "total timeout"
        last = reader.now or self._sent_ns
        if self._read_timeout_ns and now - last > self._read_timeout_ns:
            return f"no data for {self._read_timeout_ns / 1e9:g}s"
        return ""

    def abort(self, why: str) -> None:
        """Break the in-flight request from another greenlet: its recv returns and reports ``why``."""
        self._aborted = why
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(gsocket.SHUT_RDWR)

    def close(self) -> None:
        self._idle_check = None
        parse, loop_reads = self._parse, self._loop_reads
        self._parse = self._loop_reads = None
        if loop_reads is not None:  # before the socket closes: its number is never swept for another
            SWEEP.remove(loop_reads.fd)
        if self._reader is None:  # idle: free them now; in flight, the request's end does
            _free(parse, loop_reads)
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def _stale(self) -> bool:
        """A pooled idle connection that is readable has been closed (or poisoned) by the server."""
        assert self.sock is not None
        sock = self.sock
        if self._idle_check is not None:  # plain TCP: one zero-timeout poll (EOF, bytes or an error)
            return bool(self._idle_check.poll(0))
        try:
            readable, _, _ = gselect.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _connect(self) -> None:
        ep, proxy = self.endpoint, self.proxy
        host, port = (proxy.host, proxy.port) if proxy else (ep.host, ep.port)
        try:
            sock, dns_ns, connect_ns = _open(host, port, self.connect_timeout)
        except TimeoutError as e:
            if proxy:
                raise HttpFailure("timeout", unreachable(proxy, ep.origin, "connect timed out")) from e
            raise HttpFailure(
                "timeout", f"connect to {ep.origin} timed out after {self.connect_timeout:g}s"
            ) from e
        except OSError as e:
            if proxy:
                raise HttpFailure("connect_error", unreachable(proxy, ep.origin, e.strerror or e)) from e
            raise HttpFailure("connect_error", f"cannot connect to {ep.origin}: {e.strerror or e}") from e
        sock.setsockopt(gsocket.IPPROTO_TCP, gsocket.TCP_NODELAY, 1)
        if SO_TIMESTAMPNS:
            with contextlib.suppress(OSError):
                sock.setsockopt(gsocket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        tunnel_ns = tls_ns = 0
        if ep.scheme == "https":
            if proxy:
                t0 = perf_counter_ns()
                self._tunnel(sock, proxy)
                tunnel_ns = perf_counter_ns() - t0
            sock.settimeout(None)  # blocking for gevent: waits on the watcher, no timer per read
            if self._tls is None:
                self._tls = self.network.ssl_context(gssl.create_default_context)
            t0 = perf_counter_ns()
            try:
                sock = self._tls.wrap_socket(sock, server_hostname=ep.host)
            except (OSError, _ssl.SSLError) as e:
                sock.close()
                raise HttpFailure("connect_error", f"TLS handshake with {ep.origin} failed: {e}") from e
            tls_ns = perf_counter_ns() - t0
        else:
            sock.settimeout(None)
            self._idle_check = _os_poll()
            self._idle_check.register(sock.fileno(), _IDLE_EVENTS)
        self.sock = sock
        self._parse = _Reader()
        if ep.scheme != "https":  # plain TCP: the reads happen in the event loop's callback
            self._loop_reads = _LoopReads(self, sock, self._parse)
        self.opened = ConnectTiming(dns_ns, connect_ns, tunnel_ns, tls_ns)

    def _tunnel(self, sock: gsocket.socket, proxy: Proxy) -> None:
        """HTTP CONNECT through ``proxy`` to the endpoint: a 2xx opens the tunnel (docs/sources.md §16)."""
        ep = self.endpoint
        target = f"{ep.host}:{ep.port}"
        head = b""
        try:
            sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode("latin-1"))
            while b"\r\n\r\n" not in head and len(head) < MAX_HEADER_BYTES:
                data = sock.recv(4096)  # the proxy's answer ends at the blank line: nothing of TLS yet
                if not data:
                    break
                head += data
        except OSError as e:
            sock.close()
            raise HttpFailure("connect_error", unreachable(proxy, ep.origin, e.strerror or e)) from e
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")[:200]
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit() or not 200 <= int(parts[1]) < 300:
            sock.close()
            why = f"CONNECT answered {status_line!r}" if status_line else "it closed the connection"
            raise HttpFailure("connect_error", unreachable(proxy, ep.origin, why))

    def request(
        self,
        raw_request: bytes,
        read_timeout: float,
        deadline_ns: int = 0,
        on_sent: list[int] | None = None,
        max_bytes: int = 0,
    ) -> Response:
        """Send one request and read the whole response, timestamping each read.

        ``on_sent`` (a one-slot list) receives the send timestamp. Raises HttpFailure when no
        response could be read; a response whose body broke off is returned with ``broken`` set.
        ``max_bytes`` (0 = none) bounds the bytes read for this response: past it the connection is
        closed and the response returned with ``oversize`` set; headers are bounded by MAX_HEADER_BYTES.
        """
        if self.sock is not None and self._stale():
            self.close()
        opened = None
        if self.sock is None:
            self._connect()
            opened = self.opened
        sock = self.sock
        assert sock is not None
        resp = Response(opened=opened)
        reader, loop_reads = self._parse, self._loop_reads
        assert reader is not None
        reader.begin(resp)
        feed = reader.parser.feed_data
        # Plain TCP: the reads happen in the event loop's callback (_LoopReads). TLS: gevent's own recv.
        if loop_reads is not None:
            loop_reads.begin(max_bytes)
        self._read_timeout_ns = int(read_timeout * 1e9)
        self._deadline_ns = deadline_ns
        self._aborted = ""
        self._reader = reader
        _watchdog.watch(self)
        try:
            t_sent = perf_counter_ns()
            self._sent_ns = t_sent
            if on_sent is not None:
                on_sent[0] = t_sent
            if loop_reads is None:  # TLS
                sock.sendall(raw_request)
            else:  # one send on the non-blocking OS socket; gevent's sendall only for what did not fit
                try:
                    sent = sock._sock.send(raw_request)
                except BlockingIOError:
                    sent = 0
                if sent < len(raw_request):
                    sock.sendall(memoryview(raw_request)[sent:])
            received = 0
            while not reader.done:
                if loop_reads is not None:  # already fed: only a read that needs this greenlet returns
                    data = loop_reads.next()
                else:
                    data = sock.recv(RECV_SIZE)
                    reader.now = perf_counter_ns()
                if self._aborted:
                    raise TimeoutError(self._aborted)
                if not data:
                    self.close()
                    if resp.status == 0:
                        raise HttpFailure("connect_error", "server closed the connection without a response")
                    if (
                        not reader.parser.get_http_version()
                        or "content-length" in resp.headers
                        or (resp.headers.get("transfer-encoding", "").lower() == "chunked")
                    ):
                        resp.broken = "connection closed before the response body ended"
                    else:  # body delimited by connection close
                        resp.complete = True
                    return resp
                if loop_reads is None:
                    feed(data)
                    if reader.pieces:
                        reader.settle()
                    received += len(data)
                else:
                    received = loop_reads.received
                if received <= MAX_HEADER_BYTES:  # one comparison per read: caps are at least this
                    continue
                if not resp.headers_ns:
                    raise HttpFailure(
                        "protocol_error", f"the response's headers run past {MAX_HEADER_BYTES // 1024} KiB"
                    )
                if max_bytes and received > max_bytes and not reader.done:
                    self.close()
                    resp.broken = (
                        f"the response ran past {max_bytes / 2**20:.1f} MiB, this request's size cap "
                        "(an endless or oversized answer): stopped reading"
                    )
                    resp.oversize = True
                    return resp
        except httptools.HttpParserUpgrade as e:  # 101 Switching Protocols: not an answer to this request
            self.close()
            raise HttpFailure(
                "protocol_error",
                f"HTTP {resp.status or 101}: the server switched protocols instead of answering",
            ) from e
        except HttpFailure:
            self.close()
            raise
        except (TimeoutError, OSError) as e:
            self.close()
            if self._aborted:  # the watchdog shut the socket: a timeout, whatever the OS said
                if resp.status == 0:
                    raise HttpFailure("timeout", f"no response: {self._aborted}") from e
                resp.broken, resp.timed_out = f"timeout: {self._aborted}", True
                return resp
            what = errno.errorcode.get(e.errno or 0, "") if e.errno else ""
            msg = f"{e.strerror or e}{f' ({what})' if what else ''}"
            if resp.status == 0:
                raise HttpFailure("connect_error", f"connection failed before a response: {msg}") from e
            resp.broken = f"connection broke mid-response: {msg}"
            return resp
        except httptools.HttpParserError as e:
            self.close()
            if resp.status == 0:
                raise HttpFailure("protocol_error", f"not an HTTP response: {e}") from e
            resp.broken = f"malformed HTTP body: {e}"
            return resp
        except Exception as e:  # nothing a server sends may escape the client: the record says what
            self.close()
            raise HttpFailure("protocol_error", f"unreadable response: {type(e).__name__}: {e}") from e
        finally:
            reader.settle()  # a read the parser or a timeout stopped in the middle of
            self._reader = None
            if self._parse is reader:  # kept for the connection's next request, without this response
                reader.release()
                if loop_reads is not None:
                    loop_reads.release()
            else:  # the connection closed during the request
                _free(reader, loop_reads)
            _watchdog.active.discard(self)  # watched only while in flight: the watchdog ends when idle
        if not reader.keep_alive or reader.leftover:
            self.close()
        return resp


_DECODABLE = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decode_content(resp: Response) -> str:
    """Undo a Content-Encoding the server applied although the request asked for ``identity``.

    gzip and deflate are decoded chunk by chunk in place, each decoded piece keeping the time of the read
    that brought it; "" when the body is now plain, else why it cannot be read (another coding, or a
    corrupt one)."""
    coding = resp.headers.get("content-encoding", "").strip().lower()
    if coding in ("", "identity"):
        return ""
    wbits = _DECODABLE.get(coding)
    if wbits is None:
        return f"the server sent Content-Encoding {coding} although the request asked for identity"
    d = zlib.decompressobj(wbits)
    try:
        plain = [d.decompress(c) for c in resp.chunks]
        if plain:
            plain[-1] += d.flush()
    except zlib.error as e:
        return f"Content-Encoding {coding}: the body does not decode ({e})"
    resp.chunks[:] = plain
    del resp.headers["content-encoding"]
    return ""


def is_media_type(content_type: str, media_type: str) -> bool:
    """Whether a Content-Type value names ``media_type`` (lowercase): compared case-insensitively, its
    parameters (``; charset=utf-8``) left out (RFC 9110 §8.3.1, docs/sources.md §5)."""
    return content_type.partition(";")[0].strip().lower() == media_type


def build_request(endpoint: Endpoint, method: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """Serialize an HTTP/1.1 request (in absolute form through an HTTP proxy: ``target_prefix``)."""
    lines = [f"{method} {endpoint.target_prefix}{path} HTTP/1.1", f"Host: {endpoint.host_header}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
