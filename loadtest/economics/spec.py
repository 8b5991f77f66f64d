"""The endpoint description of a run: hardware (GPU kind and count) and price, from options or a YAML file."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class EndpointSpecError(ValueError):
    """A bad endpoint description: one line naming the option or file field and the fix."""


class Hardware(BaseModel):
    """What serves the endpoint: GPU kind and count over every replica (None = unknown)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    gpu_kind: str = "unknown"
    gpu_count: int | None = Field(default=None, ge=1)


class Price(BaseModel):
    """Either a price per GPU-hour, or prices per million input and output tokens (USD unless told)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    per_gpu_hour: float | None = Field(default=None, gt=0)
    per_m_input: float | None = Field(default=None, ge=0)
    per_m_output: float | None = Field(default=None, ge=0)
    currency: str = Field(default="USD", min_length=1, max_length=8)

    @model_validator(mode="after")
    def _one_kind(self) -> Price:
        per_token = self.per_m_input is not None or self.per_m_output is not None
        if self.per_gpu_hour is not None and per_token:
            raise ValueError("give per_gpu_hour or per_m_input/per_m_output, not both")
        if per_token and (self.per_m_input is None or self.per_m_output is None):
            raise ValueError("a per-token price needs both per_m_input and per_m_output")
        return self

    @property
    def kind(self) -> str:
        return "gpu_hour" if self.per_gpu_hour is not None else "per_token"


class EndpointSpec(BaseModel):
    """The file form (``--endpoint-file``): ``hardware: {gpu_kind, gpu_count}`` and ``price: {...}``;
    ``system``: MLPerf Endpoints system-description fields (``system_name``, ``submitter_org_names``,
    ``node_types`` ...), written as given into a submission's ``system_desc.json``; ``system_power`` its
    ``system_power.json``, ``submission`` its points' own declarations (model_name, target_cohort ...;
    docs/sweep.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str | None = None
    hardware: Hardware = Field(default_factory=Hardware)
    price: Price | None = None
    system: dict[str, Any] | None = None
    system_power: dict[str, Any] | None = None  # a submission's system_power.json (docs/sweep.md)
    submission: dict[str, Any] | None = None  # a submission's point.yaml declarations (docs/sweep.md)

    @model_validator(mode="after")
    def _gpu_price_needs_count(self) -> EndpointSpec:
        if self.price is not None and self.price.per_gpu_hour is not None and self.hardware.gpu_count is None:
            raise ValueError("a price per GPU-hour needs hardware.gpu_count (--gpu-count)")
        return self


def _first_error(e: ValidationError, where: str) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}{': ' + loc if loc else ''}: {msg}"


def load_endpoint_file(path: str | Path) -> EndpointSpec:
    """Read and validate an endpoint YAML; EndpointSpecError names the file and field."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise EndpointSpecError(f"--endpoint-file {p}: cannot read it ({e.strerror or e})") from e
    except yaml.YAMLError as e:
        raise EndpointSpecError(f"--endpoint-file {p}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise EndpointSpecError(f"--endpoint-file {p}: expected a mapping with hardware: and price:")
    try:
        return EndpointSpec.model_validate(data)
    except ValidationError as e:
        raise EndpointSpecError(_first_error(e, f"--endpoint-file {p}")) from e


OPTION_FIELDS = {
    "gpu_kind": ("hardware", "gpu_kind"),
    "gpu_count": ("hardware", "gpu_count"),
    "price_gpu_hour": ("price", "per_gpu_hour"),
    "price_in_per_m": ("price", "per_m_input"),
    "price_out_per_m": ("price", "per_m_output"),
    "currency": ("price", "currency"),
}


def spec_from_options(
    options: Mapping[str, Any],
    endpoint_file: str | None = None,
    default_hardware: dict[str, Any] | None = None,
) -> EndpointSpec | None:
    """The run's endpoint description: ``endpoint_file``, overridden by the single options (OPTION_FIELDS
    names, None = not given); None when nothing was given and nothing is known. ``default_hardware`` (the
    embedded engine's GPUs) fills gaps."""
    path = endpoint_file
    data: dict[str, Any] = load_endpoint_file(path).model_dump(exclude_none=True) if path else {}
    for opt, (section, key) in OPTION_FIELDS.items():
        value = options.get(opt)
        if value is not None:
            data.setdefault(section, {})[key] = value
    if default_hardware:
        hw = data.setdefault("hardware", {})
        if hw.get("gpu_kind", "unknown") == "unknown" and hw.get("gpu_count") is None:
            hw.update(default_hardware)
    if not data:
        return None
    if "price" in data and set(data["price"]) <= {"currency"}:
        del data["price"]
    try:
        return EndpointSpec.model_validate(data)
    except ValidationError as e:
        where = f"--endpoint-file {path} with the command line's options" if path else "endpoint options"
        raise EndpointSpecError(
            _first_error(e, where).replace("per_gpu_hour", "per_gpu_hour (--price-gpu-hour)")
        ) from e
