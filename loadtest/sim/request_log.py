"""The last requests' extra headers, body fields and text digests, so a test can see what a client really sent."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

STANDARD_HEADERS = frozenset(
    {"host", "content-length", "content-type", "accept", "connection", "user-agent", "accept-encoding"}
)
AUTH_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})
BULKY_FIELDS = frozenset({"messages", "input", "prompt", "tools", "system", "query", "documents"})


class Incoming(Protocol):
    """What the log reads of a request: its path and headers (an aiohttp request, or a gRPC call's)."""

    @property
    def path(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _text_digests(body: dict[str, Any] | None) -> dict[str, Any]:
    """sha256 of each message's text (with its role) and of a text prompt: the text checked, not kept."""
    out: dict[str, Any] = {}
    messages = body.get("messages") if body is not None else None
    if isinstance(messages, list):
        out["messages"] = [
            {"role": str(m.get("role")), "sha256": _sha256(_text(m.get("content")))}
            for m in messages
            if isinstance(m, dict)
        ]
    prompt = body.get("prompt") if body is not None else None
    if isinstance(prompt, str):
        out["prompt_sha256"] = _sha256(prompt)
    return out


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _redact(value: str) -> str:
    scheme, _, rest = value.partition(" ")
    return f"{scheme} <{len(rest)} chars>" if rest else f"<{len(value)} chars>"


class RequestLog:
    """A bounded list of ``{path, headers, body, sha256}`` per request (bulky fields left out; a chat
    body adds ``messages``: each message's role and text sha256; a completions body ``prompt_sha256``)."""

    def __init__(self, size: int = 512) -> None:
        self._items: deque[dict[str, Any]] = deque(maxlen=size)

    def add(self, request: Incoming, raw: bytes, body: dict[str, Any] | None) -> None:
        """``body``: the request's decoded JSON object (None when it was not one)."""
        headers = {}
        for name, value in request.headers.items():
            low = name.lower()
            if low in STANDARD_HEADERS:
                continue
            headers[low] = _redact(value) if low in AUTH_HEADERS or "key" in low else value
        fields = {k: v for k, v in body.items() if k not in BULKY_FIELDS} if body is not None else None
        self._items.append(
            {
                "path": request.path,
                "headers": headers,
                "body": fields,
                "sha256": hashlib.sha256(raw).hexdigest(),
                **_text_digests(body),
            }
        )

    def items(self) -> list[dict[str, Any]]:
        return list(self._items)
