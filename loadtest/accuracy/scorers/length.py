"""The generated-length check: total characters generated against the references' (MLPerf's gen_len)."""

from __future__ import annotations

from collections.abc import Sequence


class LengthScorer:
    """``gen_len``: characters over all answers (MLPerf's evaluation sums ``len(prediction)``);
    ``gen_len_reference``: the same over the references; ``gen_num``: the number of answers."""

    name = "length"

    def score(self, answers: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        return {
            "gen_len": float(sum(len(a) for a in answers)),
            "gen_len_reference": float(sum(len(r) for r in references)),
            "gen_num": float(len(answers)),
        }
