"""The APIs the client speaks: one adapter per API (``ApiAdapter``, client/adapters/protocols.py), registered
once under each ``api`` value it serves (client/adapters/registry.py). ``OpenAIClient`` encodes, sizes and
classifies every request through the adapter of its ``api``; adding an API is one adapter module and one
line in ``_BUILTIN`` (docs/api-surface.md, "Adding an API")."""

from __future__ import annotations

from loadtest.client.adapters.chat import ChatAdapter
from loadtest.client.adapters.completions import CompletionsAdapter
from loadtest.client.adapters.embeddings import EmbeddingsAdapter
from loadtest.client.adapters.images import ImagesAdapter
from loadtest.client.adapters.kserve_v2 import KServeV2Adapter
from loadtest.client.adapters.kserve_v2_grpc import KServeV2GrpcAdapter
from loadtest.client.adapters.messages import MessagesAdapter
from loadtest.client.adapters.protocols import ApiAdapter, SelfSending
from loadtest.client.adapters.raw import RawAdapter
from loadtest.client.adapters.registry import ADAPTERS, adapter_for, register, response_cap, self_sending
from loadtest.client.adapters.rerank import RerankAdapter
from loadtest.client.adapters.responses import ResponsesAdapter
from loadtest.client.adapters.video_jobs import VideoJobsAdapter
from loadtest.client.adapters.videogen import VideoGenAdapter

__all__ = ["ADAPTERS", "ApiAdapter", "SelfSending", "adapter_for", "register", "response_cap", "self_sending"]

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
