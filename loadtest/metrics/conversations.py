"""Per-conversation figures from the record log: conversations completed and per second, their latency,
calls per conversation, end-to-end interactivity with and without tool time, conversation SLO attainment."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from loadtest.client.record import RequestRecord
from loadtest.contracts.record_line import RecordLine
from loadtest.metrics.slo import RequestSlo

PERCENTILES = (50, 90, 95, 99)
# The live counters (a recorder's totals, merged from workers like the rest) and the latency histogram.
LIVE_STARTED, LIVE_COMPLETED, LIVE_FAILED, LIVE_GOOD = (
    "conversations_started",
    "conversations_completed",
    "conversations_failed",
    "conversations_good",
)
LIVE_LATENCY = "conversation"  # µs, from the first call's send to the planned last call's end


@dataclass(slots=True)
class _Conversation:
    calls: int = 0
    ok: bool = True
    failed: bool = False  # a call failed (an endpoint outcome; a cancelled call only cuts it short)
    ended: bool = False  # its planned last call came back ok
    good: bool = True  # every call met the per-request SLOs
    start_s: float = float("inf")
    end_s: float = float("-inf")
    output_tokens: int = 0
    call_time_s: float = 0.0  # Σ of its calls' end-to-end times (no tool or think time)


@dataclass(slots=True)
class ConversationTally:
    """Record-log lines grouped by their ``session``; ``result`` gives run.json ``conversations``.

    A conversation is *completed* when its planned last call came back ok and every call was ok (a
    conversation the run's end cut short, or one a failed call ended, is not). Over the completed ones:
    latency = from its first call's send to its last call's end (tool and think time included);
    interactivity = Σ output tokens ÷ Σ call times (``e2e_interactivity``, tool time excluded, MLPerf
    Endpoints' ``e2e_avg_interactivity``) and ÷ its latency (``..._with_tool_time``), each averaged
    over conversations. SLO attainment is over the *judged* ones, the completed and the failed (a run's
    end cuts the others short): the share that completed with every call within the per-request SLOs."""

    slo: RequestSlo = field(default_factory=RequestSlo)
    _by_id: dict[str, _Conversation] = field(default_factory=dict)

    def add(self, lines: Iterable[RecordLine]) -> None:
        for line in lines:
            sid = line.session
            if not isinstance(sid, str):
                continue
            c = self._by_id.get(sid)
            if c is None:
                c = self._by_id[sid] = _Conversation()
            c.calls += 1
            ok = line.outcome == "ok"
            c.ok = c.ok and ok
            c.failed = c.failed or line.outcome not in ("ok", "cancelled")
            c.good = c.good and self.slo.is_good(line)
            if line.session_last is True and ok:
                c.ended = True
            sent = line.t + (line.sent_us or 0) / 1e6
            c.start_s = min(c.start_s, sent)
            if line.e2e_us is not None:
                c.end_s = max(c.end_s, line.t + line.e2e_us / 1e6)
                c.call_time_s += (line.e2e_us - (line.sent_us or 0)) / 1e6
            c.output_tokens += line.output_tokens

    def result(self, duration_s: float) -> dict[str, Any] | None:
        """run.json ``conversations`` (None when the run had no session calls); ``duration_s``: the
        run's measured span, the denominator of conversations/s."""
        if not self._by_id:
            return None
        done = [c for c in self._by_id.values() if c.ok and c.ended]
        judged = len(done) + sum(c.failed for c in self._by_id.values())
        good = sum(c.good for c in done)
        latency = np.array([c.end_s - c.start_s for c in done], dtype=float)
        calls = np.array([c.calls for c in done], dtype=float)
        busy = [c.output_tokens / c.call_time_s for c in done if c.call_time_s > 0]
        whole = [c.output_tokens / (c.end_s - c.start_s) for c in done if c.end_s > c.start_s]

        def pcts(values: np.ndarray) -> dict[str, float] | None:
            if not len(values):
                return None
            return {f"p{p}": round(float(np.percentile(values, p)), 4) for p in PERCENTILES} | {
                "mean": round(float(values.mean()), 4)
            }

        return {
            "started": len(self._by_id),
            "completed": len(done),
            "per_s": round(len(done) / duration_s, 4) if duration_s > 0 else None,
            "latency_s": pcts(latency),
            "calls_per_conversation": pcts(calls),
            "e2e_interactivity": round(float(np.mean(busy)), 4) if busy else None,
            "e2e_interactivity_with_tool_time": round(float(np.mean(whole)), 4) if whole else None,
            "judged": judged,
            "good": good,
            "slo_attainment": round(good / judged, 4) if judged else None,
        }


class Counts(Protocol):
    """Where live figures go: a recorder track's ``note`` (a counter) and ``sample`` (a histogram value)."""

    def note(self, counter: str, n: int = 1) -> None: ...
    def sample(self, name: str, value: int) -> None: ...


@dataclass(slots=True)
class _Open:
    start_s: float
    failed: bool = False
    good: bool = True


@dataclass(slots=True)
class LiveConversations:
    """The per-conversation figures while the run goes, from records as they finish, by the same rules as
    ``ConversationTally`` (started at its first call seen, completed at its planned last call ok with no
    call failed, good when every call was): counters and a latency histogram in a recorder's track, so
    they travel to a master in its deltas. A conversation's calls all run in one process."""

    _open: dict[str, _Open] = field(default_factory=dict)

    def add(self, rec: RequestRecord, good: bool, into: Counts) -> None:
        sid = rec.session
        if sid is None:
            return
        sent = rec.scheduled_epoch + ((rec.sent_ns or rec.scheduled_ns) - rec.scheduled_ns) / 1e9
        c = self._open.get(sid)
        if c is None:
            c = self._open[sid] = _Open(sent)
            into.note(LIVE_STARTED)
        c.start_s = min(c.start_s, sent)
        if rec.outcome not in ("ok", "cancelled") and not c.failed:
            c.failed = True
            into.note(LIVE_FAILED)
        c.good = c.good and good and rec.outcome == "ok"
        if rec.session_last:  # its planned end: whatever came back, nothing of it follows
            del self._open[sid]
            if c.failed or rec.outcome != "ok":
                return
            end = rec.scheduled_epoch + ((rec.done_ns or rec.scheduled_ns) - rec.scheduled_ns) / 1e9
            into.note(LIVE_COMPLETED)
            into.sample(LIVE_LATENCY, max(0, round((end - c.start_s) * 1e6)))
            if c.good:
                into.note(LIVE_GOOD)
