"""Content hashes of a request's full KV blocks (chained, like vLLM's prefix-cache keys)."""

from __future__ import annotations

from loadtest.sim.request import SimRequest


def block_content(req: SimRequest, start: int, end: int) -> tuple[object, ...]:
    """What tokens [start, end) of ``req`` are, for hashing.

    Prompt positions use ``prompt_ids``; a count-only prompt and generated tokens (whose ids the
    engine never sees) use markers unique to the request, so they only match the request itself
    (a preempted request recomputing its own blocks).
    """
    p = req.prompt_tokens
    parts: list[object] = []
    if start < p:
        stop = min(end, p)
        if req.prompt_ids is not None:
            parts.extend(req.prompt_ids[start:stop])
        else:
            parts.append(("prompt", req.uid, start, stop))
    if end > p:
        parts.append(("output", req.uid, max(start, p) - p, end - p))
    return tuple(parts)


def extend_block_hashes(req: SimRequest, n_blocks: int, block_size: int) -> list[int]:
    """``req.block_hashes`` grown to at least ``n_blocks`` entries (only full, known blocks)."""
    hashes = req.block_hashes
    n_blocks = min(n_blocks, req.num_tokens // block_size)
    parent = hashes[-1] if hashes else 0
    for k in range(len(hashes), n_blocks):
        parent = hash((parent, block_content(req, k * block_size, (k + 1) * block_size)))
        hashes.append(parent)
    return hashes
