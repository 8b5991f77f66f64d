"""SSE parsing against the OpenAI streaming checklist (docs/sources.md §5)."""

from __future__ import annotations

import json

import pytest

from loadtest.client import sse
from loadtest.client.http import is_media_type
from loadtest.client.sse import parse_stream


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(content: str | None = None, finish: str | None = None, **delta: object) -> bytes:
    d = dict(delta)
    if content is not None:
        d["content"] = content
    return ev(
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}
    )


DONE = b"data: [DONE]\n\n"
ROLE = chunk("", role="assistant")
USAGE = ev(
    {
        "choices": [],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}},
    }
)


def test_empty_first_delta_is_not_a_token() -> None:
    r = parse_stream([ROLE, chunk(" a"), chunk(" b"), chunk(finish="stop"), DONE], [10, 20, 30, 40, 50])
    assert r.first_token_ns == 20
    assert r.chunk_ns == [20, 30]
    assert r.answer_text == " a b"
    assert r.complete and r.finish_reason == "stop" and r.saw_done


def test_null_content_and_role_only_deltas_are_not_tokens() -> None:
    body = ev({"choices": [{"delta": {"role": "assistant", "content": None}}]}) + chunk(" x") + DONE
    r = parse_stream([body], [5])
    assert r.chunk_ns == [5]


def test_reasoning_fields_count_as_first_token_but_not_first_answer() -> None:
    parts = [
        ROLE,
        chunk(reasoning_content="think"),
        chunk(reasoning=" more"),
        chunk(" answer"),
        chunk(finish="stop"),
        DONE,
    ]
    r = parse_stream(parts, [1, 2, 3, 4, 5, 6])
    assert r.first_token_ns == 2
    assert r.first_answer_ns == 4
    assert r.reasoning_text == "think more"
    assert r.answer_text == " answer"
    assert r.chunk_ns == [2, 3, 4]


def test_usage_chunk_is_read() -> None:
    r = parse_stream([chunk(" a") + chunk(finish="length") + USAGE + DONE], [1])
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (7, 2)
    assert r.usage.prompt_tokens_details == {"cached_tokens": 3}
    assert r.finish_reason == "length"


def test_no_usage_when_server_sends_none() -> None:
    r = parse_stream([chunk(" a") + chunk(finish="stop") + DONE], [1])
    assert r.usage is None and r.complete


def test_error_frame_in_a_200_stream() -> None:
    r = parse_stream([chunk(" a") + ev({"error": {"message": "engine died", "type": "server_error"}})], [1])
    assert r.error == "engine died"
    assert r.chunk_ns == [1]


def test_vllm_style_error_object() -> None:
    r = parse_stream([ev({"object": "error", "message": "out of memory"})], [1])
    assert r.error == "out of memory"


def test_comment_lines_are_skipped() -> None:
    body = b": keep-alive\n\n" + chunk(" a") + b": ping\n\n" + chunk(finish="stop") + DONE
    r = parse_stream([body], [1])
    assert r.events == 2 and r.chunk_ns == [1] and r.malformed == 0


def test_event_split_across_reads_takes_the_time_of_the_read_that_completes_it() -> None:
    a = chunk(" a")
    b = chunk(" b")
    reads = [a + b[:10], b[10:30], b[30:] + DONE]
    r = parse_stream(reads, [100, 200, 300])
    assert r.chunk_ns == [100, 300]


def test_terminator_split_between_reads() -> None:
    a = chunk(" a")
    r = parse_stream([a[:-1], a[-1:] + chunk(" b") + DONE], [1, 2])
    assert r.chunk_ns == [2, 2]  # event a only ends with the second newline


def test_several_events_in_one_read_share_its_time() -> None:
    r = parse_stream([chunk(" a") + chunk(" b") + chunk(" c"), chunk(" d") + DONE], [7, 9])
    assert r.chunk_ns == [7, 7, 7, 9]


def test_stream_without_finish_or_done_is_truncated() -> None:
    r = parse_stream([ROLE + chunk(" a") + chunk(" b")], [1])
    assert not r.complete
    assert r.chunk_ns == [1, 1]


def test_event_cut_mid_json_is_truncation_not_malformed() -> None:
    r = parse_stream([chunk(" a") + chunk(" b")[:25]], [1])
    assert not r.complete and r.incomplete_tail and r.malformed == 0 and r.chunk_ns == [1]


def test_malformed_json_event_is_counted() -> None:
    r = parse_stream([chunk(" a") + b"data: {not json\n\n" + chunk(finish="stop") + DONE], [1])
    assert r.malformed == 1 and r.chunk_ns == [1] and r.complete


def test_crlf_line_endings_even_split_across_reads() -> None:
    body = (chunk(" a") + chunk(" b") + chunk(finish="stop") + DONE).replace(b"\n", b"\r\n")
    i = body.index(b"\r\n\r\n") + 1  # split between \r and \n
    r = parse_stream([body[:i], body[i:]], [1, 2])
    assert r.chunk_ns == [2, 2] and r.complete and r.answer_text == " a b"


def test_multiline_data_and_other_fields() -> None:
    obj = json.dumps({"choices": [{"delta": {"content": " x"}}]})
    body = (
        b"event: message\nid: 1\ndata: "
        + obj[:10].encode()
        + b"\ndata: "
        + obj[10:].encode()
        + b"\n\n"
        + DONE
    )
    r = parse_stream([body], [3])
    # SSE joins data lines with a newline; JSON tolerates it between tokens only, so split at a safe place.
    assert r.events == 1
    assert r.saw_done


