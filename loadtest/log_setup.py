"""The processes' logging: one format, warnings and up, and Locust's lines about users that had already ended left out."""

from __future__ import annotations

import logging

FORMAT = "%(levelname)s %(name)s: %(message)s"


class _EndedUsers(logging.Filter):
    """Locust logs an ERROR for each user greenlet it finds dead while stopping users ("didn't have proper
    args": gevent cleared the arguments of a greenlet that had ended, as Locust's own comment in
    runners.py says); a stop of thousands of users that had just finished printed a thousand of them.
    Nothing is lost: those users had ended."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "didn't have proper args" not in str(record.msg)


def configure_logging() -> None:
    """Warnings and up, in one format, for every process the tool starts."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT)
    logging.getLogger("locust.runners").addFilter(_EndedUsers())
