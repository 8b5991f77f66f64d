"""HDR recording, exact merging of worker deltas, and MLPerf metric definitions."""

from __future__ import annotations

import random

import numpy as np
import pytest

from loadtest.client.record import RequestRecord
from loadtest.metrics import hdr
from loadtest.metrics.conversations import LIVE_COMPLETED, LIVE_GOOD, LIVE_STARTED
from loadtest.metrics.recorder import Recorder, RunAggregates, Track
from loadtest.metrics.summary import build_metrics


def make_record(i: int, rng: random.Random, outcome: str = "ok") -> RequestRecord:
    t0 = 1_000_000_000 * (i + 1)
    ttft = rng.randint(20_000_000, 900_000_000)
    n = rng.randint(1, 300)
    gaps = [rng.randint(1_000, 60_000_000) for _ in range(n - 1)]
    chunks = [t0 + ttft]
    for g in gaps:
        chunks.append(chunks[-1] + g)
    return RequestRecord(
        request_id=str(i),
        scheduled_epoch=1_700_000_000 + i * 0.25,
        scheduled_ns=t0,
        sent_ns=t0 + rng.randint(0, 2_000_000),
        first_token_ns=chunks[0],
        first_answer_ns=chunks[0],
        chunk_ns=chunks,
        done_ns=chunks[-1] + 1000,
        outcome=outcome,
        error="" if outcome == "ok" else f"{outcome} #{i % 3}",
        completion_tokens_client=n,
        prompt_tokens_client=rng.randint(10, 5000),
        completion_tokens_server=n,
        prompt_tokens_server=100,
    )


def test_record_many_matches_record_value_exactly() -> None:
    rng = np.random.default_rng(3)
    vals = np.concatenate(
        [rng.integers(1, hdr.HIGHEST_US, 5000), rng.integers(0, 3000, 5000), [hdr.HIGHEST_US * 5]]
    )
    a, b = hdr.new_histogram(), hdr.new_histogram()
    for v in vals:
        hdr.record(a, int(v))
    hdr.record_many(b, vals)
    assert list(a.counts) == list(b.counts)
    assert (a.total_count, a.min_value, a.max_value) == (b.total_count, b.min_value, b.max_value)


def test_a_recorder_without_deltas_keeps_the_same_totals_and_ships_nothing() -> None:
    rng = random.Random(11)
    records = [make_record(i, rng, "ok" if i % 7 else "timeout") for i in range(300)]
    for i, r in enumerate(records):
        r.scenario = "chat" if i % 2 else "agent"
    kept, plain = Recorder(per_scenario=True), Recorder(per_scenario=True, deltas=False)
    for r in records:
        kept.add(r)
        plain.add(r)
    a, b = kept.result(), plain.result()
    assert build_metrics(a.all) == build_metrics(b.all)
    assert a.all.totals == b.all.totals and a.all.outcomes == b.all.outcomes
    assert dict(a.all.series) == dict(b.all.series)
    for name in ("chat", "agent"):
        assert build_metrics(a.scenarios[name]) == build_metrics(b.scenarios[name])
    with pytest.raises(RuntimeError, match="no deltas"):
        plain.take_delta()


def test_worker_deltas_merge_exactly_into_the_single_process_result() -> None:
    rng = random.Random(7)
    records = [make_record(i, rng, "ok" if i % 9 else "http_5xx") for i in range(400)]
    for i, r in enumerate(records):
        r.scenario = "chat" if i % 3 else "agent"
    single = Recorder(per_scenario=True)
    workers = [Recorder(per_scenario=True) for _ in range(3)]
    merged = RunAggregates()
    for i, r in enumerate(records):
        single.add(r)
        workers[i % 3].add(r)
        if i % 50 == 0:  # periodic report_to_master
            for w in workers:
                merged.merge_wire(w.take_delta())
    for w in workers:  # the final report
        merged.merge_wire(w.take_delta())
    single.flush()
    master = merged.all
    for name, h in single.total.hists.items():
        assert list(h.counts) == list(master.hists[name].counts), name
        assert h.get_total_count() == master.hists[name].get_total_count()
    assert single.total.outcomes == master.outcomes
    assert single.total.totals == master.totals
    assert dict(single.total.series) == dict(master.series)
    assert build_metrics(single.total) == build_metrics(master)
    local = single.result()
    assert set(merged.scenarios) == set(local.scenarios) == {"chat", "agent"}
    for name, agg in merged.scenarios.items():
        assert build_metrics(agg) == build_metrics(local.scenarios[name])
    assert sum(a.completed for a in merged.scenarios.values()) == master.completed == 400


def test_tpot_follows_the_mlperf_definition() -> None:
    r = RequestRecord(
        request_id="x", scheduled_ns=0, sent_ns=0, first_token_ns=100_000_000, done_ns=1_100_000_000
    )
    r.completion_tokens_client = 11
    assert r.tpot_us() == 100_000.0  # (1.1 s − 0.1 s) / (11 − 1)
    r.completion_tokens_client = 1
    assert r.tpot_us() is None  # a single token has no TPOT


