"""The request bytes made from the per-client cached parts are the bytes built whole, header for header."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.client.apis import configure_client
from loadtest.client.openai import OpenAIClient, PreparedRequest
from loadtest.profile.loader import parse_profile
from loadtest.tokens.tokenizer import get_tokenizer

BODIES = {
    "chat": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "completions": {"prompt": "hi", "max_tokens": 4},
    "responses": {"input": "hi", "max_output_tokens": 4},
    "embeddings": {"input": ["hi"]},
}

REQUEST_SECTIONS = [
    {},
    {"auth": "api-key-header", "headers": {"X-Tenant": "t1", "Accept": "application/json"}},
    {"headers": {"X-Request-Id": None}, "session_header": "X-Session-Id"},
    {"headers": {"X-Request-Id": "fixed-id"}, "session_header": "X-Session-Id"},
]


def _client(section: dict[str, object], host: str) -> OpenAIClient:
    profile = parse_profile(
        {
            "name": "p",
            "input_tokens": {"dist": "fixed", "value": 4},
            "output_tokens": {"dist": "fixed", "value": 4},
            "request": section,
        },
        Path("p.yaml"),
    )
    client = OpenAIClient(host, "m", get_tokenizer("llama3"), api_key="sk-test")
    configure_client(client, profile)
    return client


@pytest.mark.parametrize("section", REQUEST_SECTIONS)
@pytest.mark.parametrize("host", ["http://127.0.0.1:9", "https://api.example.com/v1/chat/completions?x=1"])
def test_cached_request_bytes_equal_the_whole_build(section: dict[str, object], host: str) -> None:
    client = _client(section, host)
    for api, body in BODIES.items():
        for session in (None, "", "conv-1"):
            for extra in ({}, {"X-Extra": "1"}):
                req = PreparedRequest("r1", api, body, 1, 4, session=session, extra_headers=extra)
                first = client.encode(req)
                # the cached parts are made by the first request: the second is built from them
                again, whole = client.encode(req), client.encode_whole(req)
                if client.fixed_request_id or client.request_id_header is None:
                    assert first == again == whole, (api, session, extra)
                else:  # a fresh wire id each time: equal once the ids are aligned
                    head, _, _ = whole.partition(b"X-Request-Id: ")
                    assert again.startswith(head) and len(again) == len(whole)
                    wire_id = again[len(head) :].split(b"\r\n", 1)[0]
                    assert again == whole.replace(whole[len(head) :].split(b"\r\n", 1)[0], wire_id)
                    assert first != again  # never the same id twice
