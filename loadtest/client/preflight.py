"""Checks an endpoint before a run: reachable, speaks the OpenAI API, serves a model. One clear line if not."""

from __future__ import annotations

import difflib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadtest.client.adapters import adapter_for
from loadtest.client.adapters.kserve_v2_grpc import SCHEME as GRPC_SCHEME
from loadtest.client.adapters.kserve_v2_grpc import server_ready
from loadtest.client.apis import auth_headers
from loadtest.client.http import Endpoint
from loadtest.client.network import NetworkPolicy, unreachable
from loadtest.client.secrets import snippet

if TYPE_CHECKING:
    from loadtest.profile.schema import Profile

# `--endpoint-check`: "models" (GET /v1/models, a JSON model list), "none" (no check at all), or a path
# such as /health (GET it from the server's root: any 2xx passes). Servers whose /v1/models is not a
# JSON list (mock servers answering every path with a stream) need one of the last two.
CHECK_MODELS, CHECK_NONE = "models", "none"


MODELS_SHOWN = 20  # the served models a "not served" error lists
# what a server of each API is called in a refused check's line (the others: OpenAI-compatible)
API_SERVERS = {"messages": "an Anthropic Messages", "rerank": "a rerank (Cohere/Jina-shaped)"}
SERVER_TEXT = 200  # the characters of a server's own error text an error line shows (redacted)


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
    network: NetworkPolicy | None = None,
    headers: Mapping[str, str] | None = None,
    check: str = CHECK_MODELS,
    api: str = "chat",
) -> list[ServedModel]:
    """GET {host}/v1/models and return what it lists, or raise EndpointError saying what is wrong.

    ``network``: the run's proxies and TLS policy (client/network.py); ``headers``: what the run's
    requests carry (``check_headers``); without them the key goes as a Bearer token. ``check``: see
    CHECK_MODELS; "none" and a path return []. ``api``: the profile's, named when the server refuses. The models URL is under the host's API prefix, with the
    host's query string (docs/api-surface.md, "Endpoint URLs")."""
    try:
        ep = Endpoint.parse(host)
    except ValueError as e:
        raise EndpointError(str(e)) from e
    if check == CHECK_NONE:
        return []
    if ep.scheme == GRPC_SCHEME:  # KServe v2 over gRPC: its ServerReady call; no model list to read
        if (why := server_ready(ep, timeout)) is not None:
            raise EndpointError(f"{host} is not a ready KServe v2 gRPC server ({why}); is the port right?")
        return []
    url = f"{ep.origin}{check}" if check != CHECK_MODELS else f"{ep.origin}{ep.api_prefix}/models{ep.query}"
    body, ctype = _get(url, ep, api_key, timeout, network or NetworkPolicy(), headers, api)
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


def check_headers(api_key: str | None, profile: Profile) -> dict[str, str]:
    """What the check sends: the run's auth and extra headers (``apis.auth_headers``), then the
    headers each of the profile's APIs requires unless the profile names them (Messages:
    ``anthropic-version``)."""
    out = auth_headers(api_key, profile)
    for api in dict.fromkeys([profile.api, *(s.api for s in profile.scenarios if s.api)]):
        try:
            defaults = adapter_for(api).default_headers
        except (KeyError, ValueError):
            continue
        have = {h.lower() for h in out}
        out.update((k, v) for k, v in defaults if k.lower() not in have)
    return out


def server_text(body: bytes) -> str:
    """A server's own error text, bounded and redacted: the JSON ``error.message`` (or ``message``,
    ``detail``) when the body has one, else its start; "" when empty."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        for found in (
            err.get("message") if isinstance(err, dict) else err,
            obj.get("message"),
            obj.get("detail"),
        ):
            if isinstance(found, str) and found.strip():
                return snippet(found.encode(), SERVER_TEXT)
    return snippet(body, SERVER_TEXT) if body.strip() else ""


def _get(
    url: str,
    ep: Endpoint,
    api_key: str | None,
    timeout: float,
    network: NetworkPolicy,
    headers: Mapping[str, str] | None,
    api: str,
) -> tuple[bytes, str]:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    if headers is not None:
        for name, value in headers.items():
            req.add_header(name, value)
    elif api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    proxy = network.proxy_for(url)
    try:
        with network.opener(url).open(req, timeout=timeout) as resp:
            return resp.read(1 << 20), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        try:
            said = server_text(e.read(1 << 16))
        except OSError:
            said = ""
        said = f" ({said})" if said else ""
        if e.code in (401, 403):
            raise EndpointError(
                f"{url} answered HTTP {e.code}{said}: check the API key (--api-key-env / --api-key-file) "
                "and the profile's request.auth scheme"
            ) from e
        if e.code == 407 and proxy is not None:
            raise EndpointError(
                unreachable(proxy, ep.origin, f"HTTP 407 proxy authentication required{said}")
            ) from e
        raise EndpointError(
            f"{url} answered HTTP {e.code}{said}: is this {API_SERVERS.get(api, 'an OpenAI-compatible')} endpoint? "
            "(--endpoint-check none or PATH skips or replaces this check)"
        ) from e
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", e)
        if isinstance(why, ssl.SSLCertVerificationError):
            where = f" with {network.ca_file_source} {network.ca_file}" if network.ca_file else ""
            raise EndpointError(
                f"cannot reach {ep.origin}: {why} (the server's TLS certificate is not trusted{where}: "
                "give its CA with --ca-bundle FILE, or pass --insecure knowingly)"
            ) from e
        if proxy is not None and not isinstance(why, ssl.SSLError):
            raise EndpointError(unreachable(proxy, ep.origin, why)) from e
        raise EndpointError(f"cannot reach {ep.origin}: {why}") from e
