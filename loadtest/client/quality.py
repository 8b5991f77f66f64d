"""Model-free answer checks of an ok request (empty output, finish reason, length, JSON, reference match)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from loadtest.client.openai import PreparedRequest
from loadtest.client.record import RequestRecord
from loadtest.profile.quality import QualitySpec

# Every check, in the order a record lists the ones it failed (docs/quality.md).
QUALITY_CHECKS: tuple[str, ...] = ("empty", "finish_reason", "length", "json", "match")
# The checks the gate counts by default: what makes an answer garbage whatever the server's options.
# finish_reason and length depend on the server honouring ignore_eos (a vLLM extension many endpoints
# ignore): they are counted per check always, and in the gate with quality.strict_length.
GATE_CHECKS: tuple[str, ...] = ("empty", "json", "match")
CHECKED_APIS = frozenset({"chat", "completions", "responses"})
TOOL_FINISHES = frozenset({"tool_calls", "function_call"})
_JSON_MODES = frozenset({"json_object", "json_schema", "json"})
_decoder = msgspec.json.Decoder()


def gate_checks(spec: QualitySpec) -> tuple[str, ...]:
    """The checks whose failure fails a request in the pass rate."""
    return QUALITY_CHECKS if spec.strict_length else GATE_CHECKS


def is_checked(rec: RequestRecord) -> bool:
    """Whether the checks apply: an ok answer of an API that returns text."""
    return rec.outcome == "ok" and rec.api in CHECKED_APIS


def _asked(req: PreparedRequest, extra: Mapping[str, Any], key: str) -> Any:
    return extra[key] if key in extra else req.body.get(key)


def _is_json(text: str) -> bool:
    try:
        _decoder.decode(text.encode())
    except (msgspec.DecodeError, UnicodeEncodeError):
        return False
    return True


def _mapping(value: Any) -> Mapping[str, Any] | None:
    """``value`` when it is a mapping, else None; None itself (most requests ask for no JSON mode) is
    told without an ABC's isinstance, a slow no."""
    return value if value is not None and isinstance(value, Mapping) else None


def _json_mode(req: PreparedRequest, extra: Mapping[str, Any]) -> bool:
    fmt = _mapping(_asked(req, extra, "response_format"))
    if fmt is not None:
        return fmt.get("type") in _JSON_MODES
    text = _mapping(_asked(req, extra, "text"))  # the Responses API: text.format.type
    fmt = _mapping(text.get("format")) if text is not None else None
    return fmt is not None and fmt.get("type") in _JSON_MODES


def _tool_calls_parse(text: str) -> bool:
    """The streamed tool-call text (every call's arguments, one after the other) as JSON objects."""
    rest = text.strip()
    while rest:
        end = _first_value_end(rest)
        if end is None:
            return False
        try:
            _decoder.decode(rest[:end].encode())
        except (msgspec.DecodeError, UnicodeEncodeError):
            return False
        rest = rest[end:].lstrip()
    return True


def _first_value_end(text: str) -> int | None:
    """Where the first balanced JSON object or array of ``text`` ends (strings respected); None: never."""
    if not text or text[0] not in "{[":
        return None
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _length_failed(rec: RequestRecord, ignore_eos: bool, tolerance: float) -> tuple[bool, bool]:
    """(finish reason failed, length failed)."""
    asked = rec.requested_output_tokens
    reason = rec.finish_reason
    tool = bool(rec.tool_calls_text)
    finish_ok = (
        reason in (None, "stop")
        or (reason in TOOL_FINISHES and tool)  # a tool finish carries a call
        or (reason == "length" and ignore_eos and asked is not None)
    )
    if not asked:
        return not finish_ok, False
    n = rec.output_tokens
    slack = max(1.0, tolerance * asked)
    length_ok = abs(n - asked) <= slack if ignore_eos and not tool else n <= asked + slack
    return not finish_ok, not length_ok


def _match_failed(text: str, reference: str | None, spec: QualitySpec) -> bool:
    if spec.match is None:
        return False
    if spec.match == "regex":
        pattern = spec.pattern if spec.pattern is not None else reference
        if pattern is None:
            return False
        flags = re.IGNORECASE if spec.ignore_case else 0
        try:
            return re.search(pattern, text, flags) is None
        except re.error:  # a reference that is not a regular expression: searched for as it is
            return re.search(re.escape(pattern), text, flags) is None
    if reference is None:
        return False
    a, b = (text.strip(), reference.strip())
    if spec.ignore_case:
        a, b = a.casefold(), b.casefold()
    return a != b if spec.match == "exact" else b not in a


def failed_checks(
    rec: RequestRecord, req: PreparedRequest, extra_body: Mapping[str, Any], spec: QualitySpec
) -> list[str]:
    """The checks an ok answer fails, in QUALITY_CHECKS order (empty: none failed, or not checked)."""
    if not is_checked(rec):
        return []
    failed: list[str] = []
    text, tools = rec.answer_text, rec.tool_calls_text
    reasoning = rec.reasoning_tokens_client or rec.reasoning_tokens_server
    if not text.strip() and not tools.strip() and not reasoning:
        failed.append("empty")
    ignore_eos = bool(_asked(req, extra_body, "ignore_eos"))
    bad_finish, bad_length = _length_failed(rec, ignore_eos, spec.length_tolerance)
    if bad_finish:
        failed.append("finish_reason")
    if bad_length:
        failed.append("length")
    if (tools and not _tool_calls_parse(tools)) or (
        not tools and _json_mode(req, extra_body) and not _is_json(text)
    ):
        failed.append("json")
    if _match_failed(text, req.reference, spec):
        failed.append("match")
    return failed
