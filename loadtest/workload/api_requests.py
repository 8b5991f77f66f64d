"""Requests of the Responses, Messages, embeddings, rerank, KServe v2, videogen, video job and image generation APIs, and raw replay of recorded
bodies."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtest.client.openai import PreparedRequest
from loadtest.workload.lengths import sample_length
from loadtest.workload.text import synth_text

if TYPE_CHECKING:
    from loadtest.profile.schema import Scenario
    from loadtest.workload.builder import Workload

RESPONSES_PATH = "/responses"
EMBEDDINGS_PATH = "/embeddings"
THINKING_MIN_BUDGET = 1024  # the Messages API's smallest thinking budget (docs/sources.md §9)
_raw_cache: dict[str, list[str]] = {}


ApiBuilder = Callable[["Workload", "Scenario", int], PreparedRequest]


def builder_for(api: str) -> ApiBuilder | None:
    """The function that makes request ``index`` of a scenario of ``api``: a responses, messages,
    embeddings, rerank, KServe v2, videogen, video job, image or raw scenario; None for chat and
    completions, which the workload builds itself (looked up once per scenario, in its ``Plan``)."""
    return _BUILDERS.get(api)


def _responses(w: Workload, sc: Scenario, index: int) -> PreparedRequest:
    """The chat request of the same index, as a Responses API body (input messages, max_output_tokens)."""
    chat = w._single(sc.model_copy(update={"api": "chat"}), index)
    body: dict[str, Any] = dict(chat.body)
    body.pop("seed", None)  # a seed set's model seed: the Responses API takes none
    body["input"] = body.pop("messages")
    body["max_output_tokens"] = body.pop("max_tokens")
    effort = body.pop("reasoning_effort", None)
    if effort is not None:
        body["reasoning"] = {"effort": effort, "summary": "auto"}
    chat.api, chat.body = "responses", body
    return chat


def _messages(w: Workload, sc: Scenario, index: int) -> PreparedRequest:
    """The chat request of the same index as a Messages body: the system prompt as ``system``, reasoning
    as ``thinking`` with a budget under ``max_tokens`` (as the API wants) but never under its minimum."""
    chat = w._single(sc.model_copy(update={"api": "chat"}), index)
    body: dict[str, Any] = dict(chat.body)
    body.pop("seed", None)  # a seed set's model seed: the Messages API takes none
    messages = body.pop("messages")
    if messages and messages[0]["role"] == "system":
        body["system"] = messages.pop(0)["content"]
    body["messages"] = messages
    if body.pop("reasoning_effort", None) is not None:
        body["thinking"] = {
            "type": "enabled",
            "budget_tokens": max(THINKING_MIN_BUDGET, body["max_tokens"] - 1),
        }
    chat.api, chat.body = "messages", body
    return chat


def _texts(w: Workload, sc: Scenario, index: int, n: int) -> list[str]:
    """``n`` texts of the scenario's input lengths, the salt leading each."""
    assert sc.input_tokens is not None
    rng = random.Random(f"{w.seed}:{index}")
    lead = w.salt_lead(sc, index)  # the per-query salt or the run salt (workload/salt.py)
    lead_tokens = w.tokenizer.count(lead) if lead else 0
    return [
        lead + synth_text(max(1, sample_length(sc.input_tokens, rng) - lead_tokens), rng, w.tokenizer)
        for _ in range(n)
    ]


def _rerank(w: Workload, sc: Scenario, index: int) -> PreparedRequest:
    """A query and ``inputs_per_request`` documents, each of the scenario's input length; every document is
    scored with the query, so the prompt tokens are the pairs'."""
    query, *documents = _texts(w, sc, index, 1 + sc.inputs_per_request)
    q = w.tokenizer.count(query)
    return PreparedRequest(
        request_id=f"{w.seed:x}-{index}",
        api="rerank",
        body={"query": query, "documents": documents},
        prompt_tokens=sum(q + w.tokenizer.count(d) for d in documents),
        requested_output_tokens=None,
        scenario=sc.name,
        stream=False,
    )


