"""The typed contracts (loadtest/contracts/): the record-log line keeps every field both ways and the bytes
it has always had; every master/worker message survives its dict form; a bad message names itself."""

from __future__ import annotations

import json
import math
import random
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from loadtest.client.record import (
    RECORD_FIELDS,
    RequestRecord,
    line_input_tokens,
    line_output_tokens,
    rounded,
)
from loadtest.contracts.messages import (
    Failing,
    Final,
    Finish,
    Hello,
    MessageError,
    Ready,
    Report,
    Settings,
    Standby,
    WireMessage,
    from_data,
    report_from,
    to_data,
)
from loadtest.contracts.record_line import (
    LINE_DECODER,
    LINE_ENCODER,
    AgenticTurn,
    RecordLine,
    as_line,
    to_dict,
)
from loadtest.metrics.judged import record_from_line
from loadtest.results.columns import LogReader
from loadtest.results.record_log import RecordLog, read_lines

B = 10**12

# Written literally as the code before the contracts wrote them (RequestRecord.to_log as a dict,
# msgspec-encoded): a retried chat call, and an embeddings call (the only kind with "inputs").
OLD_CHAT = (
    b'{"id":"chat-7.r1","wire_id":"5f0c2a4e-0000-4000-8000-000000000007","scenario":"chat","api":"chat",'
    b'"stream":true,"worker":2,"t":1700000000.123457,"outcome":"ok","status":200,"error":null,'
    b'"finish_reason":"stop","sent_us":150,"headers_us":2000,"ttft_us":30000,"first_answer_us":31000,'
    b'"e2e_us":90000,"tpot_us":30000.0,"chunks_us":[30000,60000,90000],"requested_output_tokens":3,'
    b'"prompt_tokens":12,"output_tokens":3,"reasoning_tokens":0,"usage_prompt_tokens":12,'
    b'"usage_completion_tokens":3,"usage_cached_tokens":8,"usage_reasoning_tokens":null,"attempt":1,'
    b'"retry_of":"chat-7","endpoint":1}'
)
OLD_EMBEDDINGS = (
    b'{"id":"chat-7.r1","wire_id":"5f0c2a4e-0000-4000-8000-000000000007","scenario":"chat",'
    b'"api":"embeddings","stream":false,"worker":2,"t":1700000000.123457,"outcome":"ok","status":200,'
    b'"error":null,"finish_reason":null,"sent_us":150,"headers_us":2000,"ttft_us":null,'
    b'"first_answer_us":null,"e2e_us":90000,"tpot_us":null,"chunks_us":[],"requested_output_tokens":null,'
    b'"prompt_tokens":12,"output_tokens":0,"reasoning_tokens":0,"usage_prompt_tokens":12,'
    b'"usage_completion_tokens":null,"usage_cached_tokens":null,"usage_reasoning_tokens":null,"attempt":1,'
    b'"retry_of":"chat-7","endpoint":1,"inputs":4}'
)
# A line of an earlier version still: no wire_id, attempt, retry_of, endpoint.
OLDER = (
    b'{"id":"a-1","scenario":"a","api":"chat","stream":true,"worker":0,"t":1700000001.5,"outcome":"http_5xx",'
    b'"status":503,"error":"HTTP 503: busy","finish_reason":null,"sent_us":10,"headers_us":900,"ttft_us":null,'
    b'"first_answer_us":null,"e2e_us":1000,"tpot_us":null,"chunks_us":[],"requested_output_tokens":64,'
    b'"prompt_tokens":5,"output_tokens":0,"reasoning_tokens":0,"usage_prompt_tokens":null,'
    b'"usage_completion_tokens":null,"usage_cached_tokens":null,"usage_reasoning_tokens":null}'
)


