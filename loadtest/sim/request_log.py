"""The last requests' extra headers and body fields, so a test can see what a client really sent."""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

from aiohttp import web

STANDARD_HEADERS = frozenset(
    {"host", "content-length", "content-type", "accept", "connection", "user-agent", "accept-encoding"}
)
AUTH_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})
BULKY_FIELDS = frozenset({"messages", "input", "prompt", "tools", "system", "query", "documents"})


def _redact(value: str) -> str:
    scheme, _, rest = value.partition(" ")
    return f"{scheme} <{len(rest)} chars>" if rest else f"<{len(value)} chars>"


class RequestLog:
    """A bounded list of ``{path, headers, body, sha256}`` per request (bulky fields left out)."""

    def __init__(self, size: int = 512) -> None:
        self._items: deque[dict[str, Any]] = deque(maxlen=size)

    def add(self, request: web.Request, raw: bytes, body: dict[str, Any] | None) -> None:
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
            }
        )

    def items(self) -> list[dict[str, Any]]:
        return list(self._items)
