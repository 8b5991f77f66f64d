"""The APIs the client speaks: one adapter per API (``ApiAdapter``, client/adapters/base.py), registered once
under each ``api`` value it serves. ``OpenAIClient`` encodes, sizes and classifies every request through
the adapter of its ``api``; adding an API is one adapter module and one line in ``_BUILTIN``
(docs/api-surface.md, "Adding an API")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadtest.client.adapters.base import size_cap
from loadtest.client.adapters.chat import ChatAdapter
from loadtest.client.adapters.completions import CompletionsAdapter
from loadtest.client.adapters.embeddings import EmbeddingsAdapter
from loadtest.client.adapters.images import ImagesAdapter
from loadtest.client.adapters.kserve_v2 import KServeV2Adapter
from loadtest.client.adapters.kserve_v2_grpc import KServeV2GrpcAdapter
from loadtest.client.adapters.messages import MessagesAdapter
from loadtest.client.adapters.protocols import ApiAdapter, SelfSending
from loadtest.client.adapters.raw import RawAdapter
from loadtest.client.adapters.rerank import RerankAdapter
from loadtest.client.adapters.responses import ResponsesAdapter
from loadtest.client.adapters.video_jobs import VideoJobsAdapter
from loadtest.client.adapters.videogen import VideoGenAdapter

if TYPE_CHECKING:
    from loadtest.client.openai import PreparedRequest

__all__ = ["ADAPTERS", "ApiAdapter", "SelfSending", "adapter_for", "register", "response_cap", "self_sending"]

ADAPTERS: dict[str, ApiAdapter] = {}
# Per api: the adapter last looked at and itself again when it is SelfSending, else None (a runtime
# Protocol check walks the protocol's members: once per adapter, not once per request).
_SENDERS: dict[str, tuple[ApiAdapter, SelfSending | None]] = {}


def register(adapter: ApiAdapter) -> ApiAdapter:
    """Serve each of ``adapter.names`` with it; a name already taken is an error."""
    for name in adapter.names:
        if name in ADAPTERS:
            raise ValueError(f"api {name!r} has an adapter already ({type(ADAPTERS[name]).__name__})")
        ADAPTERS[name] = adapter
    return adapter


def adapter_for(api: str) -> ApiAdapter:
    """The adapter of a request's ``api`` (KeyError for an api no adapter serves)."""
    return ADAPTERS[api]


def self_sending(api: str) -> SelfSending | None:
    """The adapter of ``api`` when it has its own transport (``SelfSending``: gRPC), else None."""
    adapter = ADAPTERS[api]
    known = _SENDERS.get(api)
    if known is None or known[0] is not adapter:
        known = _SENDERS[api] = (adapter, adapter if isinstance(adapter, SelfSending) else None)
    return known[1]


def response_cap(req: PreparedRequest) -> int:
    """The size cap of ``req``'s response in bytes (docs/reliability.md, "Bounded resources")."""
    return size_cap(req.requested_output_tokens, ADAPTERS[req.api].capped_by_tokens)


_BUILTIN: tuple[ApiAdapter, ...] = (
    ChatAdapter(),
    CompletionsAdapter(),
    ResponsesAdapter(),
    EmbeddingsAdapter(),
    RawAdapter(),
    MessagesAdapter(),
    RerankAdapter(),
    KServeV2Adapter(),
    KServeV2GrpcAdapter(),
    VideoGenAdapter(),
    VideoJobsAdapter(),
    ImagesAdapter(),
)
for _adapter in _BUILTIN:
    register(_adapter)
