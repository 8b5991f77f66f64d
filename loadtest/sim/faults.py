"""Fault injection: a per-run spec (``--faults``) and a per-request header pick a failure to serve.

Spec grammar (comma-separated rules, first matching rule wins)::

    SPEC  := RULE ("," RULE)*
    RULE  := KIND "=" VALUE ["@" PARAM]
    VALUE := FLOAT (probability, e.g. 0.05) | FLOAT "%" (e.g. 5%) | "#" INT (exactly the next INT requests)

Header ``X-Loadtest-Fault: KIND[:PARAM]`` (or ``none``) overrides the spec for one request.
Probabilities use a seeded RNG drawn once per rule per request in arrival order, so the same seed
faults the same request indices whatever the header overrides.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULT_HEADER = "X-Loadtest-Fault"

# Answered without the engine.
HTTP_500 = "http_500"
HTTP_503 = "http_503"
HTTP_429 = "http_429"
RESET_BEFORE_HEADERS = "reset_before_headers"
# Served through the engine.
DISCONNECT_MID_STREAM = "disconnect_mid_stream"
STALL_MID_STREAM = "stall_mid_stream"
MALFORMED_CHUNK = "malformed_chunk"
ERROR_FRAME = "error_frame"
NO_DONE = "no_done"
SLOW_HEADERS = "slow_headers"
NO_USAGE = "no_usage"

PRE_ENGINE = frozenset({HTTP_500, HTTP_503, HTTP_429, RESET_BEFORE_HEADERS})
MID_STREAM = frozenset({DISCONNECT_MID_STREAM, STALL_MID_STREAM, MALFORMED_CHUNK, ERROR_FRAME})
FAULT_KINDS: tuple[str, ...] = (
    HTTP_500,
    HTTP_503,
    HTTP_429,
    RESET_BEFORE_HEADERS,
    DISCONNECT_MID_STREAM,
    STALL_MID_STREAM,
    MALFORMED_CHUNK,
    ERROR_FRAME,
    NO_DONE,
    SLOW_HEADERS,
    NO_USAGE,
)
DEFAULT_PARAM: dict[str, float] = {HTTP_429: 1.0, STALL_MID_STREAM: 5.0, SLOW_HEADERS: 2.0}


class FaultSpecError(ValueError):
    """A malformed fault spec or header."""


@dataclass(frozen=True)
class Fault:
    """One injected fault: its kind and optional numeric parameter."""

    kind: str
    param: float | None = None

    def value(self) -> float | None:
        """The parameter, or the kind's default (None where the kind has none)."""
        return self.param if self.param is not None else DEFAULT_PARAM.get(self.kind)

    def at_token(self, target: int) -> int:
        """Tokens delivered before a mid-stream fault fires: the parameter, else half the output."""
        n = int(self.param) if self.kind == DISCONNECT_MID_STREAM and self.param is not None else target // 2
        return max(0, min(n, target))


@dataclass
class FaultRule:
    """One rule of a spec: a probability or an exact count of the next requests."""

    kind: str
    probability: float = 0.0
    remaining: int = 0
    param: float | None = None
    counted: bool = False


def _kind(name: str) -> str:
    kind = name.strip().lower()
    if kind not in FAULT_KINDS:
        raise FaultSpecError(f"unknown fault kind {name!r}; choose one of {', '.join(FAULT_KINDS)}")
    return kind


def _param(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise FaultSpecError(f"bad fault parameter {text!r} in {where!r}") from None
    if v < 0:
        raise FaultSpecError(f"fault parameter must be >= 0 in {where!r}")
    return v


def parse_rule(text: str) -> FaultRule:
    """``kind=VALUE[@param]`` as a rule."""
    name, eq, rest = text.partition("=")
    if not eq:
        raise FaultSpecError(f"fault rule {text!r} needs kind=VALUE")
    value, at, param = rest.strip().partition("@")
    rule = FaultRule(_kind(name), param=_param(param, text) if at else None)
    try:
        if value.startswith("#"):
            rule.remaining, rule.counted = int(value[1:]), True
        elif value.endswith("%"):
            rule.probability = float(value[:-1]) / 100.0
        else:
            rule.probability = float(value)
    except ValueError:
        raise FaultSpecError(f"bad fault value {value!r} in {text!r}") from None
    if rule.remaining < 0 or not 0.0 <= rule.probability <= 1.0:
        raise FaultSpecError(f"fault value out of range in {text!r}")
    return rule


def parse_spec(spec: str | None) -> list[FaultRule]:
    """A comma-separated spec as rules (empty for None or "")."""
    return [parse_rule(part) for part in (spec or "").split(",") if part.strip()]


def parse_header(value: str) -> Fault | None:
    """``kind[:param]`` or ``none`` from the per-request header."""
    name, colon, param = value.strip().partition(":")
    if name.strip().lower() in ("", "none"):
        return None
    return Fault(_kind(name), _param(param, value) if colon else None)


class FaultPlan:
    """Decides each request's fault in arrival order: header first, else the seeded run spec."""

    def __init__(self, spec: str | None = None, seed: int = 0) -> None:
        self.rules = parse_spec(spec)
        self._rng = random.Random(f"loadtest-faults-{seed}")
        self.arrivals = 0

    def pick(self, header: str | None = None) -> Fault | None:
        """The fault for the next request; raises FaultSpecError on a malformed header."""
        self.arrivals += 1
        forced = parse_header(header) if header is not None else None
        chosen: Fault | None = None
        for rule in self.rules:
            if rule.counted:  # exactly the next N requests the header does not decide
                hit = header is None and chosen is None and rule.remaining > 0
                rule.remaining -= hit
            else:
                hit = self._rng.random() < rule.probability  # drawn always: indices stay seeded
            if hit and chosen is None:
                chosen = Fault(rule.kind, rule.param)
        return forced if header is not None else chosen
