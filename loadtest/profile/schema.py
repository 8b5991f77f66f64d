"""Traffic profile schema (pydantic v2): who sends what, how often, and the SLOs expected."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StringConstraints, field_validator, model_validator

from loadtest.profile.base import NAME_PATTERN, Strict, rule_error
from loadtest.profile.client import ClientSpec, RetrySpec
from loadtest.profile.dataset import DatasetSpec
from loadtest.profile.dists import (
    DIST_TAGS,
    Dist,
    Empirical,
    Fixed,
    FixedDist,
    Length,
    LogNormal,
    LogNormalDist,
    Normal,
    NormalDist,
    Uniform,
    UniformDist,
)
from loadtest.profile.load import Load, Stage, TraceLoad
from loadtest.profile.quality import CaptureSpec, QualitySpec
from loadtest.profile.request import Api, RequestSpec, check_api, push_api
from loadtest.profile.scenario import AgentSpec, ImageSpec, PrefixSpec, Scenario, SessionSpec
from loadtest.profile.slo_spec import parse_slo

__all__ = [
    "DIST_TAGS",
    "FLAT_KEYS",
    "AgentSpec",
    "CaptureSpec",
    "ClientSpec",
    "DatasetSpec",
    "RunSalt",
    "Dist",
    "Empirical",
    "EngineSpec",
    "Fixed",
    "FixedDist",
    "ImageSpec",
    "Length",
    "Load",
    "LogNormal",
    "LogNormalDist",
    "Normal",
    "NormalDist",
    "PrefixSpec",
    "Profile",
    "QualitySpec",
    "RetrySpec",
    "Scenario",
    "SessionSpec",
    "Stage",
    "TraceLoad",
    "Uniform",
    "UniformDist",
]

SLO_KEY_PATTERN = r"^[a-z][a-z0-9_]*(_p\d+(\.\d+)?)?$|^error_rate$|^quality_min$|^conversation_attainment$"

# Scenario fields a profile may give at its top level instead of a scenarios list (the flat form).
FLAT_KEYS = tuple(k for k in Scenario.model_fields if k not in ("name", "weight", "api"))


def _slo_value(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError("an SLO value is a number with its unit, like 2s, 80ms, 0.5%")
    return v


# Which runs may send the same prompts (docs/profiles.md): none (a fresh nonce per run), runs with the
# same seed, or all (no run salt; the bodies of versions before run_salt existed).
def _run_salt(v: Any) -> Any:
    """YAML 1.1 reads an unquoted ``off`` as false (and ``on`` as true): take those for what was written."""
    return {False: "off", True: "per_run"}.get(v, v) if isinstance(v, bool) else v


# The embedded engine's routers over its replicas (sim/router.py).
RouterName = Literal["round-robin", "session", "kv"]
RunSalt = Annotated[Literal["per_run", "per_seed", "off"], BeforeValidator(_run_salt)]
SloKey = Annotated[str, StringConstraints(pattern=SLO_KEY_PATTERN)]
SloValue = Annotated[float | str, BeforeValidator(_slo_value)]


class EngineSpec(Strict):
    """The embedded engine's preset when the run has no --host (names as in `loadtest serve sim --help`)."""

    gpu: str = "H100"
    model: str = "llama-3.1-8b"
    tp: int = Field(default=1, ge=1)
    # Fault-injection spec, e.g. "http_503=2%,stall_mid_stream=#3@2" (docs/engine.md).
    faults: str | None = None
    # Speculative decoding / multi-token prediction "K:A": K draft tokens, acceptance A (docs/engine.md).
    spec_decode: str | None = None
    # Disaggregated prefill/decode "P:D[@GBPS]": instances of each pool, the KV link (docs/engine.md).
    disagg: str | None = None
    # Wide expert parallelism: data-parallel groups of tp GPUs sharing a MoE model's experts.
    ep: int = Field(default=1, ge=1)
    # Rack-scale system preset, e.g. "GB300-NVL72" (its GPU unless --engine-gpu names one).
    system: str | None = None
    # Replicas of the preset behind the one endpoint and the router's policy over them (docs/engine.md).
    replicas: int = Field(default=1, ge=1)
    router: RouterName = "round-robin"


