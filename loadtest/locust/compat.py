"""The one place that reaches into Locust's internals, with the range of Locust versions it was tested on."""

from __future__ import annotations

import warnings
from typing import Any

import gevent
import locust
from locust.exception import StopUser
from locust.user.users import LOCUST_STATE_RUNNING, LOCUST_STATE_STOPPING, LOCUST_STATE_WAITING

# pyproject.toml bounds Locust to this range; an install that bypassed it is told at start.
TESTED_LOCUST = ((2, 40), (2, 47))


def locust_version() -> tuple[int, int]:
    """Locust's (major, minor)."""
    major, minor = (int(p) for p in locust.__version__.split(".")[:2])
    return major, minor


def check_locust_version() -> str:
    """A warning (also returned) when the installed Locust is outside the tested range; "" when inside."""
    v = locust_version()
    low, high = TESTED_LOCUST
    if low <= v <= high:
        return ""
    text = (
        f"Locust {locust.__version__} is outside the range this loadtest was tested with "
        f"({low[0]}.{low[1]} to {high[0]}.{high[1]}): the distributed mode uses its worker dispatcher"
    )
    warnings.warn(text, RuntimeWarning, stacklevel=2)
    return text


def users_dispatcher(runner: Any) -> Any:
    """The master runner's users dispatcher (Locust's ``MasterRunner._users_dispatcher``), or None."""
    return getattr(runner, "_users_dispatcher", None)


def zero_wait(user: Any) -> None:
    """Locust's ``User.wait()`` for a zero ``wait_time`` (``TaskSet.wait``): a stop asked while the user
    ran or waited raises ``StopUser``, and while it waits a stop kills it at once. One turn of the event
    loop, without the task set's layers (about a tenth of a short request's CPU)."""
    if user._state == LOCUST_STATE_STOPPING:
        raise StopUser()
    user._state = LOCUST_STATE_WAITING
    gevent.sleep(0)
    if user._state == LOCUST_STATE_STOPPING:
        raise StopUser()
    user._state = LOCUST_STATE_RUNNING
