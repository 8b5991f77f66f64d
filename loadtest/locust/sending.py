"""What a stream's greenlet runs for each unit: its calls sent one after the other (retries as the
profile says, a step's parallel branches side by side), each accounted exactly once whatever happens.

Apart from locust/users.py, whose Locust user classes a compiled module cannot define, so that the
compiled build compiles the per-request steps (loadtest/compiled.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import gevent
import msgspec
from locust.exception import StopUser

from loadtest.client.balancer import StreamClient
from loadtest.client.openai import PreparedRequest
from loadtest.client.record import RequestRecord
from loadtest.client.unreadable import mark_unreadable
from loadtest.locust.compat import zero_wait
from loadtest.locust.context import RunContext
from loadtest.workload.builder import Step, Unit


def send_and_account(
    ctx: RunContext,
    client: StreamClient,
    req: PreparedRequest,
    sched_ns: int,
    sched_epoch: float,
    attempt: int = 0,
    retry_of: str | None = None,
) -> RequestRecord:
    """Send one request; whatever happens (even a kill mid-stream) exactly one record is accounted."""
    rec = RequestRecord(req.request_id)  # the fields set one by one: compiled, each is one store
    rec.attempt = attempt
    rec.retry_of = retry_of
    rec.session = req.session
    rec.session_last = req.session_last
    if req.agentic is not None:
        rec.agentic = msgspec.structs.replace(req.agentic)
    ctx.sending(rec, req, sched_ns, sched_epoch)
    try:
        client.send(req, sched_ns, sched_epoch, rec)
    except gevent.GreenletExit:
        if ctx.drain_expired_s is not None:  # the run ended normally and the endpoint still had not answered
            rec.outcome = "timeout"
            rec.error = (
                f"no complete response when the run's drain ended ({ctx.drain_expired_s:g} s after the "
                "load stopped): the endpoint is not answering"
            )
        else:
            rec.outcome, rec.error = "cancelled", "stopped by the generator before the response ended"
        client.close()
        raise
    except Exception as e:  # noqa: BLE001 - the last guard: only the generator's own stop is "cancelled"
        mark_unreadable(rec, e, None)  # the process's key is redacted (install_redaction)
        client.close()  # the connection's state is unknown
    finally:
        if not rec.scheduled_ns:  # killed before send() filled anything in
            rec.scheduled_ns, rec.scheduled_epoch = sched_ns, sched_epoch
            rec.scenario, rec.api = req.scenario, req.api
        try:
            ctx.judge_answer(rec, req)
        except Exception as e:  # noqa: BLE001 - an answer the checks cannot read is not a readable answer
            mark_unreadable(rec, e, rec.answer_text.encode("utf-8", "replace"))
        ctx.finish(rec)
    return rec


RETRYABLE_OUTCOMES = frozenset({"http_429", "http_5xx"})
# Closed loop: the first wait after a failed unit; it doubles per failure in a row, up to the
# profile's client.failure_backoff_max_s (default 1 s), and a success resets it.
FAILURE_BACKOFF_FIRST_S = 0.05


def failure_backoff_s(failures_in_a_row: int, cap_s: float) -> float:
    """The wait before a stream's next unit after ``failures_in_a_row`` failed ones (0 after a success)."""
    if failures_in_a_row <= 0 or cap_s <= 0:
        return 0.0
    return min(cap_s, FAILURE_BACKOFF_FIRST_S * 2.0 ** min(failures_in_a_row - 1, 30))


def send_with_retries(
    ctx: RunContext, client: StreamClient, req: PreparedRequest, sched_ns: int, sched_epoch: float
) -> RequestRecord:
    """Send ``req``; only when the profile's retry policy says so (``client.retries.max`` > 0, off by
    default), send a 429/5xx answer again after a backoff. Each attempt is its own record, scheduled
    when it is sent, with ``attempt`` and ``retry_of`` (the original's id). Returns the last attempt."""
    rec = send_and_account(ctx, client, req, sched_ns, sched_epoch)
    policy = ctx.retries
    attempt = 0
    while (
        attempt < policy.max
        and rec.outcome in RETRYABLE_OUTCOMES
        and rec.http_status in policy.on
        and not ctx.stopping
    ):
        attempt += 1
        wait = policy.backoff_s * policy.backoff_factor ** (attempt - 1)
        if policy.honor_retry_after and rec.retry_after_s is not None:
            wait = rec.retry_after_s
        gevent.sleep(min(wait, policy.max_backoff_s))
        if ctx.stopping:
            break
        retry = dataclasses.replace(req, request_id=f"{req.request_id}.retry{attempt}")
        now_ns, now_epoch = RunContext.now()
        rec = send_and_account(ctx, client, retry, now_ns, now_epoch, attempt, req.request_id)
    return rec


