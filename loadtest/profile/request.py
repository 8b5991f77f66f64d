"""Request shape of a profile: auth scheme, extra headers and body fields, raw replay and embeddings specs."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from loadtest.profile.base import Strict, rule_error

Api = Literal[
    "chat",
    "completions",
    "responses",
    "embeddings",
    "raw",
    "messages",
    "rerank",
    "kserve_v2",
    "kserve_v2_grpc",
    "videogen",
    "video_jobs",
    "images",
]
# APIs whose requests carry a batch of inputs (inputs_per_request)
BATCH_APIS = ("embeddings", "rerank", "kserve_v2", "kserve_v2_grpc")
# APIs that generate no output tokens: single requests without chat features
NO_OUTPUT_APIS = (*BATCH_APIS, "videogen", "video_jobs", "images")
DEFAULT_POLL_S = 1.0  # video_jobs: seconds between two polls of a job (a scenario's poll_interval_s)
# Body fields the workload itself sets: extra_body may not replace them.
WORKLOAD_FIELDS = frozenset({"model", "stream", "stream_options", "messages", "prompt", "input"})
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
SESSION_HEADER = "X-Session-ID"
_RESERVED = ("authorization", "content-length", "host", "transfer-encoding")


def header_name_error(name: str) -> str | None:
    """Why ``name`` cannot be a header loadtest sends, or None when it can."""
    if not _HEADER_NAME.match(name):
        return f"{name!r} is not a valid HTTP header name"
    if name.lower() in _RESERVED:
        return f"header {name} is set by loadtest"
    return None


class RequestSpec(Strict):
    """How every request is sent: ``auth`` scheme for the API key, extra ``headers``, ``extra_body`` fields."""

    auth: Literal["bearer", "api-key-header", "none"] = "bearer"
    auth_header: str = "api-key"  # the header carrying the key with auth: api-key-header
    # A value replaces loadtest's header of that name (X-Request-Id, Accept, ...); null removes it.
    headers: dict[str, str | None] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # The header carrying a session's id on every call of a multi-turn chat or an agent, so session-aware
    # routers can keep a conversation on one replica (the MLPerf Endpoints client's default name,
    # docs/sources.md §17); null: no such header.
    session_header: str | None = SESSION_HEADER

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        for name, value in v.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid HTTP header name")
            if value is not None and ("\r" in value or "\n" in value):
                raise ValueError(f"header {name}: a value may not contain a line break")
            if name.lower() in _RESERVED:
                raise ValueError(f"header {name} is set by loadtest (use auth: for the API key)")
        return v

    @field_validator("session_header")
    @classmethod
    def _session_header(cls, v: str | None) -> str | None:
        problem = header_name_error(v) if v is not None else None
        if problem:
            raise ValueError(f"{problem} (give a header name like {SESSION_HEADER}, or null for none)")
        return v

    @field_validator("auth_header")
    @classmethod
    def _auth_header(cls, v: str) -> str:
        if not _HEADER_NAME.match(v):
            raise ValueError(f"{v!r} is not a valid HTTP header name")
        return v

    @field_validator("extra_body")
    @classmethod
    def _extra_body(cls, v: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(WORKLOAD_FIELDS & set(v))
        if taken:
            raise ValueError(f"{', '.join(taken)} is set by the workload and cannot be an extra body field")
        return v


class RawSpec(Strict):
    """api: raw: replay the request bodies of a JSONL file (one JSON object a line) unchanged to ``path``."""

    file: str = Field(min_length=1)
    path: str = "/v1/chat/completions"

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/") or any(c.isspace() for c in v):
            raise ValueError("a URL path starting with /, e.g. /v1/chat/completions")
        return v


def check_api(sc: Any, api: str, i: int) -> None:
    """Rules that tie a scenario to its API (raises the profile's rule error naming the key)."""

    if api == "raw" and sc.raw is None:
        raise rule_error(
            "api raw needs raw: {file: bodies.jsonl, path: /v1/chat/completions}", "scenarios", i, "raw"
        )
    if api != "raw" and sc.raw is not None:
        raise rule_error(f"raw applies to api raw only (api is {api})", "scenarios", i, "raw")
    if api in ("responses", "raw", "messages", *NO_OUTPUT_APIS) and sc.kind != "chat":
        raise rule_error(
            f"the {api} api sends single requests: use kind chat (multi_turn and agent need api chat)",
            "scenarios",
            i,
            "kind",
        )
    if api in ("raw", *NO_OUTPUT_APIS) and (sc.images is not None or sc.reasoning or sc.prefix is not None):
        raise rule_error(f"images, reasoning and prefix do not apply to the {api} api", "scenarios", i, "api")
    if api == "messages" and sc.images is not None:
        raise rule_error("images do not apply to the messages api (use api: chat)", "scenarios", i, "images")
    if api != "video_jobs" and sc.poll_interval_s != DEFAULT_POLL_S:
        raise rule_error(
            f"poll_interval_s applies to api video_jobs only (api is {api})",
            "scenarios",
            i,
            "poll_interval_s",
        )
    if api not in BATCH_APIS and sc.inputs_per_request != 1:
        raise rule_error(
            "inputs_per_request applies to api embeddings, rerank, kserve_v2 and kserve_v2_grpc only (rerank:"
            " documents, kserve_v2: samples per request)",
            "scenarios",
            i,
            "inputs_per_request",
        )


def push_api(data: Any) -> Any:
    """A profile-level ``api: embeddings|rerank|kserve_v2[_grpc]|videogen|video_jobs|images|raw`` also applies to each scenario that names none (so that the
    scenario's own rules, e.g. no output_tokens for embeddings, see it)."""
    if not isinstance(data, dict) or data.get("api") not in ("raw", *NO_OUTPUT_APIS):
        return data
    scenarios = data.get("scenarios")
    if isinstance(scenarios, list):
        data = {
            **data,
            "scenarios": [{"api": data["api"], **s} if isinstance(s, dict) else s for s in scenarios],
        }
    return data
