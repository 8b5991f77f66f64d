"""Traffic profile schema (pydantic v2): who sends what, how often, validated with clear errors."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Fixed(_Strict):
    dist: Literal["fixed"]
    value: int = Field(ge=0)


class Uniform(_Strict):
    dist: Literal["uniform"]
    min: int = Field(ge=0)
    max: int = Field(ge=0)

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        if self.max < self.min:
            raise ValueError("max must be ≥ min")
        return self


class Normal(_Strict):
    dist: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: int = Field(default=1, ge=0)
    max: int | None = Field(default=None, ge=1)


class LogNormal(_Strict):
    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0, le=5)
    min: int = Field(default=1, ge=0)
    max: int | None = Field(default=None, ge=1)


Length = Annotated[Fixed | Uniform | Normal | LogNormal, Field(discriminator="dist")]


class Load(_Strict):
    """Closed loop (``concurrency``) or open loop (``rate`` requests/s, Poisson arrivals)."""

    concurrency: int | None = Field(default=None, ge=1)
    rate: float | None = Field(default=None, gt=0)
    arrival: Literal["poisson", "constant"] = "poisson"

    @model_validator(mode="after")
    def _one_mode(self) -> Load:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
        return self


class EngineSpec(_Strict):
    """The embedded engine's preset when the run has no --host (names as in `loadtest serve sim --help`)."""

    gpu: str = "H100"
    model: str = "llama-3.1-8b"
    tp: int = Field(default=1, ge=1)
    faults: str | None = None  # fault-injection spec, e.g. "http_503=2%,stall_mid_stream=#3@2" (docs/engine.md)


class Profile(_Strict):
    """One traffic profile (docs/profiles.md documents every field)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    api: Literal["chat", "completions"] = "chat"
    stream: bool = True
    tokenizer: str = "llama3"
    model: str | None = None
    system_prompt_tokens: int = Field(default=0, ge=0)
    input_tokens: Length
    output_tokens: Length
    ignore_eos: bool = True
    load: Load = Field(default_factory=lambda: Load(concurrency=8))
    duration_s: float = Field(default=30.0, gt=0)
    seed: int = 0
    engine: EngineSpec = Field(default_factory=EngineSpec)