def _record(inputs: int) -> RequestRecord:
    """The record OLD_CHAT (inputs 0) or OLD_EMBEDDINGS (inputs 4) was written from."""
    chat = not inputs
    return RequestRecord(
        request_id="chat-7.r1",
        wire_id="5f0c2a4e-0000-4000-8000-000000000007",
        scenario="chat",
        api="chat" if chat else "embeddings",
        stream=chat,
        worker=2,
        scheduled_epoch=1700000000.1234567,
        scheduled_ns=B,
        sent_ns=B + 150_000,
        headers_ns=B + 2_000_000,
        first_token_ns=B + 30_000_000 if chat else 0,
        first_answer_ns=B + 31_000_000 if chat else 0,
        done_ns=B + 90_000_000,
        chunk_ns=[B + 30_000_000, B + 60_000_000, B + 90_000_000] if chat else [],
        http_status=200,
        outcome="ok",
        finish_reason="stop" if chat else None,
        requested_output_tokens=3 if chat else None,
        prompt_tokens_client=12,
        completion_tokens_client=3 if chat else 0,
        prompt_tokens_server=12,
        completion_tokens_server=3 if chat else None,
        cached_tokens_server=8 if chat else None,
        attempt=1,
        retry_of="chat-7",
        endpoint=1,
        inputs=inputs,
    )


def _every_field_set() -> RequestRecord:
    """A record with every field the line holds set to a value that is not its default."""
    return RequestRecord(
        request_id="agent-3.t2.r2",
        wire_id="0b1c6a2e-3d4f-4a5b-8c9d-0e1f2a3b4c5d",
        scenario="agent",
        api="responses",
        stream=True,  # the default, and needed for a TPOT: its False is checked apart
        worker=5,
        scheduled_epoch=1700000123.25,
        scheduled_ns=B,
        sent_ns=B + 1_000,
        headers_ns=B + 2_000,
        first_token_ns=B + 3_000,
        first_answer_ns=B + 4_000,
        done_ns=B + 9_000,
        chunk_ns=[B + 3_000, B + 6_000, B + 6_000],
        chunk_chars=[4, 7, 2],
        endpoints_tpot_tokens=1,
        new_connection=[12, 80, 0, 900],
        endpoints_output_tokens=5,
        session="agent-3",
        session_last=True,
        job_us=[1_000, 2_000, 3_000, 500],
        agentic=AgenticTurn(
            "fix", 3, [["bash", '{"cmd": "ls"}']], ["I001"], [["bash", "{}"]], "why", "intent: I001"
        ),
        http_status=500,
        outcome="stream_error",
        error="connection reset mid-stream",
        finish_reason="length",
        requested_output_tokens=128,
        prompt_tokens_client=100,
        completion_tokens_client=3,
        reasoning_tokens_client=2,
        prompt_tokens_server=101,
        completion_tokens_server=4,
        cached_tokens_server=64,
        reasoning_tokens_server=1,
        attempt=2,
        retry_of="agent-3.t2",
        endpoint=3,
        inputs=7,
        merged_gaps=2,
        quality_failed=["json", "match"],
        retry_after_s=1.5,  # not a line field: never written
        answer_text="kept in memory only",
    )


# ---------------------------------------------------------------- the record-log line
def test_a_record_with_every_field_set_keeps_every_value_through_the_line() -> None:
    rec = _every_field_set()
    line = rec.to_log()
    assert isinstance(line, RecordLine)
    data = LINE_ENCODER.encode(line)
    back = LINE_DECODER.decode(data)
    assert back == line
    defaults = RecordLine()
    # nothing left at its default: every value travelled (first_chunk_tokens is only read, from older logs)
    for name in RecordLine.__struct_fields__:
        if name not in ("stream", "first_chunk_tokens"):
            assert getattr(back, name) != getattr(defaults, name), name
    unstreamed = msgspec.structs.replace(line, stream=False)
    assert LINE_DECODER.decode(LINE_ENCODER.encode(unstreamed)).stream is False
    assert (back.attempt, back.retry_of, back.endpoint, back.inputs) == (2, "agent-3.t2", 3, 7)
    assert (back.wire_id, back.usage_reasoning_tokens, back.first_answer_us) == (rec.wire_id, 1, 4)
    assert json.loads(data) == to_dict(back)
    # ... and the inverse direction restores the record, except what the line never held.
    again = RequestRecord.from_log(back, B)
    left_out = {"retry_after_s", "answer_text", "tool_calls_text", "body_sent"}
    assert RECORD_FIELDS[:3] == ("request_id", "wire_id", "scenario") and "agentic" in RECORD_FIELDS
    for name in RECORD_FIELDS:
        if name not in left_out:
            assert getattr(again, name) == getattr(rec, name), name
    assert again.to_log() == line
    assert record_from_line(to_dict(back)).to_log() == line  # the dict form: the same record


