"""Speculative-decoding acceptance from vLLM's spec-decode counters between two scrapes (run.json telemetry)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadtest.telemetry.scrape import Scrape

# vLLM's counters (vllm/v1/spec_decode/metrics.py, docs/sources.md §25), as exposed with `_total`.
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
# The sample names a scrape keeps for them (scrape.WANTED), also without `_total`.
SPEC_NAMES = frozenset(
    n for c in (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS) for n in (c, c.removesuffix("_total"))
)


def spec_decode_summary(first: Scrape | None, last: Scrape | None) -> dict[str, Any] | None:
    """Drafts, draft and accepted tokens between ``first`` and ``last``, vLLM's acceptance rate
    (accepted ÷ draft tokens) and mean acceptance length (1 + accepted ÷ drafts); None when the server
    has no such counters or drafted nothing in between (speculative decoding off)."""
    if first is None or last is None:
        return None
    names = (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS)
    if not all(n in last.total for n in names):
        return None
    drafts, draft_tokens, accepted = (last.total[n] - first.total.get(n, 0.0) for n in names)
    if drafts <= 0 or draft_tokens <= 0 or accepted < 0:  # off, idle, or a restarted server
        return None
    return {
        "drafts": int(drafts),
        "draft_tokens": int(draft_tokens),
        "accepted_tokens": int(accepted),
        "acceptance_rate": round(accepted / draft_tokens, 4),
        "mean_acceptance_length": round(1.0 + accepted / drafts, 4),
    }
