"""What failed in a run, in words: the failed outcome classes with their commonest errors, and the
endpoint-failing sentence the verdict leads with."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from loadtest.contracts.record_line import LineLike, as_line

_MAX_MESSAGE = 120
_SPACE = re.compile(r"\s+")


def _short(msg: str) -> str:
    """One line of at most _MAX_MESSAGE characters (whitespace runs, newlines included, become one space)."""
    msg = _SPACE.sub(" ", msg).strip()
    return msg if len(msg) <= _MAX_MESSAGE else msg[: _MAX_MESSAGE - 1] + "…"


class FailureTally:
    """The failed outcome classes of record-log lines and their messages, counted batch by batch (``add``)
    in log order: ``note()`` and ``commonest()`` as ``failure_note`` and ``commonest_failure`` give them."""

    def __init__(self, lines: Iterable[LineLike] = ()) -> None:
        self.counts: Counter[str] = Counter()
        self.messages: dict[str, Counter[str]] = {}
        self.add(lines)

    def add(self, lines: Iterable[LineLike]) -> None:
        counts, messages = self.counts, self.messages
        for line in map(as_line, lines):
            outcome = line.outcome
            if outcome in ("ok", "cancelled"):
                continue
            counts[outcome] += 1
            messages.setdefault(outcome, Counter())[(line.error or "")[:_MAX_MESSAGE]] += 1

    def note(self) -> str | None:
        """``failed requests: 12 http_5xx ("HTTP 503: ..."), 3 stream_error (...)`` or None when all were ok.

        Cancelled requests (stopped by the generator) are not failures of the endpoint and are left out.
        """
        if not self.counts:
            return None
        parts = []
        for outcome, n in self.counts.most_common():
            msg = self.messages[outcome].most_common(1)[0][0]
            parts.append(f"{n} {outcome}" + (f" ({msg!r})" if msg else ""))
        return "failed requests: " + ", ".join(parts)

    def commonest(self) -> str | None:
        """The commonest failed outcome class and its commonest message, ``http_4xx: HTTP 400: ...``; None if none."""
        if not self.counts:
            return None
        outcome = self.counts.most_common(1)[0][0]
        msg = _short(self.messages[outcome].most_common(1)[0][0])
        return f"{outcome}: {msg}" if msg else outcome


def failure_note(lines: Iterable[LineLike]) -> str | None:
    """``failed requests: 12 http_5xx ("HTTP 503: ..."), 3 stream_error (...)`` or None when all were ok
    (``FailureTally.note``)."""
    return FailureTally(lines).note()


def commonest_failure(lines: Iterable[LineLike]) -> str | None:
    """The commonest failed outcome class and its commonest message, ``http_4xx: HTTP 400: ...``; None if none."""
    return FailureTally(lines).commonest()


def commonest_from_metrics(metrics: Mapping[str, Any]) -> str | None:
    """The same from run.json ``metrics`` alone (``requests.by_outcome`` and an ``error_samples`` message)."""
    by = (metrics.get("requests") or {}).get("by_outcome") or {}
    failed = [(n, o) for o, n in by.items() if o not in ("ok", "cancelled") and n]
    if not failed:
        return None
    outcome = max(failed)[1]
    samples = (metrics.get("error_samples") or {}).get(outcome) or []
    return f"{outcome}: {_short(str(samples[0]))}" if samples else outcome


def pct(share: float) -> str:
    """0.5 → ``50 %``, 1.0 → ``100 %``, 0.0123 → ``1.23 %``."""
    return f"{share * 100:.3g} %"


def failing_text(requests: Mapping[str, Any], commonest: str | None) -> str:
    """``100 % of 57 requests failed (http_4xx: HTTP 400: ...)`` from run.json ``metrics.requests``."""
    failed = int(requests.get("failed") or 0)
    counted = failed + int(requests.get("ok") or 0)
    if not counted:
        cancelled = int(requests.get("cancelled") or 0)
        return f"no request finished ({cancelled} still waiting on the endpoint were cancelled at the end)"
    share = failed / counted
    return f"{pct(share)} of {counted} requests failed" + (f" ({commonest})" if commonest else "")


def stopped_early_text(info: Mapping[str, Any], requests: Mapping[str, Any], commonest: str | None) -> str:
    """The cause of an early stop, after ``stopped early: ``: ``endpoint failing: 100 % of 57 requests
    failed (http_4xx: HTTP 400: ...)``; when some requests had succeeded before, the failing streak too."""
    if int(requests.get("ok") or 0) == 0:
        return f"endpoint failing: {failing_text(requests, commonest or info.get('commonest'))}"
    commonest = info.get("commonest") or commonest  # what the failing streak itself ended in
    streak = int(info.get("failed_in_a_row") or 0)
    quiet = float(info.get("seconds") or 0.0)
    return (
        f"endpoint failing: the last {streak} requests failed and none succeeded for {quiet:.0f} s"
        + (f" ({commonest})" if commonest else "")
        + f"; {failing_text(requests, None)} in all"
    )
