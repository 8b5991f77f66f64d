"""The per-request record: every timestamp and count the client measures, and the outcome classes."""

from __future__ import annotations

import inspect
import math
from typing import Any, Final

import numpy as np
from msgspec import UNSET

from loadtest.contracts.record_line import AgenticTurn, LineLike, RecordLine, as_line

# A stream of at most this many chunks is scanned in plain Python (short answers, most tool calls):
# numpy's set-up for so few values costs more than the work.
SMALL_STREAM = 8

# Every request ends in exactly one of these (docs/metrics.md explains each).
OUTCOMES: tuple[str, ...] = (
    "ok",  # complete stream: finish_reason or [DONE] seen, no error
    "http_4xx",  # a 4xx status other than 429
    "http_429",  # rate limited
    "http_5xx",  # a 5xx status
    "connect_error",  # refused, reset or unreachable before a response started
    "timeout",  # connect, read or total timeout
    "stream_error",  # an error frame inside a 200 stream, or the connection broke mid-stream
    "truncated",  # the stream ended cleanly but without finish_reason / [DONE]
    "empty",  # a complete answer that carried no output token although tokens were asked for
    "context_length",  # refused: the prompt (plus max_tokens) exceeds the model's context window
    "protocol_error",  # the response is not an OpenAI-compatible answer (not SSE, not JSON...)
    "cancelled",  # the generator stopped it (end of run, Ctrl-C)
)


