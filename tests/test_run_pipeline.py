"""The post-run pipeline (loadtest/run/): the record log read in batches gives the same numbers whatever
the batches; providers contribute checks before the one verdict; errors carry their exit codes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest

from loadtest.client.failures import FailureTally, commonest_failure, failure_note
from loadtest.contracts.record_line import RecordLine, as_line
from loadtest.errors import EXIT_COULD_NOT_RUN, EXIT_USAGE, LoadtestError, UsageError
from loadtest.metrics.judged_scan import JudgingScan, LineAggregator
from loadtest.metrics.slo import parse_slos
from loadtest.metrics.summary import build_metrics
from loadtest.metrics.verdict import Check, ExtraCheck, judge
from loadtest.profile.loader import ProfileError
from loadtest.run.providers import EmbeddingsProvider, EndpointsProvider

T = TypeVar("T")


def batched(items: Sequence[T], n: int) -> list[list[T]]:
    return [list(items[i : i + n]) for i in range(0, len(items), n)]


def _lines(n: int = 300, seed: int = 3) -> list[RecordLine]:
    """A run's worth of lines: a ramp, failures, cancellations, two scenarios, three endpoints."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        outcome = rng.choice(["ok"] * 12 + ["http_5xx", "timeout", "cancelled"])
        ttft = rng.randint(20_000, 900_000)
        tpot = rng.uniform(2_000, 40_000)
        k = rng.randint(1, 30)
        sent = rng.choice([None, rng.randint(0, 80_000)]) if i % 7 == 0 else rng.randint(0, 3_000)
        done = outcome not in ("cancelled", "timeout")
        line: dict[str, Any] = {
            "id": f"r-{i}",
            "scenario": "chat" if i % 3 else "rag",
            "t": round(1_700_000_000.0 + i * 0.05 + rng.random() * 0.01, 6),
            "outcome": outcome,
            "error": None if outcome == "ok" else f"{outcome} #{i % 4}",
            "sent_us": sent,
            "ttft_us": ttft if outcome == "ok" else None,
            "e2e_us": int(ttft + tpot * k) if done else None,
            "tpot_us": round(tpot, 1) if outcome == "ok" and k > 1 else None,
            "chunks_us": [int(ttft + j * tpot) for j in range(k)] if outcome == "ok" else [],
            "output_tokens": k,
            "usage_completion_tokens": k if i % 2 else None,
            "prompt_tokens": 50,
            "endpoint": i % 3,
            "api": "embeddings" if i % 11 == 0 else "chat",
        }
        if i % 11 == 0:
            line["inputs"] = 4
        out.append(as_line(line))
    return out


@pytest.mark.parametrize(
    ("warmup", "cooldown"),
    [(None, 0.0), (0.0, 0.0), (2.5, 1.0), ("auto", "auto"), (0.0, "auto"), (100.0, 0.0)],
)
def test_the_scan_gives_the_same_numbers_whatever_the_batches(warmup: Any, cooldown: Any) -> None:
    lines = _lines()
    slos = parse_slos("ttft_p90=500ms,tpot_p90=30ms")
    scans = [JudgingScan(warmup, cooldown, slos, per_scenario=True) for _ in range(2)]
    for batch in batched(lines, 7):
        scans[0].add(batch)
    scans[1].add(lines)
    small, whole = (s.window() for s in scans)
    assert small == whole
    assert scans[0].goodput(small) == scans[1].goodput(whole)
    inside = [ln for ln in lines if small.contains(ln)]
    aggs = [LineAggregator(per_scenario=True) for _ in range(2)]
    for batch in batched(inside, 5):
        aggs[0].add(batch)
    aggs[1].add(inside)
    assert build_metrics(aggs[0].result().all) == build_metrics(aggs[1].result().all)


def test_no_goodput_without_a_per_request_slo() -> None:
    scan = JudgingScan(None, 0.0, parse_slos("error_rate=1%"), per_scenario=False)
    scan.add(_lines(20))
    assert scan.goodput(scan.window()) is None


def test_failures_and_providers_add_up_batch_by_batch() -> None:
    lines = _lines()
    tally = FailureTally()
    per, emb = EndpointsProvider(["http://a", "http://b", "http://c"], "round-robin"), EmbeddingsProvider()
    for batch in batched(lines, 11):
        tally.add(batch)
        per.add(batch)
        emb.add(batch)
    assert tally.note() == failure_note(lines) and tally.commonest() == commonest_failure(lines)
    rows = per.per_endpoint()["endpoints"]
    for i, row in enumerate(rows):
        agg = LineAggregator(per_scenario=False)
        agg.add(ln for ln in lines if ln.endpoint == i)
        mine = build_metrics(agg.result().all)
        assert (row["ok"], row["failed"], row["ttft_p99_ms"]) == (
            mine["requests"]["ok"],
            mine["requests"]["failed"],
            mine["latency_ms"]["ttft"]["p99"],
        )
    assert sum(r["requests"] for r in rows) == len(lines)
    figures = emb.section()
    assert figures is not None
    ok = [ln for ln in lines if (ln.api == "embeddings" or ln.n_inputs) and ln.outcome == "ok" and ln.e2e_us]
    assert figures["requests_ok"] == len(ok) and figures["inputs_total"] == 4 * len(ok)


def test_extra_checks_are_judged_with_the_rest_and_their_reasons_follow() -> None:
    metrics = {
        "window": {"duration_s": 10.0},
        "requests": {"ok": 90, "failed": 10, "completed": 100, "error_rate": 0.1, "by_outcome": {}},
    }
    flagged = Check("replica_1_errors", False, "replica 1 failed", "health", blocking=False)
    extra = [ExtraCheck(flagged, "replica 1 (http://b) failed 30% of its 33 requests")]
    notes = ["failed requests: 10 http_5xx", "failed requests: 10 http_5xx", "note: retries on"]
    plain = judge(metrics, None, "error_rate=20%")
    verdict = judge(metrics, None, "error_rate=20%", extra_checks=extra, notes=notes)
    assert verdict.status == plain.status == "pass"
    assert verdict.checks == [*plain.checks, flagged]
    assert verdict.reasons == [*plain.reasons, extra[0].reason, notes[0], notes[2]]
    blocking = ExtraCheck(Check("replica_1_down", False, "down", "endpoint"), "replica 1 is down")
    assert judge(metrics, None, "error_rate=20%", extra_checks=[blocking]).status == "error_rate"


def test_errors_carry_their_exit_codes() -> None:
    assert LoadtestError("x").exit_code == EXIT_COULD_NOT_RUN == 1
    assert UsageError("x").exit_code == EXIT_USAGE == 2
    assert isinstance(ProfileError("x"), UsageError) and ProfileError("x").exit_code == 2
