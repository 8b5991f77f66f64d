"""run.json ``metrics.connections``: how the run's requests reached the server, from the record log: the
connections opened and reused, each opening's name resolution, TCP connect, proxy tunnel and TLS handshake,
and every request's time to its response headers (docs/metrics.md, "Connections")."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from loadtest.contracts.record_line import RecordLine
from loadtest.metrics.hdr import loadgen_index
from loadtest.run.providers import Contribution, Provider

PHASES = ("dns", "connect", "tunnel", "tls")  # the order of a record line's ``new_connection``


def _figures(values: array) -> dict[str, float | None]:
    """p50, p99 and max in ms (the project's rule: the sorted sample at ⌊n·p⌋), None without values."""
    s = sorted(values)
    if not s:
        return {"p50": None, "p99": None, "max": None}
    return {
        k: round(s[loadgen_index(len(s), p)] / 1000, 3) for k, p in (("p50", 50), ("p99", 99), ("max", 100))
    }


class ConnectionsProvider(Provider):
    """``metrics.connections``: requests sent on a new connection and on a kept-alive one, the opening's
    phases (ms) and the time from the send to the response headers (ms, every request that got them)."""

    def __init__(self) -> None:
        self._sent = self._opened = 0
        self._phases = {p: array("d") for p in PHASES}
        self._headers = array("d")

    def add(self, lines: Sequence[RecordLine]) -> None:
        for ln in lines:
            if ln.sent_us is None:
                continue
            self._sent += 1
            opened = ln.opened
            if opened is not None:
                self._opened += 1
                for phase, us in zip(PHASES, opened, strict=False):
                    if us or phase in ("dns", "connect"):  # a tunnel or a handshake only where there was one
                        self._phases[phase].append(us)
            if ln.headers_us is not None:
                self._headers.append(ln.headers_us - ln.sent_us)

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        if not self._sent:
            return Contribution()
        section: dict[str, Any] = {
            "requests": self._sent,
            "opened": self._opened,
            "reused": self._sent - self._opened,
        }
        section.update({f"{p}_ms": _figures(v) for p, v in self._phases.items()})
        section["headers_ms"] = _figures(self._headers)
        return Contribution(metrics={"connections": section})