def _kserve_v2(w: Workload, sc: Scenario, index: int, api: str) -> PreparedRequest:
    """One query of ``inputs_per_request`` samples as a v2 inference request: one FP32 input tensor of
    shape [samples, features] (features: the scenario's input length), seeded values; over REST or gRPC."""
    assert sc.input_tokens is not None
    rng = random.Random(f"{w.seed}:{index}")
    features = sample_length(sc.input_tokens, rng)
    n = sc.inputs_per_request
    data = [round(rng.random(), 4) for _ in range(n * features)]
    tensor = {"name": "features", "shape": [n, features], "datatype": "FP32", "data": data}
    return PreparedRequest(
        request_id=f"{w.seed:x}-{index}",
        api=api,
        body={"inputs": [tensor]},
        prompt_tokens=0,  # tensors, not tokens
        requested_output_tokens=None,
        scenario=sc.name,
        stream=False,
    )


def _videogen(w: Workload, sc: Scenario, index: int, api: str) -> PreparedRequest:
    """One video's or image's prompt of the scenario's input length (the generation fields come from the profile's
    ``request.extra_body``, else the server's defaults); a job API's poll interval."""
    (prompt,) = _texts(w, sc, index, 1)
    return PreparedRequest(
        request_id=f"{w.seed:x}-{index}",
        api=api,
        poll_s=sc.poll_interval_s if api == "video_jobs" else None,
        body={"prompt": prompt},
        prompt_tokens=w.tokenizer.count(prompt),
        requested_output_tokens=None,
        scenario=sc.name,
        stream=False,
    )


def _embeddings(w: Workload, sc: Scenario, index: int) -> PreparedRequest:
    assert sc.input_tokens is not None
    rng = random.Random(f"{w.seed}:{index}")
    lead = w.salt_lead(sc, index)  # the per-query salt or the run salt (workload/salt.py)
    inputs = []
    for _ in range(sc.inputs_per_request):
        n = max(1, sample_length(sc.input_tokens, rng) - (w.tokenizer.count(lead) if lead else 0))
        inputs.append(lead + synth_text(n, rng, w.tokenizer))
    return PreparedRequest(
        request_id=f"{w.seed:x}-{index}",
        api="embeddings",
        body={"input": inputs},
        prompt_tokens=sum(w.tokenizer.count(t) for t in inputs),
        requested_output_tokens=None,
        scenario=sc.name,
        stream=False,
    )


def raw_bodies(path: str) -> list[str]:
    """The JSON-object lines of a raw replay file (cached); ValueError names the file and line."""
    lines = _raw_cache.get(path)
    if lines is None:
        lines = []
        text = Path(path).read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ValueError(f"raw.file {path}: line {n} is not JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"raw.file {path}: line {n} is not a JSON object (one request body a line)")
            lines.append(line.strip())
        if not lines:
            raise ValueError(f"raw.file {path}: no request body in it (one JSON object a line)")
        _raw_cache[path] = lines
    return lines


def _count_prompt(w: Workload, body: dict[str, Any]) -> int:
    try:
        if isinstance(body.get("messages"), list):
            return w.tokenizer.count_chat(body["messages"])
        for key in ("prompt", "input"):
            v = body.get(key)
            if isinstance(v, str):
                return w.tokenizer.count(v)
            if isinstance(v, list) and all(isinstance(x, str) for x in v):
                return sum(w.tokenizer.count(x) for x in v)
    except (TypeError, ValueError, KeyError):
        return 0
    return 0


def _raw(w: Workload, sc: Scenario, index: int) -> PreparedRequest:
    assert sc.raw is not None
    bodies = raw_bodies(sc.raw.file)
    line = bodies[index % len(bodies)]
    body = json.loads(line)
    n_out = next(
        (body[k] for k in ("max_completion_tokens", "max_tokens", "max_output_tokens") if k in body), None
    )
    return PreparedRequest(
        request_id=f"{w.seed:x}-{index}",
        api="raw",
        body={"raw": line},  # sent byte for byte as recorded
        prompt_tokens=_count_prompt(w, body),
        requested_output_tokens=n_out if isinstance(n_out, int) else None,
        scenario=sc.name,
        stream=bool(body.get("stream", False)),
        path=sc.raw.path,
    )


_BUILDERS: dict[str, ApiBuilder] = {
    "responses": _responses,
    "messages": _messages,
    "embeddings": _embeddings,
    "rerank": _rerank,
    **{api: partial(_kserve_v2, api=api) for api in ("kserve_v2", "kserve_v2_grpc")},
    **{api: partial(_videogen, api=api) for api in ("videogen", "video_jobs", "images")},
    "raw": _raw,
}
