"""Misbehaving OpenAI-style servers on loopback: per request a behaviour from a schedule, with their own truth.

What proxies and broken servers do, which the embedded engine does not: an HTML 502 page, redirects,
a JSON body where a stream was asked for, invalid UTF-8 in the stream, one 10 MB event, a request that
is accepted and never answered, a key echoed back in a 401, TLS with a self-signed certificate, and a
listener that goes away mid-run (connections refused from then on). Each connection is served by a
thread; the n-th request received gets ``schedule[n % len(schedule)]``; ``truth`` maps each request id
(``X-Request-Id``) to the behaviour it got.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
import time
import uuid
import zlib
from collections import Counter
from pathlib import Path

BEHAVIOURS = (
    "ok",
    "html_502",
    "redirect_301",
    "redirect_307",
    "json_not_sse",
    "invalid_utf8",
    "big_event",
    "never_answer",
    "auth_echo",
    "empty_done",  # llama.cpp's server ending a request it interrupted: a role chunk, then [DONE]
    "context_400",  # vLLM refusing a prompt longer than its context window
    "bad_request",  # HTTP 400 for everything (an endpoint that rejects the request shape)
    "continue_100",  # an interim 100 Continue in its own write, then the answer (RFC 9110 §15.2)
    "switching_101",  # 101 Switching Protocols: not an answer to a completion request
    "trailing_503",  # a complete stream and, in the same write, an unsolicited 503
    "gzip_stream",  # Content-Encoding: gzip although the request asked for identity (flushed per event)
    "br_stream",  # Content-Encoding: br, which the client does not decode
    "events_after_done",  # content events after data: [DONE]
    "bom_stream",  # a UTF-8 byte-order mark before the first event (WHATWG SSE strips it)
    "auth_echo_cut",  # a plain-text 401 echoing the key across the error snippet's cut, and another token
    "stall_after_headers",  # the headers and one event, then silence until the client gives up
    "huge_header",  # a 2 MB header line (a response is not allowed to make the client hold it)
    "endless_stream",  # content events as fast as the socket takes them, never an end
    "drip_headers",  # a status line, then one header byte every 0.3 s: the headers never end
    "drip_body",  # the headers, then one byte of an event every 0.3 s: never a read timeout, never an end
    "bursty_stream",  # one event per write every 10 ms, and three times 3 events in one write after 40 ms
    "empty_content",  # a complete stream with no content whose usage claims 4 output tokens
    "bad_json",  # content that is not JSON (cut off), answering a JSON-mode request
    "bad_tool_call",  # a tool call whose arguments are cut-off JSON (finish_reason tool_calls)
    "key_in_answer",  # content that echoes the request's Authorization header back
    "auth_echo_part",  # a 401 echoing parts of the key: what follows its space, and 13 characters of it
    "heartbeat_data",  # an empty "data:" / "data: " event (a heartbeat: WHATWG dispatches nothing) between events
    "cr_paced",  # CR-only line endings (WHATWG allows them), one event every CR_GAP_S, the first with the headers
    "mixed_case_type",  # Content-Type: Text/Event-Stream; charset=UTF-8 (media types are case-insensitive)
    "object_arguments",  # a streamed tool call whose arguments are a JSON object, not a string (llama.cpp, TGI)
)
CR_GAP_S = 0.04
DRIP_S = 0.3
BURSTY_TOKENS, BURSTY_MERGED = 19, 9  # bursty_stream: token events, and gaps ending in a 3-event write
BIG_EVENT_BYTES = 10 * 1024 * 1024
MODEL = "fault-model"


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A throw-away self-signed certificate for 127.0.0.1 (openssl CLI): (cert, key)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _delta(text: str, finish: str | None = None) -> dict:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }


class FaultServer:
    """A threaded HTTP/1.1 server that misbehaves on schedule; ``stop_accepting()`` refuses new connections."""

    def __init__(
        self,
        schedule: list[str],
        tls: tuple[Path, Path] | None = None,
        require_uuid: bool = False,
        models_as_stream: bool = False,
        after: str = "keep",
    ) -> None:
        """``require_uuid``: answer 400 to a request whose X-Request-Id is present and not a UUID (as
        llama.cpp's server does); ``models_as_stream``: answer every GET with an SSE stream (as the
        MLPerf Endpoints mock servers do), except ``/health``; ``after`` each answer: ``keep`` the
        connection, ``close`` it, or ``poison`` it (bytes of a response nobody asked for)."""
        if after not in ("keep", "close", "poison"):
            raise ValueError(f"unknown after {after!r}")
        self.require_uuid = require_uuid
        self.models_as_stream = models_as_stream
        self.after = after
        self.connections = 0  # connections accepted
        self.request_sizes: list[int] = []  # every request's body length, in order
        self.heads: list[str] = []  # every scheduled request's header block, as received
        self.accept_encoding: list[str] = []  # each scheduled request's Accept-Encoding
        self.bodies: dict[str, bytes] = {}  # each scheduled request's body, by its X-Request-Id
        for b in schedule:
            if b not in BEHAVIOURS:
                raise ValueError(f"unknown behaviour {b!r}")
        self.schedule = schedule
        self.truth: dict[str, str] = {}
        self.authorization: list[str] = []
        self._lock = threading.Lock()
        self._n = 0
        self._stopping = threading.Event()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._ctx: ssl.SSLContext | None = None
        if tls is not None:
            self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._ctx.load_cert_chain(str(tls[0]), str(tls[1]))
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self._listener.getsockname()[1]
        scheme = "https" if tls else "http"
        self.base_url = f"{scheme}://127.0.0.1:{self.port}"
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    # ---- life cycle --------------------------------------------------------------------------
    def stop_accepting(self) -> None:
        """From now on connections are refused; idle keep-alive connections are closed, requests in
        progress are answered as scheduled."""
        self._stopping.set()
        self._listener.close()

    def close(self) -> None:
        self.stop_accepting()
        self._closed.set()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> FaultServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self.truth.values())

    # ---- serving -----------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self._ctx is not None:
                conn.settimeout(10)
                conn = self._ctx.wrap_socket(conn, server_side=True)
            conn.settimeout(0.2)
            buf = b""
            while True:
                req = self._read_request(conn, buf)
                if req is None:
                    return
                head, body, buf = req
                with self._lock:
                    self.request_sizes.append(len(body))
                if not self._answer(conn, head, body) or self.after == "close":
                    return
                if self.after == "poison":
                    self._send(conn, b"HTTP/1.1 200 OK\r\n")
        except (OSError, ssl.SSLError):
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _send(self, conn: socket.socket, data: bytes) -> None:
        """``conn.sendall(data)`` that waits for a client reading late (a busy machine's): the connection's
        0.2 s timeout is for the serving loop's reads, to notice a stop. A send gives up only when the
        server closes or the client goes away (any other OSError), never because a read came late."""
        view = memoryview(data)
        while view:
            try:
                view = view[conn.send(view) :]
            except TimeoutError:
                if self._closed.is_set():
                    raise

    def _read_request(self, conn: socket.socket, buf: bytes) -> tuple[str, bytes, bytes] | None:
        while b"\r\n\r\n" not in buf:
            if not buf and (self._stopping.is_set() or self._closed.is_set()):
                return None  # idle keep-alive connection of a server that went away
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return None
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        text = head.decode("latin-1")
        length = 0
        for line in text.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while len(rest) < length:
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return None
            rest += data
        return text, rest[:length], rest[length:]

    def _answer(self, conn: socket.socket, head: str, body: bytes) -> bool:
        """Serve one request; False when the connection must end."""
        lines = head.split("\r\n")
        method, path = lines[0].split(" ")[:2]
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        if method == "GET" and path == "/health":
            self._send(conn, self._head(200, "text/plain", 2) + b"ok")
            return True
        if method == "GET" and self.models_as_stream:
            return self._stream(conn, self._ok_events())
        if method == "GET" and path.endswith("/models"):
            payload = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
            self._send(conn, self._head(200, "application/json", len(payload)) + payload)
            return True
        if method != "POST" or not path.endswith("/completions"):  # e.g. a metrics poll: not scheduled
            self._send(conn, self._head(404, "text/plain", 9) + b"not found")
            return True
        with self._lock:
            behaviour = self.schedule[self._n % len(self.schedule)]
            self._n += 1
            self.truth[headers.get("x-request-id", f"anon-{self._n}")] = behaviour
            self.authorization.append(headers.get("authorization", ""))
            self.heads.append(head)
            self.accept_encoding.append(headers.get("accept-encoding", ""))
            self.bodies[headers.get("x-request-id", f"anon-{self._n}")] = body
        rid = headers.get("x-request-id")
        if self.require_uuid and rid is not None and not _is_uuid(rid):
            return self._error(conn, 400, f"Invalid request id: {rid} (must be a UUID)")
        return getattr(self, f"_b_{behaviour}")(conn, headers)

    @staticmethod
    def _head(status: int, ctype: str | None, length: int | None, extra: str = "") -> bytes:
        reason = {
            200: "OK",
            301: "Moved Permanently",
            307: "Temporary Redirect",
            400: "Bad Request",
            401: "Unauthorized",
            503: "Service Unavailable",
            404: "Not Found",
        }
        text = f"HTTP/1.1 {status} {reason.get(status, 'Bad Gateway')}\r\n"
        if ctype:
            text += f"Content-Type: {ctype}\r\n"
        text += f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
        return (text + extra + "\r\n").encode()

    def _stream(self, conn: socket.socket, events: list[bytes], ctype: str = "text/event-stream") -> bool:
        self._send(conn, self._head(200, ctype, None, "Cache-Control: no-cache\r\n"))
        for ev in events:
            self._send(conn, _chunk(ev))
        self._send(conn, b"0\r\n\r\n")
        return True

    def _ok_events(self, n: int = 4) -> list[bytes]:
        events = [_event(_delta(" hello")) for _ in range(n)]
        events.append(_event(_delta("", "stop")))
        usage = {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}
        events.append(_event({"object": "chat.completion.chunk", "choices": [], "usage": usage}))
        return [*events, b"data: [DONE]\n\n"]

    def _b_ok(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._stream(conn, self._ok_events())

    def _b_html_502(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        page = b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>\n"
        self._send(conn, self._head(502, "text/html", len(page)) + page)
        return True

    def _redirect(self, conn: socket.socket, status: int) -> bool:
        where = f"Location: http://127.0.0.1:{self.port}/elsewhere/v1/chat/completions\r\n"
        self._send(conn, self._head(status, None, 0, where))
        return True

    def _b_redirect_301(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._redirect(conn, 301)

    def _b_redirect_307(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._redirect(conn, 307)

    def _b_json_not_sse(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        obj = {
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            ],
        }
        payload = json.dumps(obj).encode()
        self._send(conn, self._head(200, "application/json", len(payload)) + payload)
        return True

    def _b_invalid_utf8(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        events = self._ok_events()
        events[1] = (
            b'data: {"choices":[{"index":0,"delta":{"content":" \xff\xfe\xc3("},"finish_reason":null}]}\n\n'
        )
        return self._stream(conn, events)

    def _b_big_event(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        events = self._ok_events()
        pad = "x" * BIG_EVENT_BYTES
        events[0] = _event({**_delta(" hello"), "padding": pad})
        return self._stream(conn, events)

    def _b_never_answer(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        """Accept the request, answer nothing; the connection ends when the client gives up."""
        while not self._closed.is_set():
            try:
                if not conn.recv(65536):
                    return False
            except TimeoutError:
                continue
        return False

    def _error(self, conn: socket.socket, status: int, message: str) -> bool:
        payload = json.dumps({"error": {"message": message, "type": "BadRequestError", "code": status}})
        self._send(conn, self._head(status, "application/json", len(payload)) + payload.encode())
        return True

    def _b_empty_done(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        role = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
        return self._stream(conn, [_event(role), b"data: [DONE]\n\n"])

    def _b_context_400(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._error(
            conn,
            400,
            "This model's maximum context length is 2048 tokens. However, you requested 4096 tokens "
            "(4000 in the messages, 96 in the completion). Please reduce the length of the messages or completion.",
        )

    def _b_bad_request(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._error(
            conn, 400, "[{'type': 'missing', 'loc': ('body', 'prompt'), 'msg': 'Field required'}]"
        )

    def _b_continue_100(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        self._send(conn, b"HTTP/1.1 100 Continue\r\n\r\n")
        time.sleep(0.02)  # its own read
        return self._stream(conn, self._ok_events())

    def _b_switching_101(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        self._send(
            conn, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        )
        return False

    def _b_trailing_503(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        body = b"".join(_chunk(ev) for ev in self._ok_events()) + b"0\r\n\r\n"
        extra = self._head(503, "text/plain", 4) + b"busy"
        self._send(conn, self._head(200, "text/event-stream", None) + body + extra)
        return True

    def _b_gzip_stream(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        parts = [z.compress(ev) + z.flush(zlib.Z_SYNC_FLUSH) for ev in self._ok_events()]
        parts[-1] += z.flush()
        self._send(conn, self._head(200, "text/event-stream", None, "Content-Encoding: gzip\r\n"))
        for part in parts:
            self._send(conn, _chunk(part))
        self._send(conn, b"0\r\n\r\n")
        return True

    def _b_bursty_stream(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        """BURSTY_TOKENS token events: the first, then 9 alone (10 ms apart) and 3 bursts of 3 events in
        one write after 40 ms (a proxy that flushes late): BURSTY_MERGED of the gaps end in a burst."""
        self._send(conn, self._head(200, "text/event-stream", None) + _chunk(_event(_delta(" a"))))
        for i in range(12):
            burst = i % 4 == 3
            time.sleep(0.04 if burst else 0.01)
            self._send(conn, b"".join(_chunk(_event(_delta(" b"))) for _ in range(3 if burst else 1)))
        tail = self._ok_events(0)  # finish reason, usage, [DONE]
        tail[1] = _event(
            {
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {
                    "prompt_tokens": 10,
                    "completion_tokens": BURSTY_TOKENS,
                    "total_tokens": 10 + BURSTY_TOKENS,
                },
            }
        )
        self._send(conn, b"".join(_chunk(ev) for ev in tail) + b"0\r\n\r\n")
        return True

    def _b_br_stream(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        payload = b"\x1b\x03\x00\xf8\xa5\x90\x8d\x1e"  # some brotli-looking bytes: never decoded
        self._send(
            conn, self._head(200, "text/event-stream", len(payload), "Content-Encoding: br\r\n") + payload
        )
        return True

    def _b_events_after_done(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._stream(conn, [*self._ok_events(), *[_event(_delta(" extra")) for _ in range(3)]])

    def _b_bom_stream(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        events = self._ok_events()
        events[0] = b"\xef\xbb\xbf" + events[0]
        return self._stream(conn, events)

    def _b_auth_echo_cut(self, conn: socket.socket, h: dict[str, str]) -> bool:
        key = h.get("authorization", "").removeprefix("Bearer ")
        text = "x" * 150 + " denied: " + key + " (the gateway also saw Bearer gw-0therS3cretT0ken99)"
        payload = text.encode()
        self._send(conn, self._head(401, "text/plain", len(payload)) + payload)
        return True

    def _b_stall_after_headers(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        self._send(conn, self._head(200, "text/event-stream", None) + _chunk(self._ok_events()[0]))
        return self._b_never_answer(conn, _h)

    def _b_huge_header(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        self._send(
            conn, b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * (2 * 2**20) + b"\r\nContent-Length: 0\r\n\r\n"
        )
        return False

    def _b_endless_stream(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        self._send(conn, self._head(200, "text/event-stream", None))
        block = _chunk(b"".join(_event(_delta(" hello")) for _ in range(200)))
        try:
            while not self._closed.is_set():
                self._send(conn, block)
        except OSError:  # the client stopped reading and closed: what it should do
            pass
        return False

    def _drip(self, conn: socket.socket, head: bytes, drops: bytes) -> bool:
        """Send ``head``, then ``drops`` one byte every DRIP_S (over and over) until the client goes away."""
        try:
            self._send(conn, head)
            while not self._closed.is_set():
                for i in range(len(drops)):
                    time.sleep(DRIP_S)
                    self._send(conn, drops[i : i + 1])
        except OSError:  # the client gave up and closed: what it should do
            pass
        return False

    def _b_drip_headers(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._drip(conn, b"HTTP/1.1 200 OK\r\n", b"X-Drip: " + b"d" * 4000)

    def _b_drip_body(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._drip(conn, self._head(200, "text/event-stream", None) + b"fff\r\n", b": " + b"." * 4000)

    def _b_auth_echo(self, conn: socket.socket, h: dict[str, str]) -> bool:
        msg = {"error": {"message": f"invalid credentials: {h.get('authorization', '')}", "code": 401}}
        payload = json.dumps(msg).encode()
        self._send(conn, self._head(401, "application/json", len(payload)) + payload)
        return True

    def _answer_events(self, deltas: list[dict], finish: str, n: int) -> list[bytes]:
        """Chunks with the given deltas, a finish reason, usage claiming ``n`` output tokens, [DONE]."""
        events = [
            _event({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]}) for d in deltas
        ]
        events.append(_event(_delta("", finish)))
        usage = {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}
        events.append(_event({"object": "chat.completion.chunk", "choices": [], "usage": usage}))
        return [*events, b"data: [DONE]\n\n"]

    def _b_empty_content(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._stream(conn, self._answer_events([{"role": "assistant"}], "stop", 4))

    def _b_bad_json(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        deltas = [{"content": '{"answer": '}, {"content": '"hel'}, {"content": "lo"}, {"content": " wor"}]
        return self._stream(conn, self._answer_events(deltas, "stop", 4))

    def _b_bad_tool_call(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        call = {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
        parts = ['{"city"', ': "Par', "is", ", Fr"]
        deltas = [{"tool_calls": [call]}] + [
            {"tool_calls": [{"index": 0, "function": {"arguments": a}}]} for a in parts
        ]
        return self._stream(conn, self._answer_events(deltas, "tool_calls", 4))

    def _b_key_in_answer(self, conn: socket.socket, h: dict[str, str]) -> bool:
        deltas = [
            {"content": " your"},
            {"content": " key"},
            {"content": f" {h.get('authorization', '')}"},
            {"content": " ok"},
        ]
        return self._stream(conn, self._answer_events(deltas, "stop", 4))

    def _b_auth_echo_part(self, conn: socket.socket, h: dict[str, str]) -> bool:
        key = h.get("authorization", "").removeprefix("Bearer ")
        after_space = key.split(" ", 1)[-1]
        text = f"token part {after_space!r} not recognised (fragment {key[3:16]})"
        return self._error(conn, 401, text)

    def _b_heartbeat_data(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        events = self._ok_events()
        return self._stream(conn, [events[0], b"data:\n\n", *events[1:3], b"data: \n\n", *events[3:]])

    def _b_cr_paced(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        events = [ev.replace(b"\n", b"\r") for ev in self._ok_events()]
        self._send(conn, self._head(200, "text/event-stream", None) + _chunk(events[0]))
        for ev in events[1:]:
            time.sleep(CR_GAP_S)
            self._send(conn, _chunk(ev))
        self._send(conn, b"0\r\n\r\n")
        return True

    def _b_mixed_case_type(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        return self._stream(conn, self._ok_events(), "Text/Event-Stream; charset=UTF-8")

    def _b_object_arguments(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        fn = {"name": "get_weather", "arguments": {"city": "Paris"}}
        deltas = [{"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": fn}]}]
        return self._stream(conn, self._answer_events(deltas, "tool_calls", 4))


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def wait_until(check: object, timeout: float, what: str) -> None:
    """Poll ``check()`` until true (AssertionError naming ``what`` after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class SilentServer:
    """Thousands of connections that are accepted, read and never answered (one asyncio loop in a thread).

    ``received`` lists the X-Request-Id of every request it read: the ground truth of a dead endpoint."""

    def __init__(self) -> None:
        import asyncio

        self.received: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        self.base_url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        import asyncio

        asyncio.set_event_loop(self._loop)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "x-request-id":
                        self.received.append(value.strip())
                await reader.read()  # until the client gives up and closes
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass
            finally:
                writer.close()

        server = self._loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