class Judging(Strict):
    """Which part of a run is judged, and what makes a run valid (MLPerf: 600 s, a minimum query count)."""

    # None: the default warm-up, 10 % of the schedule, at most 30 s (metrics/judged.py; 0 = none).
    warmup_s: float | Literal["auto"] | None = Field(default=None)
    cooldown_s: float | Literal["auto"] = Field(default=0.0)
    min_duration_s: float = Field(default=0.0, ge=0)
    min_queries: int = Field(default=0, ge=0)
    # Stop the run early when it fails wholesale: this many finished requests in a row failed and none
    # succeeded for this many seconds (per process; 0 requests = never stop early). docs/ci.md.
    stop_after_failed: int = Field(default=20, ge=0)
    stop_after_failing_s: float = Field(default=10.0, ge=0)
    # The generator-health checks (schedule lag p99 ≤ 50 ms, CPU ≤ 90 %): fail makes an unhealthy
    # generator an invalid run (exit 11); warn still reports them but never fails the run (a shared
    # CI runner). --generator-health overrides it. docs/ci.md.
    generator_health: Literal["fail", "warn"] = "fail"
    # A smoke run: min_duration_s and min_queries are reported but do not block, and every output
    # says the result is not a compliant one (a short CI run of an MLPerf profile). --smoke sets it.
    smoke: bool = False

    @field_validator("warmup_s", "cooldown_s")
    @classmethod
    def _non_negative(cls, v: float | str) -> float | str:
        if isinstance(v, float | int) and v < 0:
            raise ValueError("must be ≥ 0 seconds, or auto (steady-state detection)")
        return v


class Profile(Strict):
    """One traffic profile (docs/profiles.md documents every field)."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    source: str = ""
    api: Api = "chat"
    stream: bool = True
    tokenizer: str = Field(default="llama3", min_length=1)
    model: str | None = None
    seed: int = 0
    run_salt: RunSalt = "per_run"
    duration_s: float = Field(default=30.0, gt=0)
    load: Load = Field(default_factory=lambda: Load(concurrency=8))
    scenarios: list[Scenario] = Field(min_length=1)
    slos: dict[SloKey, SloValue] = Field(default_factory=dict)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    judging: Judging = Field(default_factory=Judging)
    client: ClientSpec = Field(default_factory=ClientSpec)
    request: RequestSpec = Field(default_factory=RequestSpec)  # auth scheme, headers, extra body fields
    capture: CaptureSpec | None = None  # request/response samples into capture.jsonl (off by default)
    quality: QualitySpec = Field(default_factory=QualitySpec)  # the answer checks' settings

    @model_validator(mode="before")
    @classmethod
    def _api_down(cls, data: Any) -> Any:
        return push_api(data)  # runs after _flat_form (before-validators run last-defined first)

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, data: Any) -> Any:
        """One scenario's fields at the top level become ``scenarios: [{name: <profile name>, ...}]``."""
        if not isinstance(data, dict):
            return data
        flat = [k for k in FLAT_KEYS if k in data]
        if not flat:
            return data
        if "scenarios" in data:
            raise rule_error(
                f"give scenario fields either in scenarios or at the top level, not both (top level has {', '.join(flat)})",
                flat[0],
            )
        name = data.get("name")
        scenario = {"name": name if isinstance(name, str) and re.match(NAME_PATTERN, name) else "default"}
        scenario.update((k, data[k]) for k in flat)
        rest = {k: v for k, v in data.items() if k not in flat}
        return {**rest, "scenarios": [scenario]}

    @field_validator("slos")
    @classmethod
    def _slo_units(cls, slos: dict[str, float | str]) -> dict[str, float | str]:
        """Every SLO read as `run` reads it: a known key, a value with its unit (profile/slo_spec.py)."""
        for key, value in slos.items():
            try:
                parse_slo(key, value)
            except ValueError as e:
                raise rule_error(str(e), key) from None
        return slos

    @model_validator(mode="after")
    def _across(self) -> Profile:
        seen: set[str] = set()
        for i, s in enumerate(self.scenarios):
            if s.name in seen:
                raise rule_error(
                    f"scenario name {s.name!r} is used twice: names must be unique", "scenarios", i, "name"
                )
            seen.add(s.name)
            if s.kind == "trace" and self.load.trace is None:
                raise rule_error(
                    "kind trace needs load.trace (the trace file to replay)", "scenarios", i, "kind"
                )
            check_api(s, s.api or self.api, i)
            if s.dataset is not None and (s.api or self.api) not in ("chat", "completions"):
                raise rule_error(
                    f"a dataset scenario sends chat or completions requests (api is {s.api or self.api})",
                    "scenarios",
                    i,
                    "api",
                )
            if (s.api or self.api) == "completions":
                if s.images is not None:
                    raise rule_error(
                        "the completions api cannot send images (use api: chat)", "scenarios", i, "images"
                    )
                if s.kind in ("multi_turn", "agent", "agent_trace"):
                    raise rule_error(
                        f"the completions api cannot carry {s.kind} sessions (use api: chat)",
                        "scenarios",
                        i,
                        "kind",
                    )
        return self

    def scenario_weights(self) -> dict[str, float]:
        """Scenario name -> share of the traffic (weights normalized to sum to 1)."""
        total = sum(s.weight for s in self.scenarios)
        return {s.name: s.weight / total for s in self.scenarios}

    def scenario(self, name: str) -> Scenario:
        """The scenario called ``name`` (KeyError if none)."""
        for s in self.scenarios:
            if s.name == name:
                return s
        raise KeyError(name)
