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
