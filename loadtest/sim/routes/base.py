"""What one API of the embedded engine is (``ApiRoute``): its path, how a request body becomes the engine's
request, and how the answer is written, streamed (``StreamWriter``) or whole. server.py serves every
route with one of three flows: ``generate`` (the engine generates the answer's tokens), ``prefill`` (one
prefill-only pass per input, as a pooling model's forward pass: embeddings) or ``compute`` (one timed pass
of a non-LLM model from the route's cost model, one request at a time on the device: KServe v2) or ``job``
(the same pass run in the background: the POST answers with the created job, which GET {path}/{id} polls
and GET {path}/{id}/content downloads once it completed: the video job API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from loadtest.sim.protocol import GenRequest, OutputPlan
from loadtest.tokens.tokenizer import Tokenizer

Flow = Literal["generate", "prefill", "compute", "job"]


@dataclass(frozen=True)
class PrefillRequest:
    """A request the engine only prefills: token ids per input, one pass each."""

    inputs: list[list[int]]
    model: str | None


@dataclass(frozen=True)
class ComputeRequest:
    """A request served as one timed pass of a non-LLM model on the engine's device (``compute`` routes):
    its samples and the pass's time at speedup 1."""

    samples: int
    seconds: float
    model: str | None


EngineRequest = GenRequest | PrefillRequest | ComputeRequest


@dataclass
class Job:
    """A ``job`` route's request: created at once, run on the device later, polled, its content fetched."""

    id: str
    request: ComputeRequest
    created: int  # epoch seconds
    model: str
    status: str = "queued"  # queued, in_progress, completed, failed
    started_at: int | None = None
    completed_at: int | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What a whole answer says besides the request: ids, the output plan, the counts."""

    response_id: str
    created: int
    model: str
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int = 0
    with_usage: bool = True
    plan: OutputPlan | None = None  # generated answers: how the output tokens split


class StreamWriter(Protocol):
    """The SSE events of one streamed answer, rendered as the tokens come."""

    def opening(self) -> bytes:
        """The events before the first token (b"" for none)."""
        ...

    def token(self, index: int) -> str:
        """The event(s) carrying output token ``index``."""
        ...

    def framed_token(self, index: int) -> bytes:
        """``token(index)`` as one HTTP/1.1 chunk."""
        ...

    def tokens(self, first: int, n: int) -> str:
        """The ``n`` tokens from ``first`` that one step produced (speculative decoding) as one event a
        part (``OutputPlan.run_parts``: reasoning, answer), not one a token."""
        ...

    def tail(
        self, finish_reason: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int, usage: bool
    ) -> str:
        """The events that end a complete stream (``usage``: with the usage counts)."""
        ...

    def error(self, message: str, code: int = 500) -> str:
        """A mid-stream error event."""
        ...

    def malformed(self) -> str:
        """An event whose data is not valid JSON (the malformed_chunk fault)."""
        ...


class ApiRoute(Protocol):
    """One API the engine serves, registered once in sim/routes/__init__.py."""

    api: str  # its name (the client's ``api`` value)
    path: str  # the POST path
    id_prefix: str  # the start of its response ids
    flow: Flow  # how the engine serves it (server.py)

    def parse(self, body: dict[str, Any], tok: Tokenizer) -> EngineRequest:
        """The engine's request from a decoded body; RequestError (400) when malformed. ``generate``
        routes return a GenRequest, ``prefill`` routes a PrefillRequest, ``compute`` routes a
        ComputeRequest (the body carries the path's parameters too, e.g. ``model``)."""
        ...

    def writer(
        self, response_id: str, created: int, model: str, plan: OutputPlan, prompt_tokens: int
    ) -> StreamWriter:
        """The writer of a streamed answer (``generate`` routes); ``prompt_tokens`` for an opening that
        counts them (Messages' message_start)."""
        ...

    def whole(self, req: EngineRequest, answer: Answer) -> dict[str, Any]:
        """The whole (non-streamed) answer's JSON body."""
        ...


class JobRoute(ApiRoute, Protocol):
    """A ``job`` route: the job's JSON (the create answer and each poll's) and its content."""

    def job_body(self, job: Job) -> dict[str, Any]:
        """The job object a create or a poll answers with."""
        ...

    def job_content(self, job: Job) -> tuple[bytes, str]:
        """A completed job's content and its media type."""
        ...
