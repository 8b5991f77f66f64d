"""The errors that end a command, each with the exit code it carries (docs/ci.md)."""

from __future__ import annotations

EXIT_COULD_NOT_RUN = 1
EXIT_USAGE = 2


class LoadtestError(Exception):
    """A command cannot go on: one line for the user, and the exit code."""

    exit_code = EXIT_COULD_NOT_RUN


class UsageError(LoadtestError):
    """Bad input (an option, a profile field, a file): one line that names it and the fix."""

    exit_code = EXIT_USAGE
