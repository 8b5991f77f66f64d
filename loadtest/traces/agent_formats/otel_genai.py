"""Reader for OpenTelemetry GenAI spans exported as JSON: model calls, agents and tools into session graphs.

Accepted shapes (docs/traces.md, docs/sources.md §19): an OTLP JSON export (``resourceSpans`` ->
``scopeSpans`` -> ``spans``, camelCase ids, ``startTimeUnixNano``, attributes as ``{key, value}``), one
such export a line (the collector's file exporter), a ``{"spans": [...]}`` object of flat spans
(inference-perf's trace files: snake_case ids, ISO ``start_time``, attributes as an object), or one flat
span a line. Spans follow the GenAI semantic conventions: ``gen_ai.operation.name`` ``chat`` /
``text_completion`` / ``generate_content`` is a model call (``gen_ai.usage.input_tokens`` /
``output_tokens``), ``invoke_agent`` an agent whose model calls below it are a subagent's when it sits
below another agent, ``execute_tool`` a tool run (its time lies in the gap before the next call). The
conversation is ``gen_ai.conversation.id``, else the trace id. Spans carry no hash ids: each call repeats
its branch's whole previous context, expressed as synthetic ids (agent_graph.chain_hash_ids).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from loadtest.traces._io import open_text
from loadtest.traces.agent_formats.common import BLOCK_TOKENS, CountTokens, first_object, whole_json
from loadtest.traces.agent_graph import (
    AgentCall,
    Conversation,
    Subagent,
    chain_hash_ids,
    parent_steps,
    subagent_of,
)
from loadtest.traces.errors import TraceFormatError

MODEL_OPS = frozenset({"chat", "text_completion", "generate_content"})
_JSON = msgspec.json.Decoder()


@dataclass(slots=True)
class Span:
    """One span, whatever shape it came in."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any] = field(default_factory=dict)
    line: int | None = None


def sniff(first: Any) -> bool:
    """An OTLP export, a ``{"spans": [...]}`` object or one span with ids and times."""
    if not isinstance(first, dict):
        return False
    if "resourceSpans" in first or "resource_spans" in first or isinstance(first.get("spans"), list):
        return True
    return any(k in first for k in ("spanId", "span_id")) and any(k in first for k in ("traceId", "trace_id"))


def read(path: Path, count: CountTokens) -> list[Conversation]:
    """Every conversation of the spans in ``path`` as a session graph."""
    spans = _spans(path)
    by_conv: dict[str, list[Span]] = defaultdict(list)
    by_id = {s.span_id: s for s in spans}
    for s in spans:
        by_conv[_conversation_id(s, by_id)].append(s)
    graphs = (_graph(path, cid, group, by_id) for cid, group in by_conv.items())
    out = [c for c in graphs if c is not None]
    if not out:
        raise TraceFormatError(
            path,
            None,
            "no model-call spans (gen_ai.operation.name chat or text_completion): not GenAI spans?",
        )
    return out


def _spans(path: Path) -> list[Span]:
    lineno, first = first_object(path)
    if lineno is None:  # one JSON value over several lines
        return _from_value(path, whole_json(path), None)
    out: list[Span] = []
    with open_text(path) as fh:
        for n, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                value = _JSON.decode(raw.strip())
            except msgspec.DecodeError as e:
                raise TraceFormatError(path, n, f"invalid JSON: {e}") from None
            out += _from_value(path, value, n)
    return out


def _from_value(path: Path, value: Any, line: int | None) -> list[Span]:
    """The spans of one JSON value: an OTLP export, a {"spans": [...]} object, a list or one span."""
    if isinstance(value, list):
        return [s for v in value for s in _from_value(path, v, line)]
    if not isinstance(value, dict):
        raise TraceFormatError(path, line, f"expected a JSON object, got {type(value).__name__}")
    resource = value.get("resourceSpans", value.get("resource_spans"))
    if resource is not None:
        return [_span(path, raw, line) for raw in _otlp_spans(path, resource, line)]
    if "spans" in value:
        spans = value["spans"]
        if not isinstance(spans, list):
            raise TraceFormatError(path, line, "field 'spans': expected a list of spans")
        return [_span(path, raw, line) for raw in spans]
    return [_span(path, value, line)]


