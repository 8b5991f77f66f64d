"""The adapters by ``api`` value: ``register`` one, ``adapter_for`` a request's; compiled, as every request
looks its adapter up (loadtest/compiled.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadtest.client.adapters.base import size_cap
from loadtest.client.adapters.protocols import ApiAdapter, SelfSending

if TYPE_CHECKING:
    from loadtest.client.openai import PreparedRequest

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