def test_the_line_rounding_is_pythons_round_to_the_bit() -> None:
    """``rounded`` (the line's time and TPOT) gives round()'s double, sign included, on epoch times,
    TPOTs and values of every size, on exact halves (ties to even) and their neighbours, and outside
    its fast range."""
    rng = random.Random(7)
    values: list[tuple[float, int]] = []
    for _ in range(200_000):
        values.append((1.7e9 + rng.random() * 1e8, 6))  # epoch seconds
        values.append((rng.random() * 10 ** rng.randint(-3, 7), 1))  # TPOT µs
        values.append((rng.random() * 10 ** rng.randint(-8, 12), 6))
        near = (rng.randint(1, 10**15) + 0.5) / 1e6  # the double nearest a half
        odd = rng.randrange(1, 10**9, 2)  # odd / 128 * 1e6 and odd / 4 * 10 are exact halves
        for x, d in ((near, 6), (odd / 128, 6), (odd / 4, 1), ((odd + 0.5) / 10, 1)):
            values += [(x, d), (math.nextafter(x, 0), d), (math.nextafter(x, math.inf), d)]
    specials = (0.0, -0.0, -1.5, 0.49999999999999994, 0.25, 0.75, 1e300, math.inf, -math.inf, 1e-310)
    values += [(v, d) for v in specials for d in (1, 6)]
    wrong = [
        (x, d)
        for x, d in values
        if (got := rounded(x, d, 10.0**d)) != (want := round(x, d))
        or math.copysign(1, got) != math.copysign(1, want)
    ]
    assert not wrong, wrong[:5]
    assert math.isnan(rounded(math.nan, 6, 1e6))


@pytest.mark.parametrize(("inputs", "old"), [(0, OLD_CHAT), (4, OLD_EMBEDDINGS)])
def test_the_bytes_written_are_those_of_before(inputs: int, old: bytes) -> None:
    line = _record(inputs).to_log()
    assert LINE_ENCODER.encode(line) == old
    assert ("inputs" in json.loads(old)) == bool(inputs)  # written only when non-zero, as before


@pytest.mark.parametrize("old", [OLD_CHAT, OLD_EMBEDDINGS, OLDER])
def test_old_lines_still_decode(old: bytes) -> None:
    line = LINE_DECODER.decode(old)
    as_json = json.loads(old)
    for key, value in as_json.items():
        assert getattr(line, key) == value, key
    assert line.n_inputs == as_json.get("inputs", 0)
    if old is OLDER:  # keys it predates take the defaults
        assert (line.wire_id, line.attempt, line.retry_of, line.endpoint) == (None, 0, None, 0)
    else:  # today's lines come back byte for byte
        assert LINE_ENCODER.encode(line) == old
        assert to_dict(line) == as_json


def test_writer_and_readers_agree_on_the_line(tmp_path: Path) -> None:
    log = RecordLog(tmp_path / "records.jsonl")
    for rec in (_record(0), _record(4), _every_field_set()):
        log.write(rec)
    log.close()
    raw = (tmp_path / "records.jsonl").read_bytes()
    assert raw.startswith(OLD_CHAT + b"\n" + OLD_EMBEDDINGS + b"\n")
    lines = list(read_lines([log.path]))
    assert [ln.id for ln in lines] == ["chat-7.r1", "chat-7.r1", "agent-3.t2.r2"]
    assert [to_dict(ln) for ln in lines] == [json.loads(x) for x in raw.splitlines()]
    batch = next(LogReader([log.path]).batches())  # the columnar reader: the same struct, chunks in bulk
    assert batch.n == 3 and batch.n_chunks.tolist() == [3, 0, 3]
    assert batch.f["usage_cached_tokens"][0] == 8 and batch.errors[2] == "connection reset mid-stream"