def _otlp_spans(path: Path, resource: Any, line: int | None) -> list[Any]:
    out: list[Any] = []
    for r in _list(path, resource, "resourceSpans", line):
        if not isinstance(r, dict):
            raise TraceFormatError(path, line, "field 'resourceSpans': expected objects")
        for sc in _list(path, r.get("scopeSpans", r.get("scope_spans", [])), "scopeSpans", line):
            if not isinstance(sc, dict):
                raise TraceFormatError(path, line, "field 'scopeSpans': expected objects")
            out += _list(path, sc.get("spans", []), "spans", line)
    return out


def _list(path: Path, value: Any, name: str, line: int | None) -> list[Any]:
    if not isinstance(value, list):
        raise TraceFormatError(path, line, f"field {name!r}: expected a list")
    return value


def _get(raw: dict[str, Any], *names: str) -> Any:
    for n in names:
        if n in raw and raw[n] is not None:
            return raw[n]
    return None


def _span(path: Path, raw: Any, line: int | None) -> Span:
    if not isinstance(raw, dict):
        raise TraceFormatError(path, line, f"a span must be a JSON object, got {type(raw).__name__}")
    span_id = _get(raw, "spanId", "span_id")
    if not isinstance(span_id, str) or not span_id:
        raise TraceFormatError(path, line, "field 'spanId': every span needs its id (a string)")
    where = f"span {span_id!r}"
    trace_id = _get(raw, "traceId", "trace_id")
    parent = _get(raw, "parentSpanId", "parent_span_id") or ""
    name = _get(raw, "name") or ""
    if not isinstance(trace_id, str) or not isinstance(parent, str) or not isinstance(name, str):
        raise TraceFormatError(
            path, line, f"{where}: fields 'traceId', 'parentSpanId' and 'name' are strings"
        )
    start = _time(path, line, where, raw, ("startTimeUnixNano", "start_time_unix_nano", "start_time"))
    end = _time(path, line, where, raw, ("endTimeUnixNano", "end_time_unix_nano", "end_time"))
    if end < start:
        raise TraceFormatError(path, line, f"{where}: field 'endTimeUnixNano' is before its start")
    return Span(trace_id, span_id, parent, name, start, end, _attributes(path, line, where, raw), line)


def _time(path: Path, line: int | None, where: str, raw: dict[str, Any], names: tuple[str, ...]) -> int:
    value = _get(raw, *names)
    if value is None:
        raise TraceFormatError(
            path, line, f"{where}: missing field {names[0]!r} (nanoseconds since the epoch)"
        )
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                t = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise TraceFormatError(
                    path,
                    line,
                    f"{where}: field {names[0]!r}: {value!r} is neither nanoseconds nor an ISO time",
                ) from None
            return round(t.timestamp() * 1e9)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise TraceFormatError(path, line, f"{where}: field {names[0]!r}: {value!r} is not a time")
    return int(value)


def _attributes(path: Path, line: int | None, where: str, raw: dict[str, Any]) -> dict[str, Any]:
    attrs = raw.get("attributes")
    if attrs is None:
        return {}
    if isinstance(attrs, dict):
        return attrs
    if not isinstance(attrs, list):
        raise TraceFormatError(path, line, f"{where}: field 'attributes': expected a list or an object")
    out: dict[str, Any] = {}
    for a in attrs:
        if not isinstance(a, dict) or not isinstance(a.get("key"), str):
            raise TraceFormatError(path, line, f"{where}: field 'attributes': each is {{key, value}}")
        out[a["key"]] = _any_value(a.get("value"))
    return out


def _any_value(v: Any) -> Any:
    """An OTLP AnyValue as plain JSON (``intValue`` comes as a string in OTLP JSON)."""
    if not isinstance(v, dict):
        return v
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        try:
            return int(v["intValue"])
        except (TypeError, ValueError):
            return v["intValue"]
    if "arrayValue" in v and isinstance(v["arrayValue"], dict):
        values = v["arrayValue"].get("values")
        return [_any_value(x) for x in values] if isinstance(values, list) else []
    return None