def run_closed_loop(user: Any, ctx: RunContext, client: StreamClient) -> None:
    """A closed-loop stream (``users.ClosedLoopUser``): its units one after the other, each followed by
    Locust's own wait (``compat.zero_wait``), until the run stops it (Locust's ``StopUser``). After a
    failed unit the stream backs off (``failure_backoff_s``) instead of resending at once: an endpoint
    that fails fast would otherwise spin the generator at full CPU."""
    failures_in_a_row = 0
    while True:
        last = run_next_unit(ctx, client)
        if last is not None and last.outcome != "cancelled":
            if last.outcome == "ok":
                failures_in_a_row = 0
            else:
                failures_in_a_row += 1
                wait = failure_backoff_s(failures_in_a_row, ctx.failure_backoff_max_s)
                if wait > 0 and not ctx.stopping:
                    gevent.sleep(wait)  # the next unit is scheduled when it starts: not generator lag
        zero_wait(user)


def run_next_unit(ctx: RunContext, client: StreamClient) -> RequestRecord | None:
    """The closed loop's next unit, sent now; its last call's record (None when none was sent).
    Raises Locust's ``StopUser`` when the run is stopping or no unit is left (--max-requests)."""
    if ctx.stopping or not ctx.take_unit():
        raise StopUser()
    unit = ctx.next_closed_loop_unit()
    first = unit.next(None)
    sched_ns, sched_epoch = RunContext.now()
    return run_unit(ctx, client, unit, first, sched_ns, sched_epoch)


def run_unit(
    ctx: RunContext, client: StreamClient, unit: Unit, first: Step | None, first_ns: int, first_epoch: float
) -> RequestRecord | None:
    """Every call of a unit: the first (built beforehand) at its scheduled time, later ones after think
    time. Returns the last call's record (None when none was sent)."""
    try:
        return _run_calls(ctx, client, unit, first, first_ns, first_epoch)
    finally:
        ctx.units_ended += 1


def _run_calls(
    ctx: RunContext, client: StreamClient, unit: Unit, first: Step | None, first_ns: int, first_epoch: float
) -> RequestRecord | None:
    """run_unit's calls; a step with ``parallel`` units first runs them side by side, waits for all, then
    waits its think time."""
    last: RequestRecord | None = None
    sched_ns, sched_epoch = first_ns, first_epoch
    step = first
    while step is not None:
        if step.parallel:  # the branches, then the join: the step's think time counts from there
            gevent.joinall([gevent.spawn(_run_branch, ctx, branch) for branch in step.parallel])
        if last is not None or step.parallel:
            if ctx.stopping:
                return last  # the run is over: a session does not start another call
            if step.think_before_s > 0:
                gevent.sleep(step.think_before_s)
            sched_ns, sched_epoch = RunContext.now()
        last = send_with_retries(ctx, client, step.request, sched_ns, sched_epoch)
        step = unit.next(last)
    return last


def _run_branch(ctx: RunContext, unit: Unit) -> None:
    """One parallel branch of a unit (a subagent's stream of calls) on its own connection, after its first
    step's think time; it belongs to its parent's unit (not counted as one of its own)."""
    first = unit.next(None)
    if first is None or ctx.stopping:
        return
    if first.think_before_s > 0:
        gevent.sleep(first.think_before_s)
    if ctx.stopping:
        return
    client = ctx.new_client()
    try:
        sched_ns, sched_epoch = RunContext.now()
        _run_calls(ctx, client, unit, first, sched_ns, sched_epoch)
    finally:
        client.close()
