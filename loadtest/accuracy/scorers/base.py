"""The scorer protocol: answers and their references in, named scores out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Scorer(Protocol):
    """Scores a run's answers against the references, sample by sample in the same order."""

    name: str

    def score(self, answers: Sequence[str], references: Sequence[str]) -> dict[str, float]: ...
