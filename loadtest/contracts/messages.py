"""The master/worker messages of a distributed run: one Struct each, and the plain dict Locust carries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import msgspec


class MessageError(ValueError):
    """A master/worker message with a field missing or of the wrong type; the text names the message."""


class WireMessage(msgspec.Struct):
    """A message between the master and a worker; ``TYPE`` is its Locust message type."""

    TYPE: ClassVar[str]


class Hello(WireMessage):
    """Worker → master, once its handlers are in place: send me the settings."""

    TYPE = "loadtest_hello"


class Standby(WireMessage):
    """Master → worker, in reply to Hello from a `loadtest ui` master: no run yet. Each start in the UI
    sends Settings; after each Final the worker waits for the next start instead of leaving."""

    TYPE = "loadtest_standby"


class Settings(WireMessage):
    """Master → worker, in reply to Hello (a `loadtest ui` master: at each start): what the worker needs to
    run (never the API key)."""

    TYPE = "loadtest_settings"
    index: int  # the worker's index
    settings: str  # RunSettings.to_json()
    profile: str  # the profile's content as JSON (a trace path made absolute)
    profile_name: str  # its file name's stem
    fingerprint: str  # the master's workload fingerprint, checked by the worker


class Ready(WireMessage):
    """Worker → master: set up (``error`` None) or not (``error`` says why, in one line)."""

    TYPE = "loadtest_ready"
    index: int
    host: str
    pid: int
    error: str | None = None
    records: str | None = None  # the worker's own copy of its records (a path on its host), if any


class Issued(WireMessage):
    """Worker → master: this worker has issued its share of --max-requests; the run ends when all have."""

    TYPE = "loadtest_issued"
    index: int


class Finish(WireMessage):
    """Master → worker: the run is over; drain (at most ``timeout`` s) or not, then send Final."""

    TYPE = "loadtest_finish"
    drain: bool
    timeout: float


class Final(WireMessage):
    """Worker → master: the last histogram delta and record lines; ``left`` says why when it left early."""

    TYPE = "loadtest_final"
    index: int
    delta: dict[str, Any]  # Recorder.take_delta() (RunAggregates.merge_wire's input)
    lines: bytes  # zlib-compressed record-log lines (b"" when none)
    count: int  # record lines the worker wrote in all
    left: str | None = None


class Failing(WireMessage):
    """Worker → master: the endpoint fails wholesale here (RunContext.failing); stop the run early."""

    TYPE = "loadtest_failing"
    index: int
    info: dict[str, Any]


class InFlight(msgspec.Struct, array_like=True):
    """A request a worker has in flight at a report: what the master records for it (outcome
    ``cancelled``, the worker lost) should the worker disappear before it finishes."""

    id: str  # the request's record id
    scenario: str
    api: str
    t: float  # the scheduled epoch (s), as the record line's ``t``
    sent_us: int | None = None  # µs after ``t`` when it was sent (None: not yet)


_REPORT_INDEX = "loadtest_index"  # the key that says a worker report carries a Report


class Report(WireMessage):
    """Worker → master, added to each of Locust's worker reports (every 3 s): the histogram delta and the
    record lines finished since the last report, taken together. The keys are prefixed so that they
    never meet Locust's own."""

    TYPE = "loadtest report"  # not a message of its own: the keys ride in Locust's report
    index: int = msgspec.field(name=_REPORT_INDEX)
    delta: dict[str, Any] = msgspec.field(name="loadtest")
    lines: bytes = msgspec.field(name="loadtest_lines")
    in_flight: int = msgspec.field(default=0, name="loadtest_in_flight")  # requests in flight at the report
    # Those requests, one each (an older worker sends none): the master records them if the worker is lost.
    pending: list[InFlight] = msgspec.field(default_factory=list, name="loadtest_pending")


M = TypeVar("M", bound=WireMessage)


def to_data(msg: WireMessage) -> dict[str, Any]:
    """The plain dict Locust's ``send_message`` carries (msgpack: bytes stay bytes)."""
    data: dict[str, Any] = msgspec.to_builtins(msg, builtin_types=(bytes,))
    return data


def from_data(kind: type[M], data: Mapping[str, Any] | None) -> M:
    """The typed message from the dict Locust delivered; MessageError naming the message when a field
    is missing or wrongly typed (unknown keys are ignored: Locust's own, or a newer version's)."""
    try:
        return msgspec.convert({} if data is None else data, kind)
    except msgspec.ValidationError as e:
        raise MessageError(f"{kind.TYPE} message ({kind.__name__}): {e}") from None


def report_from(data: Mapping[str, Any]) -> Report | None:
    """The Report inside one of Locust's worker reports; None when the worker has not set up a run yet."""
    return from_data(Report, data) if _REPORT_INDEX in data else None