def test_metrics_percentiles_and_counts() -> None:
    rec = Recorder()
    rng = random.Random(1)
    for i in range(1000):
        r = make_record(i, rng)
        r.first_token_ns = r.scheduled_ns + (i + 1) * 1_000_000  # TTFT = 1..1000 ms
        r.chunk_ns[0] = r.first_token_ns
        rec.add(r)
    m = build_metrics(rec.total)
    ttft = m["latency_ms"]["ttft"]
    assert ttft["count"] == 1000
    # LoadGen's rank: sorted[⌊n·p⌋] is the 501st and the 991st; within the histogram's 3 significant figures
    assert abs(ttft["p50"] - 501) <= 0.51 and abs(ttft["p99"] - 991) <= 1.0
    assert m["requests"]["ok"] == 1000 and m["requests"]["error_rate"] == 0.0
    assert m["tokens"]["mismatched_requests"] == 0


def test_failed_requests_stay_out_of_latency_histograms() -> None:
    rec = Recorder()
    rng = random.Random(2)
    rec.add(make_record(0, rng, "ok"))
    rec.add(make_record(1, rng, "stream_error"))
    rec.add(make_record(2, rng, "cancelled"))
    m = build_metrics(rec.total)
    assert m["latency_ms"]["e2e"]["count"] == 1
    assert m["requests"]["failed"] == 1 and m["requests"]["cancelled"] == 1
    assert m["requests"]["error_rate"] == 0.5  # cancelled requests are not judged
    assert m["error_samples"]["stream_error"] == ["stream_error #1"]


def test_output_tokens_per_second_follow_chunk_arrivals_and_add_up() -> None:
    rec = Recorder()
    rng = random.Random(5)
    for i in range(200):
        rec.add(make_record(i, rng))
    m = build_metrics(rec.total)
    assert sum(m["series"]["output_tokens"]) == m["tokens"]["output_total"]
    assert sum(m["series"]["completed"]) == 200
    # A request whose chunks span 3 seconds spreads its tokens over them.
    r = RequestRecord(request_id="s", scheduled_epoch=100.0, scheduled_ns=0, sent_ns=0, outcome="ok")
    r.chunk_ns = [int(0.5e9), int(1.5e9), int(1.6e9), int(2.5e9)]
    r.first_token_ns, r.done_ns, r.completion_tokens_client = r.chunk_ns[0], r.chunk_ns[-1], 8
    assert Track._output_tokens_by_second(r, 8, 100.0) == [(100, 2), (101, 4), (102, 2)]


def test_cumulative_counts_and_sum_equal_hdrh_walking_its_buckets() -> None:
    """The vectorized ``le`` counts and sum the live Prometheus histograms use are hdrh's own figures."""
    rng = np.random.default_rng(7)
    h = hdr.new_histogram()
    values = np.concatenate([rng.integers(1, 3000, 4000), rng.lognormal(10, 2, 16000).astype(np.int64) + 1])
    hdr.record_many(h, values)
    bounds = [1, 999, 1000, 2047, 2048, 5000, 1e5, 1e6, 1e8, 4e9]
    walked = [(it.value_iterated_to, it.count_at_value_iterated_to) for it in h.get_recorded_iterator()]
    assert hdr.cumulative_at(h, bounds) == [sum(c for v, c in walked if v <= b) for b in bounds]
    expected = h.get_mean_value() * h.get_total_count()
    assert abs(hdr.total_estimate(h) - expected) <= 1e-9 * expected
    assert hdr.cumulative_at(hdr.new_histogram(), bounds) == [0] * len(bounds)


READERS = {
    "all": lambda r: r.all.total,
    "scenarios": lambda r: r.scenarios["s1"].total,
    "cells": lambda r: r.cells[("s1", 1)].total,
    "total": lambda r: r.total,
    "result": lambda r: r.result().cells[("s1", 1)],
    "take_delta": lambda r: _merged(r.take_delta()),
    "flush": lambda r: (r.flush(), r.all.total)[1],
}


def _merged(wire: dict) -> object:
    out = RunAggregates()
    out.merge_wire(wire)
    return out.cells[("s1", 1)]


@pytest.mark.parametrize("reader", READERS)
def test_a_recorder_s_readers_see_every_record_it_was_given(reader: str) -> None:
    """Records wait in the recorder's queue (accounted a batch at a time): whichever way it is read,
    every one given before is in the figures, SLO judgements and conversation calls included."""
    rng = random.Random(3)
    rec = Recorder(per_scenario=True, per_endpoint=True)
    recs = [make_record(i, rng) for i in range(5)]
    for r in recs:
        r.scenario, r.endpoint, r.session, r.session_last = "s1", 1, "c1", r is recs[-1]
        rec.add(r)
        rec.judge_request(r, good=True)
        rec.converse(r, good=True)
    agg = READERS[reader](rec)
    assert agg.completed == 5 and agg.totals["slo_judged"] == 5 and agg.totals["slo_good"] == 5
    assert agg.hists["ttft"].get_total_count() == 5
    if reader != "take_delta":  # the conversation's figures are the whole run's track's
        whole = rec.result().all
        assert whole.totals[LIVE_STARTED] == whole.totals[LIVE_COMPLETED] == whole.totals[LIVE_GOOD] == 1
