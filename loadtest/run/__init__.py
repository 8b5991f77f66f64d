"""One run, in three steps every command shares (`run`, `ui`, `master`, `sweep`):

``prepare`` (inputs checked, settings built: ``RunOptions`` → ``Prepared``), then ``connect`` or
``connect_host`` (the endpoint open and checked, the tokenizer settled: → ``Endpoint``), ``execute``
(the load, through loadtest/locust/runtime.py: → ``Executed``) and ``finalize`` (metrics, verdict,
run.json, report, MLPerf summary, JUnit: ``FinishedRun`` → ``Finalized``). Errors are
``loadtest.errors`` exceptions carrying their exit code (UsageError: 2, LoadtestError: 1).

Submodules import what they need; importing this package does not import Locust (which monkey-patches
the process)."""

from loadtest.run.endpoint import (
    Endpoint,
    EndpointFacts,
    connect,
    connect_host,
    open_endpoint,
    start_embedded,
)
from loadtest.run.execution import Executed, execute
from loadtest.run.inputs import Prepared, ensure_writable, parse_duration, prepare
from loadtest.run.options import EndpointOptions, MasterOptions, RunOptions, TelemetryOptions
from loadtest.run.results import EXIT_INTERRUPTED, EXIT_OK, Finalized, FinishedRun, finalize, verdict_line

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "Endpoint",
    "EndpointFacts",
    "EndpointOptions",
    "Executed",
    "Finalized",
    "FinishedRun",
    "MasterOptions",
    "Prepared",
    "RunOptions",
    "TelemetryOptions",
    "connect",
    "connect_host",
    "ensure_writable",
    "execute",
    "finalize",
    "open_endpoint",
    "parse_duration",
    "prepare",
    "start_embedded",
    "verdict_line",
]
