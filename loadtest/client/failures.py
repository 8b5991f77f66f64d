"""One line that names what failed in a run: each failed outcome class, its count and its commonest error."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

_MAX_MESSAGE = 120


def failure_note(lines: Iterable[Mapping[str, Any]]) -> str | None:
    """``failed requests: 12 http_5xx ("HTTP 503: ..."), 3 stream_error (...)`` or None when all were ok.

    Cancelled requests (stopped by the generator) are not failures of the endpoint and are left out.
    """
    counts: Counter[str] = Counter()
    messages: dict[str, Counter[str]] = {}
    for line in lines:
        outcome = str(line.get("outcome", "ok"))
        if outcome in ("ok", "cancelled"):
            continue
        counts[outcome] += 1
        msg = str(line.get("error") or "")
        messages.setdefault(outcome, Counter())[msg[:_MAX_MESSAGE]] += 1
    if not counts:
        return None
    parts = []
    for outcome, n in counts.most_common():
        msg = messages[outcome].most_common(1)[0][0]
        parts.append(f"{n} {outcome}" + (f" ({msg!r})" if msg else ""))
    return "failed requests: " + ", ".join(parts)
