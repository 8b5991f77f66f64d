"""Merged gaps (docs/metrics.md): a token gap whose later event arrived in one read with another token event
times the client's reads, not the server. Against a server that writes most events alone 10 ms apart and
three times writes 3 events at once after 40 ms, each record counts the 9 gaps that end in a burst, ITL
leaves exactly those out (so no 40 ms gap and no zero gap reaches its percentiles), run.json counts them
and a note says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import read_lines, run_cli, write_profile  # noqa: E402
from fault_servers import BURSTY_MERGED, BURSTY_TOKENS, FaultServer  # noqa: E402

from loadtest.client.record import (  # noqa: E402
    SMALL_STREAM,
    RequestRecord,
    count_merged_gaps,
    merged_flags,
    merged_gap_mask,
)
from loadtest.metrics.delivery import MIN_EVENTS  # noqa: E402
from loadtest.metrics.recorder import Recorder  # noqa: E402


@pytest.mark.parametrize(
    ("times", "merged"),
    [
        ([0, 10, 20, 30], [False, False, False]),  # one event per read: every gap timed
        ([0, 10, 10, 20], [True, True, False]),  # the gap into a 2-event read, and the zero inside it
        ([0, 0, 10, 20], [True, False, False]),  # the first read held two: its zero gap only
        ([0, 10, 10, 10], [True, True, True]),
        ([0, 5, 5, 9, 9], [True, True, True, True]),
        ([7, 7], [True]),
    ],
)
def test_a_gap_is_merged_when_its_later_event_shares_its_read(times: list[int], merged: list[bool]) -> None:
    assert merged_gap_mask(np.asarray(times)).tolist() == merged
    assert merged_flags(times) == merged  # the plain-Python scan of short streams
    assert count_merged_gaps(times) == count_merged_gaps(np.asarray(times)) == sum(merged)


def test_no_gap_no_merge() -> None:
    assert count_merged_gaps([]) == count_merged_gaps([5]) == 0


def _streamed(chunks_ms: list[int]) -> RequestRecord:
    """An ok streamed record whose chunks arrived ``chunks_ms`` after its send."""
    base = 10**12
    chunk_ns = [base + 5_000_000 + c * 1_000_000 for c in chunks_ms]
    rec = RequestRecord(
        request_id="r", outcome="ok", scheduled_epoch=1_700_000_000.0, scheduled_ns=base, sent_ns=base + 1000
    )
    rec.chunk_ns, rec.first_token_ns, rec.done_ns = chunk_ns, chunk_ns[0], chunk_ns[-1] + 1000
    rec.completion_tokens_client = len(chunk_ns)
    rec.merged_gaps = count_merged_gaps(rec.chunk_seq())
    return rec


def _itl_values(rec: RequestRecord) -> tuple[list[int], int]:
    """The ITL values (ms) a recorder keeps of ``rec`` alone, and its merged-gap count."""
    recorder = Recorder(deltas=False)
    recorder.add(rec)
    total = recorder.total
    hist = total.hists["itl"]
    counts = [(it.value_iterated_to, it.count_at_value_iterated_to) for it in hist.get_recorded_iterator()]
    return sorted(v // 1000 for v, n in counts for _ in range(n)), total.totals["itl_merged_gaps"]


def test_a_short_stream_is_timed_as_a_long_one() -> None:
    """Streams of fewer than MIN_EVENTS chunks are scanned in plain Python (client/record.py SMALL_STREAM,
    the recorder's short path): the same ITL values, merged counts and record line as numpy gives."""
    assert SMALL_STREAM <= MIN_EVENTS
    short = [0, 10, 10, 30]  # gaps 10, 0, 20 ms: the first two merged
    rec = _streamed(short)
    assert rec.merged_gaps == 2
    assert _itl_values(rec) == ([20], 2)
    assert rec.to_log().chunks_us == [5000, 15000, 15000, 35000]
    # The same gaps inside a stream long enough for numpy (and the delivery judgement, which finds
    # nothing to leave out of evenly spaced events): the same values, plus the long stream's own.
    long = short + [60 + 30 * k for k in range(MIN_EVENTS)]
    values, merged = _itl_values(_streamed(long))
    assert merged == 2
    assert values == sorted([20, 30] + [30] * (MIN_EVENTS - 1))
    assert _streamed(long).to_log().chunks_us == [5000 + c * 1000 for c in long]


def test_merged_gaps_are_counted_and_kept_out_of_itl(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        output_tokens={"dist": "fixed", "value": BURSTY_TOKENS},
        load={"concurrency": 2},
        judging={"warmup_s": 0},
    )
    out = tmp_path / "out"
    with FaultServer(["bursty_stream"]) as srv:
        res = run_cli(
            ["run", "--profile", str(prof), "--host", srv.base_url, "--duration", "3", "--out", str(out)]
            + ["--endpoint-check", "none", "--model", "fault-model"]
        )
    assert (out / "run.json").is_file(), res.stdout[-2000:] + res.stderr[-2000:]
    lines = [ln for ln in read_lines(sorted(out.glob("records*.jsonl"))) if ln["outcome"] == "ok"]
    assert len(lines) >= 4
    for ln in lines:
        assert len(ln["chunks_us"]) == BURSTY_TOKENS
        # The three bursts, at least (a busy client may merge two lone events as well).
        assert ln["merged_gaps"] >= BURSTY_MERGED
        assert ln["merged_gaps"] == count_merged_gaps(ln["chunks_us"])
    doc = json.loads((out / "run.json").read_text())
    merged = sum(ln["merged_gaps"] for ln in lines)
    gaps = sum(len(ln["chunks_us"]) - 1 for ln in lines)
    itl = doc["metrics"]["latency_ms"]["itl"]
    assert doc["metrics"]["itl_merged"] == {
        "gaps": merged,
        "share": round(merged / gaps, 6),
        "streams": len(lines),  # every answer has 19 events: each is judged for merged delivery
        "merged_streams": 0,  # a burst of three is no buffering proxy
        "burst_gaps": 0,  # its bursts share one read: merged, not separate reads close together
        "burst_streams": 0,
        "whole_streams": 0,  # every stream at the server's pace
    }
    assert itl["count"] == gaps - merged > 0
    # Only the lone events' 10 ms gaps remain: neither the 40 ms waits before a burst (a quarter of the
    # gaps left, were they kept) nor the zeros in it. Their extremes are the machine's: a busy client
    # reads an event late now and then, which shortens the gap after it and lengthens the one before.
    assert 5 < itl["p50"] < 30 and itl["p90"] < 30, itl
    assert any("token gaps" in n and "metrics.itl_merged" in n for n in doc["notes"]), doc["notes"]
