"""A scenario's prompt dataset: the file, its format and columns, filters, sampling and output lengths."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_serializer, model_validator

from loadtest.profile.base import MAX_TOKENS, Strict, rule_error
from loadtest.profile.dists import Dist, EmpiricalLength, Fixed, LogNormal, Normal, Uniform

DatasetFormat = Literal["auto", "sharegpt", "openai_chat", "prompts", "hf_disk"]
# What a source column can stand for (``columns`` maps the source's names onto these).
DatasetField = Literal["prompt", "output_tokens", "reference", "conversations", "messages"]


class OutputFrom(Strict):
    """``max_tokens`` from the dataset: its output_tokens column (``dataset``) or the reference's length."""

    dist: Literal["dataset", "reference"]

    @model_serializer
    def _as_word(self) -> str:
        return self.dist  # written as the profile gives it: output_tokens: reference


def _output_rule(v: Any) -> Any:
    """``dataset`` / ``reference`` (a word) or a length spec (a mapping)."""
    if isinstance(v, str):
        if v not in ("dataset", "reference"):
            raise ValueError(
                f"use dataset, reference or a length spec such as {{dist: fixed, value: 256}} (got {v!r})"
            )
        return {"dist": v}
    return v


OutputRule = Annotated[
    Fixed | Uniform | Normal | LogNormal | EmpiricalLength | OutputFrom,
    Field(discriminator="dist"),
    BeforeValidator(_output_rule),
]


class DatasetSpec(Strict):
    """Real prompts from a file: ShareGPT JSON, OpenAI-chat JSONL, a prompts table, or a saved HF dataset.

    ``output_tokens``: ``dataset`` (the source's output_tokens column), ``reference`` (the reference
    answer's token count), a length spec, or unset: the column when the source has one, else the
    reference answer's length (docs/datasets.md).
    """

    path: str = Field(min_length=1)  # relative to the profile's folder, like a trace
    format: DatasetFormat = "auto"
    columns: dict[str, DatasetField] = Field(default_factory=dict)  # source column -> field
    min_input_tokens: int | None = Field(default=None, ge=1)
    max_input_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    sample: int | None = Field(default=None, ge=1)  # drawn with the seed; default all, cycled
    # how unit i picks its conversation: in order, cycling (each pass a full pass), or drawn with replacement
    sampling: Literal["cycle", "with_replacement"] = "cycle"
    passes: int | None = Field(default=None, ge=1)  # issue this many whole passes over the dataset, then end
    output_tokens: OutputRule | None = None
    think_time_s: Dist | None = None  # between the turns of a multi-turn conversation

    @field_validator("columns")
    @classmethod
    def _one_source_each(cls, v: dict[str, DatasetField]) -> dict[str, DatasetField]:
        taken = [f for f in set(v.values()) if list(v.values()).count(f) > 1]
        if taken:
            raise ValueError(
                f"two source columns map to {', '.join(sorted(taken))}: map one column to each field"
            )
        return v

    @model_validator(mode="after")
    def _range(self) -> DatasetSpec:
        lo, hi = self.min_input_tokens, self.max_input_tokens
        if lo is not None and hi is not None and hi < lo:
            raise rule_error(f"max_input_tokens ({hi}) must be ≥ min_input_tokens ({lo})", "max_input_tokens")
        return self
