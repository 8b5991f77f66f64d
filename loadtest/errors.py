"""The errors that end a command, each with the exit code it carries (docs/ci.md)."""

from __future__ import annotations

EXIT_COULD_NOT_RUN = 1
EXIT_USAGE = 2
# A run file could not be written (a full disk, an I/O error): the run stopped, what it could not write
# is counted in run.json (or, when run.json itself could not be written, on the console); docs/durability.md.
EXIT_WRITE_FAILED = 3
# An accuracy run (`loadtest accuracy`) whose scores missed a benchmark target (docs/accuracy.md).
EXIT_ACCURACY_FAILED = 14
# A run a signal ended (128 + the signal's number, as a shell reports a process it killed).
EXIT_INTERRUPTED = {"SIGINT": 130, "SIGTERM": 143}


class LoadtestError(Exception):
    """A command cannot go on: one line for the user, and the exit code."""

    exit_code = EXIT_COULD_NOT_RUN


class UsageError(LoadtestError):
    """Bad input (an option, a profile field, a file): one line that names it and the fix."""

    exit_code = EXIT_USAGE
