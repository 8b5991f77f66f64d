"""The generated-length check: total characters generated against the references' (MLPerf's gen_len)."""

from __future__ import annotations

from collections.abc import Sequence

from loadtest.accuracy.scorers.rouge import sentences


class LengthScorer:
    """``gen_len``: characters over all answers, each stripped and one sentence a line (MLPerf's
    evaluation sums ``len(prediction)`` after that step); ``gen_len_reference``: the same over the
    references; ``gen_num``: the number of answers."""

    name = "length"

    def score(self, answers: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        return {
            "gen_len": float(sum(len(sentences(a)) for a in answers)),
            "gen_len_reference": float(sum(len(sentences(r)) for r in references)),
            "gen_num": float(len(answers)),
        }