def _op(s: Span) -> str:
    op = s.attrs.get("gen_ai.operation.name")
    if isinstance(op, str):
        return op
    return s.name.split(" ", 1)[0] if s.name.split(" ", 1)[0] in MODEL_OPS else ""


def _ancestors(s: Span, by_id: dict[str, Span]) -> list[Span]:
    """Parent first, up to the root (a cycle or a missing parent ends the walk)."""
    out: list[Span] = []
    seen = {s.span_id}
    cur = by_id.get(s.parent_id)
    while cur is not None and cur.span_id not in seen:
        out.append(cur)
        seen.add(cur.span_id)
        cur = by_id.get(cur.parent_id)
    return out


def _conversation_id(s: Span, by_id: dict[str, Span]) -> str:
    for x in (s, *_ancestors(s, by_id)):
        cid = x.attrs.get("gen_ai.conversation.id")
        if isinstance(cid, str | int) and not isinstance(cid, bool) and str(cid):
            return str(cid)
    return s.trace_id


def _count(path: Path, s: Span, names: tuple[str, ...]) -> int:
    value = _get(s.attrs, *names)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceFormatError(
            path, s.line, f"span {s.span_id!r}: attribute {names[0]!r}: {value!r} is not a token count"
        )
    return value


def _call(path: Path, s: Span, t0: int) -> AgentCall:
    model = s.attrs.get("gen_ai.request.model", s.attrs.get("gen_ai.response.model", ""))
    return AgentCall(
        start_s=(s.start_ns - t0) / 1e9,
        input_tokens=_count(path, s, ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")),
        output_tokens=_count(path, s, ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")),
        hash_ids=(),
        api_time_s=(s.end_ns - s.start_ns) / 1e9,
        model=model if isinstance(model, str) else "",
    )


def _graph(path: Path, cid: str, spans: list[Span], by_id: dict[str, Span]) -> Conversation | None:
    """The parent's calls (below no agent, or below the outermost agents only) and its subagents (the
    agents one level further down, their own subagents' calls folded into theirs)."""
    calls = [s for s in spans if _op(s) in MODEL_OPS]
    if not calls:
        return None
    t0 = min(s.start_ns for s in spans)
    agents = {s.span_id: [a for a in _ancestors(s, by_id) if _op(a) == "invoke_agent"][::-1] for s in calls}
    top = min(len(a) for a in agents.values())
    parent: list[AgentCall] = []
    sub_calls: dict[str, list[AgentCall]] = defaultdict(list)
    sub_span: dict[str, Span] = {}
    for s in sorted(calls, key=lambda x: x.start_ns):
        chain = agents[s.span_id]
        if len(chain) <= top:
            parent.append(_call(path, s, t0))
            continue
        agent = chain[top]  # the agent one level below the parent's
        sub_span[agent.span_id] = agent
        sub_calls[agent.span_id].append(_call(path, s, t0))
    next_id = 1
    parent, next_id = chain_hash_ids(parent, BLOCK_TOKENS, next_id)
    subagents: list[Subagent] = []
    for sid, sc in sub_calls.items():
        a = sub_span[sid]
        streams = []
        for stream in subagent_of(sid, "", 0.0, 0.0, sc).streams:
            chained, next_id = chain_hash_ids(stream, BLOCK_TOKENS, next_id)
            streams += chained
        kind = a.attrs.get("gen_ai.agent.name", a.name)
        agent_id = a.attrs.get("gen_ai.agent.id", sid)
        subagents.append(
            subagent_of(str(agent_id), str(kind), (a.start_ns - t0) / 1e9, (a.end_ns - t0) / 1e9, streams)
        )
    if not parent:
        raise TraceFormatError(path, None, f"conversation {cid!r}: only subagent calls, no parent model call")
    return Conversation(cid, BLOCK_TOKENS, parent_steps(parent, subagents))
