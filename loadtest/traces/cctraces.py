"""Reader for the WEKA / SemiAnalysis cc-traces JSONL: recorded coding-agent sessions with subagent trees.

One JSON object a line, one recorded session each (docs/sources.md §18)::

    {"id": "s1", "models": ["m"], "block_size": 64, "system_tokens": 900, "tool_tokens": 3000,
     "requests": [
       {"type": "s", "t": 0.0, "model": "m", "in": 4100, "out": 120, "hash_ids": [1, 2], "api_time": 2.1},
       {"type": "subagent", "t": 2.5, "agent_id": "a1", "subagent_type": "Explore", "duration_ms": 9000,
        "requests": [{"type": "n", "t": 2.6, "model": "m", "in": 1500, "out": 80, "hash_ids": [7]}]},
       ...]}

``t`` is seconds from the session's start (a subagent call's ``t`` below its subagent's own ``t`` counts
from the subagent's start), ``in``/``out`` the call's input and output tokens, ``hash_ids`` its
prefix-chained blocks of ``block_size`` tokens, ``api_time`` (s) how long the call took, ``type`` ``n``
(whole answer) or ``s`` (streamed, with ``ttft``). Unknown keys are ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from loadtest.traces._io import finish, open_text
from loadtest.traces.agent_graph import AgentCall, Conversation, Subagent, parent_steps, subagent_of
from loadtest.traces.errors import TraceFormatError
from loadtest.traces.record import TraceRecord

Count = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class _Call(msgspec.Struct, tag_field="type", tag="n"):
    t: Seconds
    input_length: Count = msgspec.field(name="in")
    output_length: Count = msgspec.field(name="out")
    model: str = ""
    hash_ids: list[int] = msgspec.field(default_factory=list)
    api_time: Seconds | None = None
    think_time: Seconds | None = None


class _StreamedCall(_Call, tag="s"):
    ttft: Seconds | None = None


class _Subagent(msgspec.Struct, tag_field="type", tag="subagent"):
    t: Seconds
    agent_id: str
    subagent_type: str = ""
    duration_ms: Count | None = None
    requests: list[_Call | _StreamedCall] = msgspec.field(default_factory=list)
    tool_tokens: Count = 0
    system_tokens: Count = 0


class _Trace(msgspec.Struct):
    id: str
    block_size: Annotated[int, msgspec.Meta(ge=1)]
    requests: list[_Call | _StreamedCall | _Subagent]
    models: list[str] = msgspec.field(default_factory=list)
    tool_tokens: Count = 0
    system_tokens: Count = 0


_DECODER = msgspec.json.Decoder(_Trace)


def read_cc_conversations(path: Path | str) -> list[Conversation]:
    """Every session of a cc-traces file as a session graph (ids unique; a malformed line names the file,
    the line and the field)."""
    path = Path(path)
    out: list[Conversation] = []
    seen: dict[str, int] = {}
    with open_text(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            text = raw.strip()
            if not text:
                continue
            try:
                trace = _DECODER.decode(text)
            except msgspec.ValidationError as e:
                raise TraceFormatError(path, lineno, f"{e} (a cc-traces session, docs/traces.md)") from None
            except msgspec.DecodeError as e:
                raise TraceFormatError(path, lineno, f"invalid JSON: {e}") from None
            if trace.id in seen:
                raise TraceFormatError(
                    path, lineno, f"field 'id': {trace.id!r} is also line {seen[trace.id]}"
                )
            seen[trace.id] = lineno
            out.append(_conversation(trace, path, lineno))
    if not out:
        raise TraceFormatError(path, None, "trace holds no sessions")
    return out


def first_block_tokens(path: Path | str) -> int:
    """The first session's ``block_size`` (tokens per hash block), read from the first line only."""
    path = Path(path)
    with open_text(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            if raw.strip():
                try:
                    return _DECODER.decode(raw.strip()).block_size
                except msgspec.DecodeError as e:  # a ValidationError too
                    raise TraceFormatError(
                        path, lineno, f"{e} (a cc-traces session, docs/traces.md)"
                    ) from None
    raise TraceFormatError(path, None, "trace holds no sessions")


def read_cc_traces(path: Path) -> list[TraceRecord]:
    """The calls of every session as flat trace records (the registry's reader): ``session_id`` is the
    session's id, a subagent's ``<id>/<agent_id>`` with ``parent_id`` the session's; ``kind`` is
    ``main`` or the subagent's type; each session starts at 0 s."""
    records: list[TraceRecord] = []
    for conv in read_cc_conversations(path):
        for turn, call in enumerate(conv.parent_calls):
            records.append(_record(call, conv.id, turn, None, "main"))
        for agent in conv.subagents:
            for turn, call in enumerate(agent.calls):
                records.append(_record(call, f"{conv.id}/{agent.agent_id}", turn, conv.id, agent.kind))
    return finish(records, Path(path))


def _record(call: AgentCall, session: str, turn: int, parent: str | None, kind: str) -> TraceRecord:
    return TraceRecord(
        call.start_s,
        call.input_tokens,
        call.output_tokens,
        call.hash_ids,
        session_id=session,
        turn=turn,
        parent_id=parent,
        kind=kind,
        model=call.model or None,
    )


def _call(c: _Call, start_s: float, ready_s: float) -> AgentCall:
    """``ready_s``: when what the call waited for had finished (its delay is the gap to ``start_s``)."""
    return AgentCall(
        start_s=start_s,
        input_tokens=c.input_length,
        output_tokens=c.output_length,
        hash_ids=tuple(c.hash_ids),
        api_time_s=c.api_time or 0.0,
        delay_before_s=max(0.0, start_s - ready_s),
        streaming=isinstance(c, _StreamedCall),
        model=c.model,
        ttft_s=c.ttft if isinstance(c, _StreamedCall) else None,
    )


def _subagent(entry: _Subagent) -> Subagent:
    """A subagent's calls (``t`` below the subagent's own counts from its start), packed into streams."""
    calls = [_call(r, _absolute(r.t, entry.t), entry.t) for r in entry.requests]
    end = entry.t + entry.duration_ms / 1000.0 if entry.duration_ms is not None else entry.t
    return subagent_of(entry.agent_id, entry.subagent_type, entry.t, end, calls)


def _absolute(t: float, subagent_t: float) -> float:
    """A subagent call's start from the session's start (a ``t`` below the subagent's counts from it)."""
    return t if t + 1e-6 >= subagent_t else subagent_t + t


def _conversation(trace: _Trace, path: Path, lineno: int) -> Conversation:
    """The parent's calls and its fan-outs (consecutive subagents), in the recorded order."""
    calls = [_call(r, r.t, 0.0) for r in trace.requests if not isinstance(r, _Subagent)]
    subagents = [_subagent(r) for r in trace.requests if isinstance(r, _Subagent)]
    if not calls and not subagents:
        raise TraceFormatError(path, lineno, f"field 'requests': session {trace.id!r} holds no calls")
    steps = parent_steps(calls, subagents)
    return Conversation(trace.id, trace.block_size, steps, trace.system_tokens, trace.tool_tokens)
