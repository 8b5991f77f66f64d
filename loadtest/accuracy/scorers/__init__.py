"""The scorers, registered once by name: ROUGE, exact match, generated length, MLPerf agentic inline."""

from __future__ import annotations

from loadtest.accuracy.scorers.agentic import AgenticInlineScorer
from loadtest.accuracy.scorers.base import Scorer
from loadtest.accuracy.scorers.exact_match import ExactMatchScorer
from loadtest.accuracy.scorers.length import LengthScorer
from loadtest.accuracy.scorers.rouge import RougeScorer

SCORERS: dict[str, Scorer] = {}


def register(scorer: Scorer) -> None:
    """Add ``scorer`` under its name (a name is registered once)."""
    if scorer.name in SCORERS:
        raise ValueError(f"scorer {scorer.name!r} registered twice")
    SCORERS[scorer.name] = scorer


def scorer_for(name: str) -> Scorer:
    return SCORERS[name]


for _s in (RougeScorer(), ExactMatchScorer(), LengthScorer(), AgenticInlineScorer()):
    register(_s)

__all__ = ["SCORERS", "Scorer", "register", "scorer_for"]
