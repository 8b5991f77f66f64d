"""The run's prefix-cache hit rate (server telemetry, else the records' cached tokens) and the warm-cache warning."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Above this share of prompt tokens answered by the prefix cache, a run whose profile asks for no
# shared prefixes measured a warm server (the same prompts sent before, or another tenant's): its
# TTFT is a cache-hit figure, not the cold prefill the profile describes.
WARM_THRESHOLD = 0.5
REUSE_KINDS = {"multi_turn": "multi-turn sessions resend their history", "agent": "agent sessions share a prefix",
               "trace": "trace replays reuse recorded prefixes",
               "agent_trace": "recorded agent sessions resend their history"}  # fmt: skip


def expected_reuse(profile: dict[str, Any] | None) -> str | None:
    """Why the profile itself asks for prefix reuse (shared prefixes, sessions, agents, traces, raw
    replays, datasets), or None when it asks for none. A shared system prompt alone does not count."""
    for sc in (profile or {}).get("scenarios") or []:
        if not isinstance(sc, dict):
            continue
        name = sc.get("name") or "?"
        if sc.get("prefix"):
            return f"scenario {name} has shared prefixes"
        if sc.get("kind") in REUSE_KINDS:
            return f"scenario {name}: {REUSE_KINDS[sc['kind']]}"
        if sc.get("raw"):
            return f"scenario {name} replays recorded requests"
        if sc.get("dataset"):  # sent as written, unsalted: repeats across runs and when a run cycles
            return f"scenario {name} sends a dataset's prompts as written (docs/datasets.md)"
    return None


def _system_prompt_tokens(profile: dict[str, Any] | None) -> int:
    return max((int(sc.get("system_prompt_tokens") or 0) for sc in (profile or {}).get("scenarios") or []
                if isinstance(sc, dict)), default=0)  # fmt: skip


def from_records(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """Cached over prompt tokens from the server's per-request usage (``cached_tokens``), when the
    server reported any cached tokens (a server that never reports them reads as unknown, not 0)."""
    tok = (doc.get("metrics") or {}).get("tokens") or {}
    cached, prompt = tok.get("usage_cached_total"), tok.get("usage_input_total")
    if not cached or not prompt:
        return None
    return {
        "hit_rate": round(min(cached / prompt, 1.0), 4),
        "hit": cached,
        "queried": prompt,
        "source": "usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens (client records)",
    }


def warm_note(rate: float, run_salt: str | None = None) -> str:
    """The warning: run.json's note, the report's banner and the console's line."""
    salt = f", run_salt: {run_salt}" if run_salt else ""
    return (
        f"warm prefix cache: the prefix cache answered {rate * 100:.0f} % of prompt tokens: the server saw a "
        "warm workload; latencies are not cold-cache figures (the profile asks for no shared prefixes"
        f"{salt}: these prompts reached the server before; a fresh run salt, run_salt: per_run, or a "
        "restarted server gives cold figures)"
    )


def _run_salt(doc: Mapping[str, Any]) -> str | None:
    rs = (doc.get("config") or {}).get("run_salt")
    mode = rs.get("mode") if isinstance(rs, dict) else rs
    return mode if isinstance(mode, str) else None


def prefix_cache_block(doc: Mapping[str, Any], telemetry: dict[str, Any] | None) -> dict[str, Any] | None:
    """run.json ``prefix_cache`` (hit rate, its source, the threshold, whether the profile expects reuse,
    ``warm`` and then ``warning``: the note, when a profile without shared prefixes ran warm) from the
    server's figure, else the records' cached tokens in ``doc``'s metrics; None when neither has one."""
    got = telemetry or from_records(doc)
    if got is None:
        return None
    profile = (doc.get("config") or {}).get("profile_resolved")
    reuse = expected_reuse(profile)
    rate = got.get("hit_rate")
    warm = rate is not None and rate > WARM_THRESHOLD and reuse is None
    block = {**got, "threshold": WARM_THRESHOLD, "expected_reuse": reuse, "warm": warm}
    system = _system_prompt_tokens(profile)
    if system:
        block["system_prompt_tokens"] = system
    if warm and rate is not None:
        block["warning"] = warm_note(rate, _run_salt(doc))
    return block


def assess(doc: dict[str, Any], telemetry: dict[str, Any] | None) -> None:
    """Put run.json ``prefix_cache`` (``prefix_cache_block``) into ``doc``, and its warning in ``notes``
    when a profile without shared prefixes ran warm."""
    block = prefix_cache_block(doc, telemetry)
    if block is None:
        return
    if "warning" in block:
        doc.setdefault("notes", []).append(block["warning"])
    doc["prefix_cache"] = block
