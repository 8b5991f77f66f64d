"""Record lines written once per event-loop pass (results/record_log.py, locust/shipping.py,
locust/context.py): every line reaches its file whole and once, at the pass's flush, at a worker's
report or at the close, whichever comes first; none is lost or written twice when the run ends (or a
worker reports) before the flush."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import gevent

from loadtest.client.record import RequestRecord
from loadtest.contracts.record_line import LINE_ENCODER
from loadtest.locust.context import RunContext
from loadtest.locust.settings import RunSettings
from loadtest.locust.shipping import ShippedLog
from loadtest.results.record_log import RecordLog, read_lines
from tests.conftest import write_profile


def _record(i: int) -> RequestRecord:
    base = 10**12 + i * 10**9
    return RequestRecord(
        request_id=f"chat-{i}",
        scenario="test-chat",
        scheduled_epoch=1_700_000_000.0 + i,
        scheduled_ns=base,
        sent_ns=base + 50_000,
        first_token_ns=base + 2_000_000,
        done_ns=base + 3_000_000,
        chunk_ns=[base + 2_000_000, base + 3_000_000],
        http_status=200,
        outcome="ok" if i % 3 else "http_5xx",
        error="" if i % 3 else "HTTP 503",
        completion_tokens_client=2,
        prompt_tokens_client=12,
    )


def _line(rec: RequestRecord) -> bytes:
    return LINE_ENCODER.encode(rec.to_log()) + b"\n"


def test_lines_added_reach_the_file_at_the_flush_whole_and_once(tmp_path: Path) -> None:
    log = RecordLog(tmp_path / "records.jsonl")
    recs = [_record(i) for i in range(5)]
    for rec in recs[:3]:
        log.add(rec)
    assert log.path.read_bytes() == b"" and log.count == 0  # kept until the flush
    log.flush()
    log.flush()  # nothing kept: nothing written again
    assert log.path.read_bytes() == b"".join(_line(r) for r in recs[:3]) and log.count == 3
    log.add(recs[3])
    log.write(recs[4])  # a line written at once goes after those kept before it
    log.add(recs[0])
    log.close()  # the close writes what is still kept
    assert log.path.read_bytes() == b"".join(_line(r) for r in [*recs, recs[0]])
    assert log.count == 6 and log.lost == 0


def test_a_workers_copy_holds_every_line_it_ships(tmp_path: Path) -> None:
    copy = tmp_path / "worker-0.records.jsonl"
    log = ShippedLog(copy)
    recs = [_record(i) for i in range(4)]
    for rec in recs[:2]:
        log.add(rec)
    assert copy.read_bytes() == b""
    shipped = zlib.decompress(log.take())  # a report: the copy gets the lines first
    assert shipped == copy.read_bytes() == _line(recs[0]) + _line(recs[1])
    log.add(recs[2])
    log.flush()
    log.add(recs[3])
    log.close()
    assert copy.read_bytes() == b"".join(_line(r) for r in recs)  # each once
    assert zlib.decompress(log.take()) == _line(recs[2]) + _line(recs[3])  # the final message's lines
    assert log.take() == b"" and log.count == 4


def test_a_run_that_ends_before_the_flush_keeps_every_record(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml")
    out = tmp_path / "out"
    ctx = RunContext(
        RunSettings("r", str(prof), "http://127.0.0.1:9", str(out), 1.0, 1), 0, 1, "records.jsonl"
    )
    log_path = out / "records.jsonl"
    try:
        for i in range(6):
            ctx.finish(_record(i))
        assert log_path.read_bytes() == b""  # the pass has not ended: its lines wait for one write
        gevent.sleep(0)  # the event loop's pass ends: one flush
        assert [ln.id for ln in read_lines([log_path])] == [f"chat-{i}" for i in range(6)]
        for i in range(6, 9):  # finished, then the run ends (Ctrl-C, the end of the load) at once
            ctx.finish(_record(i))
    finally:
        ctx.close()
    lines = [json.loads(raw) for raw in log_path.read_bytes().splitlines()]
    assert [ln["id"] for ln in lines] == [f"chat-{i}" for i in range(9)]  # each once, in order
    assert ctx.log.count == 9 and ctx.recorder.total.completed == 9
    gevent.sleep(0)  # the flush queued before the close finds nothing left to write
    assert len(log_path.read_bytes().splitlines()) == 9