class RequestRecord:
    """One request as the client saw it. Times are ``perf_counter_ns`` values (0 = did not happen).

    A plain class, not a dataclass: compiled (loadtest/compiled.py), its defaults are set in C when it
    is made, where a dataclass's ``__init__`` stores every field from Python (1.3 µs a record against
    0.17). ``RequestRecord("id", outcome="ok")`` sets the fields named; an unknown name is an error."""

    request_id: str  # readable: <scenario>-<n> (retries and session calls add a suffix)
    wire_id: str | None = None  # what the X-Request-Id header carried (a UUID), to find it in server logs
    scenario: str = "default"
    api: str = "chat"
    stream: bool = True
    worker: int = 0
    # Wall-clock anchor for the scheduled time (epoch seconds), for time series and logs.
    scheduled_epoch: float = 0.0
    scheduled_ns: int = 0
    sent_ns: int = 0
    headers_ns: int = 0
    first_token_ns: int = 0  # first non-empty fragment of any kind (content, reasoning, tool call)
    first_answer_ns: int = 0  # first non-empty answer content
    done_ns: int = 0
    # Arrival time of every token-carrying chunk (an event with a non-empty fragment).
    chunk_ns: list[int]  # set by __init__ (a list of its own), as chunk_chars and job_us
    http_status: int = 0
    outcome: str = "cancelled"
    error: str = ""
    finish_reason: str | None = None
    requested_output_tokens: int | None = None
    prompt_tokens_client: int = 0
    completion_tokens_client: int = 0
    reasoning_tokens_client: int = 0
    prompt_tokens_server: int | None = None
    completion_tokens_server: int | None = None
    cached_tokens_server: int | None = None
    reasoning_tokens_server: int | None = None
    # Retries (off by default): the n-th attempt of a request is its own record, linked to the first.
    attempt: int = 0  # 0 = the original request, 1.. = retries
    retry_of: str | None = None  # the original request's id, on a retry
    retry_after_s: float | None = None  # the server's Retry-After on a 429/503 (seconds)
    endpoint: int = 0  # index of the endpoint (replica) it went to, in the run's --host order
    inputs: int = 0  # embeddings: the number of inputs the request carried
    merged_gaps: int = 0  # token gaps the client could not time: merged_gap_mask (docs/metrics.md)
    chunk_chars: list[int]  # characters of each chunk_ns event's fragments
    job_us: list[int]  # a job API's parts (video_jobs): RecordLine.job_us
    endpoints_output_tokens: int | None = None  # the answer's MLPerf Endpoints count (tokens/assistant.py)
    endpoints_tpot_tokens: int | None = None  # its tokens after the first output-bearing chunk, the same way
    new_connection: list[int] | None = (
        None  # µs: resolution, connect, tunnel, TLS of the connection it opened
    )
    session: str | None = None  # the conversation it belongs to (PreparedRequest.session)
    session_last: bool = False  # the conversation's planned last call
    _chunk_times: np.ndarray | None = None  # chunk_times(), made once
    # What the server answered (kept in memory for multi-turn sessions; not written to the log).
    answer_text: str = ""
    tool_calls_text: str = ""
    reasoning_text: str = ""  # the reasoning (thinking) text, kept for capture.jsonl only
    body_sent: bytes = b""  # the request body as sent (capture.jsonl only; not written to the log)
    # The answer checks an ok answer failed (client/quality.py); None: none failed, or not checked.
    quality_failed: list[str] | None = None
    # A recorded agent call's expected answer and the answer's tool calls (the inline accuracy check).
    agentic: AgenticTurn | None = None

    def __init__(self, request_id: str, **fields: Any) -> None:
        self.request_id = request_id
        self.chunk_ns, self.chunk_chars, self.job_us = [], [], []
        for name, value in fields.items():
            if name not in _FIELD_SET:
                raise TypeError(f"RequestRecord has no field {name!r}")
            setattr(self, name, value)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in RECORD_FIELDS)
        return f"RequestRecord({shown})"

    def mark_empty(self, carried_output: bool, what: str) -> bool:
        """Classify a complete answer as ``empty`` when tokens were asked for (or no limit set) and it
        carried none (``carried_output`` false: no text, no tool call; and no usage count); True when it did."""
        if self.requested_output_tokens == 0 or carried_output or self.completion_tokens_server:
            return False
        self.outcome = "empty"
        asked = self.requested_output_tokens or "any"
        self.error = f"the {what} carried no output token (finish_reason {self.finish_reason or 'none'}); asked for {asked}"
        return True

    # ---- derived metrics (MLPerf definitions; see docs/metrics.md) ----
    @property
    def output_tokens(self) -> int:
        """The output tokens every figure uses (TPOT, tokens/s, goodput): the server's usage when it sent
        one, else the client tokenizer's count (docs/metrics.md, "What counts as a token")."""
        if self.completion_tokens_server is not None:
            return self.completion_tokens_server
        return self.completion_tokens_client

    @property
    def input_tokens(self) -> int:
        """The prompt tokens throughput uses: the server's usage when it sent one, else the client's count."""
        if self.prompt_tokens_server is not None:
            return self.prompt_tokens_server
        return self.prompt_tokens_client

    def ttft_us(self) -> int | None:
        return (self.first_token_ns - self.scheduled_ns) // 1000 if self.first_token_ns else None

    def ttft_send_us(self) -> int | None:
        return (self.first_token_ns - self.sent_ns) // 1000 if self.first_token_ns and self.sent_ns else None

    def e2e_us(self) -> int | None:
        return (self.done_ns - self.scheduled_ns) // 1000 if self.done_ns else None

    def schedule_lag_us(self) -> int | None:
        return (self.sent_ns - self.scheduled_ns) // 1000 if self.sent_ns else None

    def tpot_us(self) -> float | None:
        """(latency − TTFT) / (n_tokens − 1); undefined for n_tokens ≤ 1 or a non-streamed answer."""
        n = self.output_tokens
        if n <= 1 or not self.first_token_ns or not self.done_ns or not self.stream:
            return None
        return (self.done_ns - self.first_token_ns) / 1000 / (n - 1)

    def chunk_times(self) -> np.ndarray:
        """``chunk_ns`` as an int64 array, made once (the list is final once the answer is classified)."""
        arr = self._chunk_times
        if arr is None or len(arr) != len(self.chunk_ns):
            arr = self._chunk_times = np.asarray(self.chunk_ns, dtype=np.int64)
        return arr

    def _chunks_us(self) -> list[int]:
        """The chunks' times in µs after the scheduled time (plain Python for a short stream)."""
        base, chunks = self.scheduled_ns, self.chunk_ns
        if len(chunks) <= SMALL_STREAM:
            return [(c - base) // 1000 for c in chunks]
        return ((self.chunk_times() - base) // 1000).tolist()

    def chunk_seq(self) -> np.ndarray | list[int]:
        """``chunk_ns`` as the cheaper to scan: the list itself for a short stream, else ``chunk_times()``."""
        return self.chunk_ns if len(self.chunk_ns) <= SMALL_STREAM else self.chunk_times()

    def to_log(self) -> RecordLine:
        """The record-log line: absolute epoch for the schedule, microsecond offsets for the rest.

        Built positionally, in RecordLine's field order (a keyword per field costs most of a line's
        making); tests/test_contracts.py holds every field to its value through the line."""
        base = self.scheduled_ns
        sent, headers, first, answer, done = (
            self.sent_ns,
            self.headers_ns,
            self.first_token_ns,
            self.first_answer_ns,
            self.done_ns,
        )
        tpot = self.tpot_us()
        return RecordLine(
            self.request_id,
            self.wire_id,
            self.scenario,
            self.api,
            self.stream,
            self.worker,
            rounded(self.scheduled_epoch, 6, 1e6),
            self.outcome,
            self.http_status,
            self.error or None,
            self.finish_reason,
            (sent - base) // 1000 if sent else None,
            (headers - base) // 1000 if headers else None,
            (first - base) // 1000 if first else None,
            (answer - base) // 1000 if answer else None,
            (done - base) // 1000 if done else None,
            None if tpot is None else rounded(tpot, 1, 10.0),
            self._chunks_us(),
            self.requested_output_tokens,
            self.prompt_tokens_client,
            self.completion_tokens_client,
            self.reasoning_tokens_client,
            self.prompt_tokens_server,
            self.completion_tokens_server,
            self.cached_tokens_server,
            self.reasoning_tokens_server,
            self.attempt,
            self.retry_of,
            self.endpoint,
            self.inputs or UNSET,  # written only when non-zero
            self.merged_gaps or UNSET,
            self.quality_failed or UNSET,  # written only when a check failed
            self.chunk_chars or UNSET,
            UNSET,  # first_chunk_tokens: written by earlier versions only
            UNSET if self.endpoints_output_tokens is None else self.endpoints_output_tokens,
            UNSET if self.endpoints_tpot_tokens is None else self.endpoints_tpot_tokens,
            UNSET if self.new_connection is None else self.new_connection,
            UNSET if self.session is None else self.session,
            True if self.session_last else UNSET,
            self.job_us or UNSET,
            UNSET if self.agentic is None else self.agentic,
        )

    @classmethod
    def from_log(cls, line: RecordLine, base_ns: int) -> RequestRecord:
        """A record-log line back into a RequestRecord (µs resolution), its times ``base_ns`` + offset.

        Everything the line holds comes back; what it never held (the answer's text, Retry-After) does not."""

        def at(us: int | None) -> int:
            return 0 if us is None else base_ns + us * 1000

        rec = cls(line.id)
        rec.wire_id = line.wire_id
        rec.scenario = line.scenario
        rec.api = line.api
        rec.stream = line.stream
        rec.worker = line.worker
        rec.scheduled_epoch = line.t
        rec.scheduled_ns = base_ns
        rec.sent_ns = at(line.sent_us)
        rec.headers_ns = at(line.headers_us)
        rec.first_token_ns = at(line.ttft_us)
        rec.first_answer_ns = at(line.first_answer_us)
        rec.done_ns = at(line.e2e_us)
        rec.chunk_ns = [base_ns + c * 1000 for c in line.chunks_us]
        rec.http_status = line.status
        rec.outcome = line.outcome
        rec.error = line.error or ""
        rec.finish_reason = line.finish_reason
        rec.requested_output_tokens = line.requested_output_tokens
        rec.prompt_tokens_client = line.prompt_tokens
        rec.completion_tokens_client = line.output_tokens
        rec.reasoning_tokens_client = line.reasoning_tokens
        rec.prompt_tokens_server = line.usage_prompt_tokens
        rec.completion_tokens_server = line.usage_completion_tokens
        rec.cached_tokens_server = line.usage_cached_tokens
        rec.reasoning_tokens_server = line.usage_reasoning_tokens
        rec.attempt = line.attempt
        rec.retry_of = line.retry_of
        rec.endpoint = line.endpoint
        rec.inputs = line.n_inputs
        rec.merged_gaps = line.n_merged_gaps
        rec.quality_failed = line.failed_checks or None
        rec.chunk_chars = line.chunk_lengths
        rec.job_us = line.job_us if isinstance(line.job_us, list) else []
        rec.endpoints_output_tokens = line.templated_output_tokens
        rec.endpoints_tpot_tokens = line.tokens_after_first
        rec.new_connection = line.opened
        rec.session = line.session if isinstance(line.session, str) else None
        rec.session_last = line.session_last is True
        rec.agentic = line.agentic if isinstance(line.agentic, AgenticTurn) else None
        return rec


_EXACT_HALVES: Final = 2.0**52  # below it, a double's integer part and its half are exact
_SPLIT: Final = 134217729.0  # 2**27 + 1: splits a double into two halves whose products are exact


def rounded(x: float, digits: int, scale: float) -> float:
    """``round(x, digits)`` (``scale``: 10 ** digits), the same double, without its decimal conversion
    (0.04 µs against 0.5). The exact product ``x * 10**digits`` rounds to the integer ``n`` nearest
    it, ties to even, and ``n / scale`` (both exact, the division correctly rounded) is the double
    ``round`` gives. ``y = x * scale`` is that product rounded: off by at most half a unit of ``y``,
    so it rounds to the same ``n`` unless it sits exactly on a half; there the sign of the product's
    rounding error (``_product_error``, exact) decides. Out of range, ``round`` itself.
    tests/test_contracts.py holds the two equal, bit for bit, on millions of values and on exact
    and near halves."""
    if x == 0.0:
        return x
    y = x * scale
    if 0.0 < y < _EXACT_HALVES:
        base = math.floor(y)
        frac = y - base
        if frac != 0.5:
            n = base + 1 if frac > 0.5 else base
        else:
            error = _product_error(x, scale, y)
            n = base + 1 if error > 0.0 or (error == 0.0 and base % 2 == 1) else base
        return n / scale
    return round(x, digits)


def _product_error(a: float, b: float, p: float) -> float:
    """``a * b - p`` exactly, where ``p`` is ``a * b`` rounded (Dekker's product: each factor split in
    two halves of 26 bits, whose products a double holds exactly)."""
    c = _SPLIT * a
    a_hi = c - (c - a)
    a_lo = a - a_hi
    c = _SPLIT * b
    b_hi = c - (c - b)
    b_lo = b - b_hi
    return ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


# The record's fields, in their order, the private cache left out (compiled, the class keeps its
# attributes' names in __mypyc_attrs__ and no annotations)
RECORD_FIELDS: tuple[str, ...] = tuple(
    name
    for name in getattr(RequestRecord, "__mypyc_attrs__", None) or inspect.get_annotations(RequestRecord)
    if not name.startswith("_")
)
_FIELD_SET = frozenset(RECORD_FIELDS)


def line_output_tokens(line: LineLike) -> int:
    """``RequestRecord.output_tokens`` of a record-log line: ``usage_completion_tokens``, else ``output_tokens``."""
    ln = as_line(line)
    return ln.usage_completion_tokens if ln.usage_completion_tokens is not None else ln.output_tokens


def line_input_tokens(line: LineLike) -> int:
    """``RequestRecord.input_tokens`` of a record-log line: ``usage_prompt_tokens``, else ``prompt_tokens``."""
    ln = as_line(line)
    return ln.usage_prompt_tokens if ln.usage_prompt_tokens is not None else ln.prompt_tokens


def merged_gap_mask(times: np.ndarray) -> np.ndarray:
    """Per gap between consecutive token events (``times``, sorted): True when the later event arrived
    in one socket read with another token event (equal times). The client saw those events at once,
    so such a gap times the client's reads, not the server's writes: ITL leaves it out and counts it
    (docs/metrics.md, "Merged gaps")."""
    same = times[1:] == times[:-1]
    merged = same.copy()
    merged[:-1] |= same[1:]
    return merged


def merged_flags(chunk_ns: list[int]) -> list[bool]:
    """``merged_gap_mask`` in plain Python, for a short stream (numpy's set-up costs more than its work)."""
    # Indexed loops: compiled, they run as C loops, where pairwise and zip are iterator objects
    last = len(chunk_ns) - 1
    same = [chunk_ns[i] == chunk_ns[i + 1] for i in range(last)]
    return [same[i] or (i + 1 < last and same[i + 1]) for i in range(last)]


def count_merged_gaps(chunk_ns: list[int] | np.ndarray) -> int:
    """How many of a record's token gaps are merged (``merged_gap_mask``)."""
    if len(chunk_ns) < 2:
        return 0
    if isinstance(chunk_ns, list) and len(chunk_ns) <= SMALL_STREAM:
        return sum(merged_flags(chunk_ns))
    times = np.asarray(chunk_ns, dtype=np.int64)
    if not (times[1:] == times[:-1]).any():
        return 0
    return int(merged_gap_mask(times).sum())
