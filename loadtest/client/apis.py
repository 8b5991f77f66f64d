"""The profile's ``request`` section on the client: auth scheme, headers, extra body fields. (Each API's
requests and answers are its adapter's: client/adapters.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadtest.client.openai import OpenAIClient
    from loadtest.profile.schema import Profile


def configure_client(client: OpenAIClient, profile: Profile) -> None:
    """Apply the profile's ``request`` section: auth scheme for the key, extra headers, the session header,
    extra body fields.

    A profile header replaces the client's header of the same name (names compare case-insensitively);
    a null value removes it, the request-id header included."""
    spec = profile.request
    headers = client._headers
    key_header = headers.pop("Authorization", None)
    if key_header is not None and spec.auth == "bearer":
        headers["Authorization"] = key_header
    elif key_header is not None and spec.auth == "api-key-header":
        headers[spec.auth_header] = key_header.removeprefix("Bearer ")
    rid = (client.request_id_header or "").lower()
    for name, value in spec.headers.items():
        for have in [h for h in headers if h.lower() == name.lower()]:
            del headers[have]
        if name.lower() == rid:
            client.request_id_header = None if value is None else name
            client.fixed_request_id = value
        elif value is not None:
            headers[name] = value
    client.session_header = spec.session_header
    client.extra_body = dict(spec.extra_body)


def auth_headers(api_key: str | None, profile: Profile) -> dict[str, str]:
    """The headers every request of ``profile`` carries: the key by its auth scheme, then its extra headers
    (what the preflight sends too, so an endpoint that wants an ``api-key`` header accepts it)."""
    spec = profile.request
    out: dict[str, str] = {}
    if api_key and spec.auth == "bearer":
        out["Authorization"] = f"Bearer {api_key}"
    elif api_key and spec.auth == "api-key-header":
        out[spec.auth_header] = api_key
    for name, value in spec.headers.items():
        for have in [h for h in out if h.lower() == name.lower()]:
            del out[have]
        if value is not None:
            out[name] = value
    return out


def extra_body(client: OpenAIClient, body: dict[str, Any]) -> None:
    """Add the profile's extra body fields (chat_template_kwargs, priority ...) to a request body."""
    if client.extra_body:
        body.update(client.extra_body)