def test_tool_call_deltas_are_tokens() -> None:
    tc = [{"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": ""}}]
    tc2 = [{"index": 0, "function": {"arguments": '{"city":"Paris"}'}}]
    r = parse_stream(
        [chunk(tool_calls=tc), chunk(tool_calls=tc2), chunk(finish="tool_calls"), DONE], [1, 2, 3, 4]
    )
    assert r.chunk_ns == [1, 2]
    assert r.tool_text == '{"city":"Paris"}'
    assert r.finish_reason == "tool_calls"


def test_completions_text_field() -> None:
    c = [
        ev({"object": "text_completion", "choices": [{"index": 0, "text": t, "finish_reason": None}]})
        for t in ["", " a", " b"]
    ]
    r = parse_stream(
        c + [ev({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}), DONE], [1, 2, 3, 4, 5]
    )
    assert r.chunk_ns == [2, 3] and r.answer_text == " a b" and r.finish_reason == "length"


def test_done_without_trailing_blank_line_still_counts() -> None:
    r = parse_stream([chunk(" a") + b"data: [DONE]"], [1])
    assert r.saw_done and r.complete


def test_empty_body() -> None:
    r = parse_stream([], [])
    assert not r.complete and r.events == 0 and r.chunk_ns == []


def test_data_prefix_inside_the_text_is_kept() -> None:
    r = parse_stream([chunk("data: x") + chunk(" and data: y") + chunk("", "stop") + DONE], [5])
    assert r.answer_text == "data: x and data: y" and r.chunk_ns == [5, 5] and r.complete


def test_a_short_last_line_falls_back_and_is_read() -> None:
    r = parse_stream([chunk(" a") + b"data: 1\n\n"], [3])
    assert r.chunk_ns == [3] and r.answer_text == " a"


@pytest.mark.parametrize("small_body", [0, 1 << 30], ids=["array-split", "bytes-split"])
@pytest.mark.parametrize("n", [2, 50])
def test_times_per_read_over_many_reads_of_one_event_each(
    n: int, small_body: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sse, "SMALL_BODY", small_body)  # short bodies and long ones take either split
    events = [chunk(f" t{i}") for i in range(n)]
    r = parse_stream([*events, DONE], [10 * i for i in range(n + 1)])
    assert r.chunk_ns == [10 * i for i in range(n)] and r.saw_done


def test_an_empty_data_buffer_is_a_heartbeat_not_an_event() -> None:
    """WHATWG: ``data:`` or ``data: `` alone before a blank line dispatches nothing (docs/sources.md §5)."""
    body = [
        chunk(" a"),
        b"data:\n\n",
        chunk(" b"),
        b"data: \n\n",
        b"data: \r\n\r\n",
        chunk(finish="stop"),
        DONE,
    ]
    r = parse_stream(body, [10, 20, 30, 40, 50, 60, 70])
    assert r.malformed == 0 and r.events == 3 and not r.error
    assert r.chunk_ns == [10, 30] and r.answer_text == " a b" and r.complete


def test_a_cr_at_the_end_of_a_read_ends_its_line_at_that_read() -> None:
    """CR-only endings: each event is timed at the read holding its terminating CRs, not the next read."""
    cr = [c.replace(b"\n", b"\r") for c in (chunk(" a"), chunk(" b"), chunk(finish="stop"), DONE)]
    r = parse_stream(cr, [10, 20, 30, 40])
    assert r.chunk_ns == [10, 20] and r.first_token_ns == 10 and r.complete and r.saw_done


def test_a_lf_opening_a_read_after_a_cr_is_the_second_half_of_a_crlf() -> None:
    a, b = (c.replace(b"\n", b"\r\n") for c in (chunk(" a"), chunk(" b")))
    # the first event's last CR ends one read, its LF opens the next read
    r = parse_stream([a[:-1], a[-1:] + b, chunk(finish="stop") + DONE], [10, 20, 30])
    assert r.chunk_ns == [10, 20] and r.answer_text == " a b" and r.malformed == 0


def _tool_stream(*calls: object) -> list[bytes]:
    return [chunk(tool_calls=[c]) for c in calls] + [chunk(finish="tool_calls"), DONE]


def test_tool_call_arguments_as_an_object_are_read_and_noted_off_shape() -> None:
    r = parse_stream(
        _tool_stream({"index": 0, "function": {"name": "f", "arguments": {"city": "Paris"}}}), [1, 2, 3]
    )
    assert r.tool_text == '{"city":"Paris"}' and r.chunk_ns == [1]
    assert r.off_shape.count == 1 and "arguments as a JSON object" in r.off_shape.describe()


def test_tool_calls_that_are_not_objects_never_raise() -> None:
    r = parse_stream(
        _tool_stream({"index": 0, "function": "f"}, "a string", 7, {"function": {"arguments": "{}"}}),
        [1, 2, 3, 4, 5, 6],
    )
    assert r.off_shape.count == 3 and r.tool_text == "{}"
    assert "function that is a JSON string" in r.off_shape.first


def test_a_delta_of_the_wrong_type_is_a_malformed_event() -> None:
    bad = ev({"choices": [{"delta": "text", "finish_reason": None}]})
    r = parse_stream([chunk(" a"), bad, chunk(finish="stop"), DONE], [1, 2, 3, 4])
    assert r.malformed == 1 and r.answer_text == " a" and r.malformed_sample == bad[6:-2]


def test_media_types_are_compared_case_insensitively_without_parameters() -> None:
    assert is_media_type("Text/Event-Stream; charset=UTF-8", "text/event-stream")
    assert is_media_type(" text/event-stream ", "text/event-stream")
    assert not is_media_type("text/event-streams", "text/event-stream")
    assert not is_media_type("application/json; x=text/event-stream", "text/event-stream")
