"""Token counts a server's usage report carries, decoded: a count below zero reads as not reported."""

from __future__ import annotations

import msgspec
from msgspec.structs import astuple


class UsageCounts(msgspec.Struct, gc=False):
    """Base of the usage structs the API readers decode: every integer field that a server sent below
    zero is set to None after decoding (as ``adapters.base.count_at`` reads an object's), so no figure
    ever takes a negative count for a real one."""

    def __post_init__(self) -> None:
        for value in astuple(self):  # one C call for all the values: most reports have no negative count
            if type(value) is int and value < 0:
                for name in self.__struct_fields__:
                    field = getattr(self, name)
                    if type(field) is int and field < 0:
                        setattr(self, name, None)
                return
