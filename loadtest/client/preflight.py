"""Checks an endpoint before a run: reachable, speaks the OpenAI API, serves a model. One clear line if not."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping

from loadtest.client.http import Endpoint


class EndpointError(Exception):
    """The endpoint cannot be load-tested; the message is one line for the user."""


def list_models(
    host: str,
    api_key: str | None = None,
    timeout: float = 10.0,
    verify_tls: bool = True,
    headers: Mapping[str, str] | None = None,
) -> list[str]:
    """GET {host}/v1/models and return the model ids, or raise EndpointError saying what is wrong.

    ``headers``: what the run's requests carry (the profile's auth scheme and extra headers); without
    them the key goes as a Bearer token."""
    try:
        ep = Endpoint.parse(host)
    except ValueError as e:
        raise EndpointError(str(e)) from e
    url = f"{ep.origin}{ep.api_prefix}/models"
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    if headers is not None:
        for name, value in headers.items():
            req.add_header(name, value)
    elif api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    ctx = None
    if ep.scheme == "https" and not verify_tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            body = resp.read(1 << 20)
            ctype = resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise EndpointError(
                f"{url} answered HTTP {e.code}: check the API key (--api-key-env / --api-key-file) "
                "and the profile's request.auth scheme"
            ) from e
        raise EndpointError(f"{url} answered HTTP {e.code}: is this an OpenAI-compatible endpoint?") from e
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", e)
        hint = (
            " (the server's TLS certificate is not trusted: fix it, or pass --insecure knowingly)"
            if isinstance(why, ssl.SSLCertVerificationError)
            else ""
        )
        raise EndpointError(f"cannot reach {ep.origin}: {why}{hint}") from e
    try:
        obj = json.loads(body)
        models = [str(m["id"]) for m in obj["data"]]
    except (ValueError, KeyError, TypeError) as e:
        raise EndpointError(
            f"{url} is not an OpenAI-compatible endpoint (expected a JSON model list, got {ctype or 'no content-type'})"
        ) from e
    return models
