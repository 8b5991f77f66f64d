"""The processes' logging: Locust's line for each user that had already ended when a stop came is left out,
every other line of Locust's kept."""

from __future__ import annotations

import logging

import pytest

from loadtest.log_setup import configure_logging


def test_lines_about_ended_users_are_left_out(caplog: pytest.LogCaptureFixture) -> None:
    configure_logging()
    runners = logging.getLogger("locust.runners")
    with caplog.at_level(logging.WARNING):
        for _ in range(1000):  # a stop of a thousand users that had just finished
            runners.error(
                "While stopping users, we encountered a user that didn't have proper args %s", "<g>"
            )
        runners.error("Unknown message type %s from worker %s", "x", "w-1")
    assert [r.getMessage() for r in caplog.records] == ["Unknown message type x from worker w-1"]
