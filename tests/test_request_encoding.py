"""The request bytes made from the per-client cached parts are the bytes built whole, header for header."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from loadtest.client.apis import configure_client
from loadtest.client.openai import OpenAIClient, PreparedRequest, new_wire_id
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


def test_wire_ids_are_distinct_version_4_uuids_and_a_forked_child_draws_its_own() -> None:
    ids = [new_wire_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for text in (ids[0], ids[-1]):
        u = uuid.UUID(text)
        assert (u.version, u.variant, str(u)) == (4, uuid.RFC_4122, text)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child writes its first id and leaves at once
        os.write(write, new_wire_id().encode())
        os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 100).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    # the same counter would give the parent's next id; the child drew a prefix of its own
    assert child[:24] != ids[-1][:24] and uuid.UUID(child).version == 4
