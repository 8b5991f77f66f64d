"""Checks an endpoint before a run: reachable, speaks the OpenAI API, serves a model. One clear line if not."""

from __future__ import annotations

import difflib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loadtest.client.http import Endpoint

# `--endpoint-check`: "models" (GET /v1/models, a JSON model list), "none" (no check at all), or a path
# such as /health (GET it from the server's root: any 2xx passes). Servers whose /v1/models is not a
# JSON list (mock servers answering every path with a stream) need one of the last two.
CHECK_MODELS, CHECK_NONE = "models", "none"


MODELS_SHOWN = 20  # the served models a "not served" error lists


class EndpointError(Exception):
    """The endpoint cannot be load-tested; the message is one line for the user."""


class ModelNotServed(EndpointError):
    """The model the run asks for is not in the endpoint's /v1/models list (bad input: the line, then the
    models it serves)."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One entry of ``/v1/models``: its id and, when the server says (vLLM, SGLang), its context window."""

    id: str
    max_model_len: int | None = None
    root: str | None = None  # vLLM: the path or hub id the weights came from


def check_mode(value: str) -> str:
    """Validate an ``--endpoint-check`` value; ValueError naming the forms it takes."""
    if value in (CHECK_MODELS, CHECK_NONE) or (value.startswith("/") and " " not in value):
        return value
    raise ValueError(f"{value!r}: use models, none, or a path such as /health")


def served_models(
    host: str,
    api_key: str | None = None,
    timeout: float = 10.0,
    verify_tls: bool = True,
    headers: Mapping[str, str] | None = None,
    check: str = CHECK_MODELS,
) -> list[ServedModel]:
    """GET {host}/v1/models and return what it lists, or raise EndpointError saying what is wrong.

    ``headers``: what the run's requests carry (the profile's auth scheme and extra headers); without
    them the key goes as a Bearer token. ``check``: see CHECK_MODELS; "none" and a path return []."""
    try:
        ep = Endpoint.parse(host)
    except ValueError as e:
        raise EndpointError(str(e)) from e
    if check == CHECK_NONE:
        return []
    url = f"{ep.origin}{check}" if check != CHECK_MODELS else f"{ep.origin}{ep.api_prefix}/models"
    body, ctype = _get(url, ep, api_key, timeout, verify_tls, headers)
    if check != CHECK_MODELS:
        return []
    try:
        obj = json.loads(body)
        return [_served(m) for m in obj["data"]]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise EndpointError(
            f"{url} is not an OpenAI-compatible endpoint (expected a JSON model list, got "
            f"{ctype or 'no content-type'}); if the server has no model list, pass --endpoint-check none "
            "(or a path to check instead, e.g. --endpoint-check /health) and --model"
        ) from e


def require_served(model: str | None, served: Sequence[ServedModel], host: str, given_by: str) -> None:
    """ModelNotServed when ``model`` is not one of the ids ``served`` lists (nothing listed: no check, e.g.
    --endpoint-check none). ``given_by``: where the model was named (--model, the profile's model)."""
    ids = [m.id for m in served]
    if model is None or not ids or model in ids:
        return
    close = (
        difflib.get_close_matches(model, ids, n=1, cutoff=0.6)
        or [i for i in ids if i.lower() == model.lower() or i.rsplit("/", 1)[-1] == model.rsplit("/", 1)[-1]][
            :1
        ]
    )
    hint = f" (did you mean {close[0]}?)" if close else ""
    more = f", … ({len(ids) - MODELS_SHOWN} more)" if len(ids) > MODELS_SHOWN else ""
    raise ModelNotServed(
        f"{given_by} {model!r} is not served by {host}{hint}: give one of the models its /v1/models lists "
        f"({given_by}), or --endpoint-check none to skip this check\n"
        f"  served: {', '.join(ids[:MODELS_SHOWN])}{more}"
    )


def _served(entry: Mapping[str, object]) -> ServedModel:
    length = entry.get("max_model_len") or entry.get("context_length") or entry.get("max_context_length")
    root = entry.get("root")
    return ServedModel(
        str(entry["id"]),
        int(length) if isinstance(length, int | float) and length > 0 else None,
        str(root) if root else None,
    )


def _get(
    url: str,
    ep: Endpoint,
    api_key: str | None,
    timeout: float,
    verify_tls: bool,
    headers: Mapping[str, str] | None,
) -> tuple[bytes, str]:
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
            return resp.read(1 << 20), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise EndpointError(
                f"{url} answered HTTP {e.code}: check the API key (--api-key-env / --api-key-file) "
                "and the profile's request.auth scheme"
            ) from e
        raise EndpointError(
            f"{url} answered HTTP {e.code}: is this an OpenAI-compatible endpoint? "
            "(--endpoint-check none or PATH skips or replaces this check)"
        ) from e
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", e)
        hint = (
            " (the server's TLS certificate is not trusted: fix it, or pass --insecure knowingly)"
            if isinstance(why, ssl.SSLCertVerificationError)
            else ""
        )
        raise EndpointError(f"cannot reach {ep.origin}: {why}{hint}") from e
