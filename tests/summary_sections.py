"""What tests measured, printed as sections at the end of the pytest run (so it lands in the CI log)."""

from __future__ import annotations

SECTIONS: dict[str, list[str]] = {}


def add_lines(title: str, lines: list[str]) -> None:
    """Append ``lines`` to the end-of-run section ``title``."""
    SECTIONS.setdefault(title, []).extend(lines)
