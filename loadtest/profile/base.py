"""The strict base model of every profile object, and rule errors that carry their key path."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


class Strict(BaseModel):
    """Unknown keys, inf and nan are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def rule_error(reason: str, *at: str | int) -> PydanticCustomError:
    """A cross-field error; ``at`` is the key path below the object that raises it."""
    return PydanticCustomError("profile_rule", "{reason}", {"reason": reason, "at": at})


# Ceilings on what a profile (or the command line) may ask for (docs/profiles.md "Bounds"): above them a
# value is a typo or a unit slip (1e8 tokens), and building or sending it would take minutes and gigabytes.
MAX_TOKENS = 10_000_000  # any token count: a length, a prefix, a context (the longest served contexts: 10M)
MAX_TURNS = 10_000  # a session's turns, an agent's calls per turn
MAX_CONCURRENCY = 100_000  # concurrent streams (closed loop), max_in_flight
MAX_RATE = 100_000.0  # requests per second (open loop)


def check_ceiling(value: float | None, ceiling: float, what: str, *at: str | int) -> None:
    """A rule error at ``at`` when ``value`` is over ``ceiling`` (``what``: the unit, e.g. tokens)."""
    if value is not None and value > ceiling:
        raise rule_error(
            f"{value:,.10g} {what} is over the ceiling of {ceiling:,.10g}: give at most {ceiling:,.10g} "
            "(a larger value is a typo or a unit slip; docs/profiles.md, Bounds)",
            *at,
        )