def test_token_helpers_and_as_line_take_both_forms() -> None:
    line = _record(0).to_log()
    for form in (line, to_dict(line)):
        assert line_output_tokens(form) == 3 and line_input_tokens(form) == 12
    assert as_line(line) is line
    assert as_line({"outcome": "ok", "t": 5}).t == 5.0  # missing keys: the defaults
    with pytest.raises(msgspec.ValidationError, match="status"):
        as_line({"status": "busy"})


# ---------------------------------------------------------------- master/worker messages
DELTA: dict[str, Any] = {
    "all": {"hists": {"ttft": "HISTFAAAA"}, "outcomes": {"ok": 3}, "totals": {"output_tokens": 9}},
    "scenarios": {},
}
MESSAGES: list[WireMessage] = [
    Hello(),
    Standby(),
    Settings(
        index=1, settings='{"run_id": "r"}', profile='{"name": "p"}', profile_name="p", fingerprint="ab12"
    ),
    Ready(index=1, host="h", pid=42, error=None, records="/tmp/worker-1.records.jsonl"),
    Ready(index=0, host="h", pid=43, error="cannot read the API key"),
    Finish(drain=True, timeout=60.0),
    Final(index=1, delta=DELTA, lines=zlib.compress(OLD_CHAT + b"\n"), count=1, left="SIGTERM"),
    Failing(index=0, info={"failed_in_a_row": 57, "seconds": 3.5, "commonest": "http_5xx: HTTP 503"}),
    Report(index=1, delta=DELTA, lines=b"", in_flight=4),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: f"{type(m).__name__}")
def test_every_message_round_trips_through_its_dict_form(msg: WireMessage) -> None:
    data = to_data(msg)
    assert isinstance(data, dict)
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(data))  # what Locust's msgpack carries
    assert wire == data
    assert from_data(type(msg), wire) == msg


def test_the_report_rides_in_locusts_report_under_its_own_keys() -> None:
    report = Report(index=2, delta=DELTA, lines=b"x", in_flight=1)
    locust_report: dict[str, Any] = {"stats": [], "errors": {}, "user_count": 3}
    assert report_from(locust_report) is None  # no run yet
    locust_report.update(to_data(report))
    assert set(locust_report) >= {"loadtest_index", "loadtest", "loadtest_lines", "loadtest_in_flight"}
    assert report_from(locust_report) == report


@pytest.mark.parametrize(
    ("kind", "data", "missing"),
    [
        (Settings, {"index": 0, "settings": "{}", "profile": "{}", "profile_name": "p"}, "fingerprint"),
        (Ready, {"index": 0, "host": "h"}, "pid"),
        (Finish, {"drain": True}, "timeout"),
        (Final, {"index": 0, "delta": {}, "count": 0}, "lines"),
        (Failing, {"index": 0}, "info"),
        (Report, {"loadtest_index": 0, "loadtest": {}}, "loadtest_lines"),
    ],
)
def test_a_message_with_a_missing_field_names_the_message(
    kind: type[WireMessage], data: dict, missing: str
) -> None:
    with pytest.raises(MessageError) as e:
        from_data(kind, data)
    assert kind.TYPE in str(e.value) and kind.__name__ in str(e.value) and missing in str(e.value)


def test_a_message_with_a_wrong_type_names_the_message_and_the_field() -> None:
    with pytest.raises(MessageError, match=r"loadtest_finish message \(Finish\).*drain"):
        from_data(Finish, {"drain": "yes", "timeout": 1.0})
    with pytest.raises(MessageError, match=r"loadtest_ready message \(Ready\)"):
        from_data(Ready, None)
