"""ROUGE-1/2/L/Lsum F-measures in percent with Google's rouge-score, as MLPerf's CNN/DailyMail evaluation."""

from __future__ import annotations

import re
from collections.abc import Sequence

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
# Sentence ends for rougeLsum (its summary-level LCS splits on newlines). MLPerf's evaluation splits
# with nltk's punkt model, which is a download; this split on ., ! or ? then space is the offline stand-in.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> str:
    """``text`` one sentence a line (what rougeLsum expects)."""
    return "\n".join(s for s in _SENTENCE_END.split(text.strip()) if s)


class RougeScorer:
    """Mean per-sample F-measure ×100, stemmed (``use_stemmer=True``), rounded to 4 places."""

    name = "rouge"

    def score(self, answers: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
        totals = dict.fromkeys(ROUGE_TYPES, 0.0)
        for answer, reference in zip(answers, references, strict=True):
            scores = scorer.score(sentences(reference), sentences(answer))
            for k in ROUGE_TYPES:
                totals[k] += scores[k].fmeasure
        n = max(len(answers), 1)
        return {k: round(100.0 * v / n, 4) for k, v in totals.items()}
