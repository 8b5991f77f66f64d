"""The profile's ``capture`` (request/response samples) and ``quality`` (model-free answer checks) options."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from loadtest.profile.base import Strict

MatchMode = Literal["exact", "contains", "regex"]


class CaptureSpec(Strict):
    """Which requests capture.jsonl keeps (the exact body sent, the answer received): the ``first`` N,
    or a ``sample`` fraction of them; each text cut at ``max_chars`` characters (saying so)."""

    first: int | None = Field(default=None, ge=1, le=100_000)
    sample: float | None = Field(default=None, gt=0, le=1)
    max_chars: int = Field(default=4096, ge=64, le=1_000_000)
    # a sample is bounded too: at most this many entries (per run, split over the processes)
    max_entries: int = Field(default=1000, ge=1, le=100_000)

    @model_validator(mode="after")
    def _one_rule(self) -> CaptureSpec:
        if (self.first is None) == (self.sample is None):
            raise ValueError(
                "give exactly one of first (a count, e.g. 100) or sample (a fraction, e.g. 0.01)"
            )
        return self

    @property
    def limit(self) -> int:
        """The most entries the run writes."""
        return self.first if self.first is not None else self.max_entries


class QualitySpec(Strict):
    """The per-request answer checks' settings: the length tolerance and the optional reference match
    (``exact`` or ``contains`` against the dataset's reference answer; ``regex``: ``pattern``, else the
    reference, searched in the answer)."""

    match: MatchMode | None = None
    pattern: str | None = None
    ignore_case: bool = False
    # ignore_eos requests: the output tokens within this fraction of max_tokens; else ≤ max_tokens × (1 + it)
    length_tolerance: float = Field(default=0.05, ge=0, le=1)
    # finish_reason and length count in the pass rate too (default: reported per check only)
    strict_length: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"{v!r} is not a regular expression: {e}") from None
        return v

    @model_validator(mode="after")
    def _pattern_needs_regex(self) -> QualitySpec:
        if self.pattern is not None and self.match != "regex":
            raise ValueError("pattern is a regular expression: set match: regex with it")
        return self
