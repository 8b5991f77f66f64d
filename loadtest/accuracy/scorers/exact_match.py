"""Exact match for math and multiple-choice QA: the final answer extracted from each answer, in percent."""

from __future__ import annotations

import re
from collections.abc import Sequence

_ANSWER_LINE = re.compile(
    r"(?:final answer|answer)\s*(?:is|:)?\s*[:\s]*\(?([A-Za-z0-9.\-/+]+(?:,\d{3})*)\)?", re.IGNORECASE
)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str) -> str:
    """The final answer: the last ``\\boxed{}``, else the last "answer is / Answer: X", else the whole
    text when it is one word, else the last number in it."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    found = _ANSWER_LINE.findall(text)
    if found:
        return str(found[-1])
    if text.strip() and not any(c.isspace() for c in text.strip()):
        return text.strip()  # a bare answer (one word or expression)
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else text.strip()


def normalize(answer: str) -> str:
    """Case, spaces, ``$``, thousands commas and a trailing period left out; ``2.0`` and ``2`` equal."""
    a = answer.strip().strip("$").strip().rstrip(".").replace(" ", "").lower()
    if _NUMBER.fullmatch(a):
        try:
            value = float(a.replace(",", ""))
        except ValueError:
            return a
        return str(int(value)) if value.is_integer() else repr(value)
    return a


class ExactMatchScorer:
    """The share of answers whose extracted final answer equals the ground truth, ×100."""

    name = "exact_match"

    def score(self, answers: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        hits = sum(
            normalize(extract_answer(a)) == normalize(r) for a, r in zip(answers, references, strict=True)
        )
        return {"exact_match": round(100.0 * hits / max(len(answers), 1), 4)}
