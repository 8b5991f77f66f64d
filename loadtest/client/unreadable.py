"""An answer the client could not read: its record becomes the endpoint's ``protocol_error``, with the
bytes that caused it, and the cause is logged once per process, not once per request."""

from __future__ import annotations

import logging
import os
import traceback

from loadtest.client.record import RequestRecord
from loadtest.client.secrets import redact_echoes, snippet

log = logging.getLogger(__name__)
MAX_CAUSES_LOGGED = 20  # distinct causes logged per process; later ones are only in the records
_logged: set[str] = set()


def cause_of(exc: BaseException) -> str:
    """The exception's class and where it was raised (``module.py:line``): the same cause reads the same."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}{where}"


def mark_unreadable(
    rec: RequestRecord, exc: Exception, body: bytes | None, secrets: tuple[str, ...] = ()
) -> None:
    """Record that reading the answer raised ``exc``: ``protocol_error``, the cause and the answer's start
    (``body``; None when the answer was not kept) in ``rec.error``, one log line for a new cause."""
    cause = cause_of(exc)
    shown = f": {snippet(body)}" if body else " (no answer bytes kept)" if body is None else ": empty answer"
    rec.outcome = "protocol_error"
    rec.error = redact_echoes(f"the answer could not be read ({cause}){shown}", secrets)
    if cause in _logged or len(_logged) >= MAX_CAUSES_LOGGED:
        return
    _logged.add(cause)
    detail = redact_echoes(" ".join(str(exc).split())[:200], secrets)
    log.warning(
        "an answer could not be read (%s: %s); such requests are counted as protocol_error, the answer's "
        "start in their record's error (logged once per cause)",
        cause,
        detail,
    )
