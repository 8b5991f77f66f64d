"""One reader of MLPerf LoadGen's ``mlperf_log_summary.txt`` for the tests: LoadGen's own files and ours."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

RULE = "=" * 48


@dataclass
class LoadGenSummary:
    """The sections LoadGen writes, as a parser written for LoadGen's file reads them; ``rest``: the
    lines after LoadGen's last one (the errors line)."""

    results: dict[str, str] = field(default_factory=dict)
    recommendations: list[str] = field(default_factory=list)
    early_stopping: dict[str, list[str]] = field(default_factory=dict)
    stats: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    warnings: str = ""
    errors: str = ""
    rest: list[str] = field(default_factory=list)


def _kv(line: str) -> tuple[str, str]:
    key, sep, value = line.partition(":")
    if not sep:
        raise ValueError(f"not a 'key : value' line: {line!r}")
    return key.strip(), value.strip()


def _section(lines: list[str], at: int, title: str) -> int:
    """The index after a titled section's header (RULE, title, RULE) starting at ``at``."""
    if lines[at : at + 3] != [RULE, title, RULE]:
        raise ValueError(f"expected the {title!r} header at line {at + 1}, got {lines[at : at + 3]!r}")
    return at + 3


def parse_summary(text: str) -> LoadGenSummary:
    """Read a LoadGen summary; raises ValueError on any line LoadGen's layout has no place for."""
    lines = text.split("\n")
    out = LoadGenSummary()
    i = _section(lines, 0, "MLPerf Results Summary")
    block: list[str] | None = None
    while not (lines[i] == "" and lines[i + 1] == RULE):
        line = lines[i]
        if line == "Recommendations:":
            block = out.recommendations
        elif line.endswith("Early Stopping Result:"):
            block = out.early_stopping.setdefault(line.removesuffix(" Early Stopping Result:"), [])
        elif block is not None and (line.startswith(" ") or line == ""):
            block.append(line)
        else:
            block = None
            key, value = _kv(line)
            out.results[key] = value
        i += 1
    i = _section(lines, i + 1, "Additional Stats")
    while lines[i] != RULE:
        if lines[i]:
            key, value = _kv(lines[i])
            out.stats[key] = value
        i += 1
    i = _section(lines, i, "Test Parameters Used")
    while lines[i]:
        key, value = _kv(lines[i])
        out.params[key] = value
        i += 1
    out.warnings, blank, out.errors = lines[i + 1], lines[i + 2], lines[i + 3]
    if blank or "warning" not in out.warnings or "ERROR" not in out.errors.upper():
        raise ValueError(f"expected the warnings and errors lines, got {lines[i + 1 : i + 4]!r}")
    out.rest = lines[i + 4 :]
    return out


MLLOG = ":::MLLOG"
OWN_DETAIL_KEYS = {"loadtest_version", "warning_generic_message"}


def read_detail(text: str) -> list[dict[str, Any]]:
    """A LoadGen detail log's messages, read as MLCommons' submission log parser reads them (the marker
    on the first line, every marked line strict JSON)."""
    lines = text.rstrip("\n").split("\n")
    if not lines[0].startswith(MLLOG):
        raise ValueError(f"marker not found in the first line: {lines[0]!r}")
    return [json.loads(ln[len(MLLOG) :]) for ln in lines if ln.startswith(MLLOG)]


def _kind(v: object) -> str:
    return "bool" if isinstance(v, bool) else "number" if isinstance(v, int | float) else type(v).__name__


def result_keys(messages: list[dict[str, Any]]) -> list[str]:
    """The keys of LoadGen's results block (from ``result_validity`` on), its conditional ones left out."""
    keys = [m["key"] for m in messages]
    return [
        k
        for k in keys[keys.index("result_validity") :]
        if k not in ("result_invalid_reason", "error_runtime")
    ]


def compare_details(ours: list[dict[str, Any]], real: list[dict[str, Any]]) -> None:
    """Our detail log against LoadGen's for the same scenario: LoadGen's message shape, only LoadGen's keys
    (besides our own), its results block in its order, each shared key's value of the same kind."""
    for m in ours:
        assert set(m) == set(real[0]) and set(m["metadata"]) == set(real[0]["metadata"]), m
    theirs = {m["key"]: m["value"] for m in real}
    mine = {m["key"]: m["value"] for m in ours}
    assert set(mine) - OWN_DETAIL_KEYS <= set(theirs) | {"error_runtime", "result_invalid_reason"}
    assert result_keys(ours) == result_keys(real)
    for key in set(mine) & set(theirs):
        assert _kind(mine[key]) == _kind(theirs[key]), (key, mine[key], theirs[key])
