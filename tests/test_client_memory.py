"""A finished response is freed the moment its request is done, whatever the server did.

The client's objects for one response (the Response with every body read, its parser callbacks) must
form no reference cycle: a cycle waits for the cyclic collector, which the generator runs rarely, and a
stream of 50 MB answers then held several of them at once (tests/bench/bench_response_memory.py
prints the peak). The check runs with the collector off, over every way a response can end.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.fault_servers import FaultServer

PROBE = r"""
from gevent import monkey; monkey.patch_all()
import gc, json, sys
from loadtest.client.http import Response
from loadtest.client.openai import OpenAIClient, PreparedRequest, Timeouts
from loadtest.tokens.tokenizer import get_tokenizer

gc.disable()
client = OpenAIClient(sys.argv[1], None, get_tokenizer("llama3"), timeouts=Timeouts(connect=2, read=1))
body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
outcomes = []
for i in range(int(sys.argv[2])):
    rec = client.send(PreparedRequest(f"m{i}", "chat", body, 1, 4), 0, 0.0)
    outcomes.append(rec.outcome)
    del rec
    alive = sum(1 for o in gc.get_objects() if isinstance(o, Response)) - 1  # less the idle stand-in
    if alive:
        print(json.dumps({"alive": alive, "after": outcomes[-1]}))
        sys.exit(1)
print(json.dumps({"outcomes": outcomes}))
"""

ENDINGS = [
    "ok",
    "json_not_sse",
    "html_502",
    "continue_100",
    "switching_101",
    "trailing_503",
    "gzip_stream",
    "big_event",
    "huge_header",
    "endless_stream",
    "stall_after_headers",
    "never_answer",
    "invalid_utf8",
]


def test_no_response_outlives_its_request_without_the_cyclic_collector() -> None:
    with FaultServer(ENDINGS) as srv:
        res = subprocess.run(
            [sys.executable, "-c", PROBE, srv.base_url, str(len(ENDINGS))],
            capture_output=True,
            text=True,
            timeout=120,
        )
        served = list(srv.truth.values())
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    outcomes = json.loads(res.stdout.splitlines()[-1])["outcomes"]
    assert sorted(served) == sorted(ENDINGS)  # every way of ending was exercised
    assert {"ok", "protocol_error", "timeout", "http_5xx", "stream_error"} <= set(outcomes)
