"""Which conversations count as completed and good: cut short, failed, over the SLO, single requests."""

from __future__ import annotations

from loadtest.contracts.record_line import RecordLine
from loadtest.metrics.conversations import ConversationTally
from loadtest.metrics.slo import RequestSlo


def _call(
    session: str | None, k: int, *, last: bool = False, outcome: str = "ok", ttft_ms: int = 100
) -> RecordLine:
    """A 1-s call sent at ``5 k`` s (a 4-s tool delay after the one before), 50 output tokens."""
    line = RecordLine(
        id=f"{session}.{k}",
        t=100.0 + 5.0 * k,
        outcome=outcome,
        sent_us=0,
        ttft_us=ttft_ms * 1000,
        e2e_us=1_000_000,
        output_tokens=50,
    )
    if session is not None:
        line.session = session
    if last:
        line.session_last = True
    return line


def test_only_conversations_that_reached_their_planned_end_ok_are_completed() -> None:
    tally = ConversationTally(RequestSlo(ttft_ms=500))
    tally.add([_call("done", k, last=k == 2) for k in range(3)])  # 3 calls, ends as planned
    tally.add([_call("slow", k, last=k == 1, ttft_ms=900 if k == 1 else 100) for k in range(2)])
    tally.add([_call("cut", k) for k in range(2)])  # the run ended before its last call
    tally.add([_call("failed", 0), _call("failed", 1, last=True, outcome="http_5xx")])
    tally.add([_call(None, 0)])  # a single request: no conversation
    got = tally.result(duration_s=20.0)
    assert got is not None
    assert (got["started"], got["completed"]) == (4, 2)
    assert got["per_s"] == 0.1
    # done: 0 → 11 s, slow: 0 → 6 s; each call 1 s and 50 tokens
    assert got["latency_s"] is not None and got["latency_s"]["mean"] == 8.5
    assert got["calls_per_conversation"] is not None and got["calls_per_conversation"]["mean"] == 2.5
    assert got["e2e_interactivity"] == 50.0
    assert got["e2e_interactivity_with_tool_time"] == round((150 / 11 + 100 / 6) / 2, 4)
    assert got["slo_attainment"] == 0.5  # "slow" had a call over the TTFT limit


def test_a_run_without_sessions_has_no_conversation_figures() -> None:
    tally = ConversationTally()
    tally.add([_call(None, k) for k in range(3)])
    assert tally.result(10.0) is None
