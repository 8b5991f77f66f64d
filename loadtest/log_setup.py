"""The processes' logging: one format, warnings and up, and Locust's lines about users that had already ended
and about spawn rates left out."""

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


class _SpawnRate(logging.Filter):
    """Locust warns of a spawn rate over 100 a second; the closed loop's ramp (locust/ramp.py) starts each
    batch in one dispatch on purpose and sets its own pace."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "spawn rate is very high" not in str(record.msg)


def configure_logging() -> None:
    """Warnings and up, in one format, for every process the tool starts."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT)
    logging.getLogger("locust.runners").addFilter(_EndedUsers())
    logging.getLogger("locust.runners").addFilter(_SpawnRate())
