"""The embeddings API (/v1/embeddings): parse batched inputs, a prefill-only engine pass per input, the list."""

from __future__ import annotations

import hashlib
from typing import Any

from loadtest.sim.protocol import RequestError
from loadtest.tokens.tokenizer import Tokenizer

EMBEDDINGS_PATH = "/v1/embeddings"
DEFAULT_DIMENSIONS = 8


def parse_embeddings_request(body: dict[str, Any], tok: Tokenizer) -> tuple[list[list[int]], str | None, int]:
    """(token ids per input, model, dimensions) of a decoded body; RequestError (400) when malformed."""
    given = body.get("input")
    if isinstance(given, str) and given:
        inputs = [tok.encode(given)]
    elif isinstance(given, list) and given and all(isinstance(x, int) for x in given):
        inputs = [list(given)]
    elif isinstance(given, list) and given and all(isinstance(x, str) for x in given):
        inputs = [tok.encode(x) or [0] for x in given]
    elif isinstance(given, list) and given and all(isinstance(x, list) for x in given):
        inputs = [list(x) or [0] for x in given]
    else:
        raise RequestError(
            400,
            "'input' is required: a string, a list of strings, or token ids",
            "missing_required_parameter",
            "input",
        )
    dims = body.get("dimensions", DEFAULT_DIMENSIONS)
    if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= 4096:
        raise RequestError(
            400, "'dimensions' must be an integer from 1 to 4096", "invalid_value", "dimensions"
        )
    model = body.get("model")
    return inputs, model if isinstance(model, str) else None, dims


def vector(ids: list[int], dims: int) -> list[float]:
    """A deterministic unit-less vector for one input (the same ids give the same vector)."""
    digest = hashlib.blake2b(str(ids).encode(), digest_size=32).digest()
    return [round((digest[k % 32] - 127.5) / 127.5, 4) for k in range(dims)]


def embeddings_body(inputs: list[list[int]], model: str, dims: int) -> dict[str, Any]:
    n = sum(len(i) for i in inputs)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": k, "embedding": vector(ids, dims)}
            for k, ids in enumerate(inputs)
        ],
        "model": model,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    }
