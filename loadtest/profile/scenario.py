"""One kind of traffic in a profile: what each request (or session) sends."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from loadtest.profile.base import MAX_TOKENS, MAX_TURNS, NAME_PATTERN, Strict, check_ceiling, rule_error
from loadtest.profile.dataset import DatasetSpec
from loadtest.profile.dists import Dist, Length
from loadtest.profile.request import DEFAULT_POLL_S, NO_OUTPUT_APIS, Api, RawSpec


class PrefixSpec(Strict):
    """Each request starts with one of ``groups`` shared prefixes of ``tokens`` tokens."""

    groups: int = Field(ge=1, le=100_000)
    tokens: int = Field(ge=1)

    @model_validator(mode="after")
    def _bound(self) -> PrefixSpec:
        check_ceiling(self.tokens, MAX_TOKENS, "tokens", "tokens")
        return self


def _most(length: Length) -> float | None:
    """The largest value a length spec can give (None: no max, its tail is clamped when sampled)."""
    if length.dist == "fixed":
        return length.value
    if length.dist == "empirical":
        return length.points[-1][1]
    return length.max


def _turn_ceiling(spec: object, *fields: str) -> None:
    """Turn and call counts (length specs) at most MAX_TURNS."""
    for name in fields:
        length: Length = getattr(spec, name)
        most = _most(length)
        at = "value" if length.dist == "fixed" else "max"
        check_ceiling(most, MAX_TURNS, "turns", name, *(("points",) if length.dist == "empirical" else (at,)))
        if length.dist in ("normal", "lognormal") and length.max is None:
            centre = length.mean if length.dist == "normal" else length.median
            check_ceiling(centre, MAX_TURNS, "turns", name)


class SessionSpec(Strict):
    """Multi-turn chat: turns per session and the user's think time between turns."""

    turns: Length
    think_time_s: Dist

    @model_validator(mode="after")
    def _bound(self) -> SessionSpec:
        _turn_ceiling(self, "turns")
        return self


class AgentTraceSpec(Strict):
    """kind agent_trace: replay the recorded agent sessions of a recording, one conversation a unit."""

    path: str = Field(min_length=1)  # a recording (docs/traces.md), relative to the profile
    # cctraces, otel (OpenTelemetry GenAI spans), mlperf_agentic (MLPerf Endpoints rows); auto: sniffed
    format: Literal["auto", "cctraces", "otel", "mlperf_agentic"] = "auto"
    speedup: float = Field(default=1.0, gt=0)  # the recorded tool and think delays divided by this
    tool_delays: bool = True  # false: the next call goes as soon as what it waits for has ended
    # recorded messages with a system prompt: salt markers before and after it, per conversation and pass
    salt: bool = True
    # every call's max_tokens (the reference's max_new_tokens); unset: each call's recorded output length
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    # issue this many conversations (units; past the recording's count they repeat, salted anew), then end
    trajectories: int | None = Field(default=None, ge=1)
    # t*: where each conversation starts: its first call (beginning) or a parent call drawn per unit
    # (sampled), whose recorded input carries the earlier context (docs/sources.md §18).
    start: Literal["beginning", "sampled"] = "beginning"
    # Each conversation's first call unique from its first token (no cache shared across replays of
    # one recording); false: replays of one recorded session send the same texts.
    cache_bust_first_turn: bool = True
    # The MLPerf agentic inline accuracy the run must reach (0..1; recordings with expected answers):
    # a score below it fails the verdict (run.json agentic_accuracy, docs/traces.md).
    accuracy_target: float | None = Field(default=None, ge=0, le=1)


class AgentSpec(Strict):
    """Long-context agent: a shared system+tools prefix, several tool calls per user turn."""

    prefix_tokens: int = Field(ge=1)
    tools: int = Field(default=8, ge=0, le=1024)
    turns: Length
    calls_per_turn: Length
    tool_result_tokens: Length
    think_time_s: Dist
    max_context_tokens: int = Field(default=131072, ge=1)

    @model_validator(mode="after")
    def _fits(self) -> AgentSpec:
        check_ceiling(self.max_context_tokens, MAX_TOKENS, "tokens", "max_context_tokens")
        _turn_ceiling(self, "turns", "calls_per_turn")
        if self.prefix_tokens >= self.max_context_tokens:
            raise rule_error(
                f"prefix_tokens ({self.prefix_tokens}) must be < max_context_tokens ({self.max_context_tokens})",
                "prefix_tokens",
            )
        return self


class ImageSpec(Strict):
    """Synthetic image content parts added to each user message."""

    count: int = Field(default=1, ge=1, le=64)
    width: int = Field(default=512, ge=1, le=8192)
    height: int = Field(default=512, ge=1, le=8192)
    detail: Literal["low", "high", "auto"] = "auto"


Kind = Literal["chat", "multi_turn", "agent", "trace", "agent_trace"]
RECORDED_KINDS = ("trace", "agent_trace")  # their lengths come from the recording


def _length_optional(sc: Scenario, key: str) -> bool:
    """Raw replay takes both lengths from the recorded bodies; embeddings, rerank, kserve_v2 and videogen
    produce no output tokens."""
    return sc.raw is not None or (sc.api in NO_OUTPUT_APIS and key == "output_tokens")


# Scenario keys that make synthetic text: a dataset's prompts are sent as they are (docs/datasets.md).
_NOT_WITH_DATASET = ("input_tokens", "output_tokens", "salt", "system_prompt_tokens", "prefix", "images")


def _check_dataset(sc: Scenario) -> None:
    if sc.kind != "chat":
        raise rule_error(
            f"a dataset scenario is kind chat (multi-turn conversations become sessions by themselves; kind is {sc.kind})",
            "kind",
        )
    for key in _NOT_WITH_DATASET:
        if key in sc.model_fields_set and getattr(sc, key) not in (None, False, 0):
            fix = "set output lengths with dataset.output_tokens" if key == "output_tokens" else "remove it"
            raise rule_error(f"a dataset scenario sends the dataset's prompts as they are: {fix}", key)


class Scenario(Strict):
    """A weighted part of the traffic mix."""

    name: str = Field(pattern=NAME_PATTERN)
    weight: float = Field(default=1.0, gt=0)
    kind: Kind = "chat"
    api: Api | None = None
    system_prompt_tokens: int = Field(default=0, ge=0)
    salt: bool = False
    input_tokens: Length | None = None
    output_tokens: Length | None = None
    ignore_eos: bool = True
    reasoning: bool = False
    prefix: PrefixSpec | None = None
    session: SessionSpec | None = None
    agent: AgentSpec | None = None
    agent_trace: AgentTraceSpec | None = None  # kind agent_trace: the recorded sessions to replay
    images: ImageSpec | None = None
    raw: RawSpec | None = None  # api: raw: the recorded bodies to replay
    poll_interval_s: float = Field(
        default=DEFAULT_POLL_S, gt=0, le=60
    )  # video_jobs: between two polls of a job
    inputs_per_request: int = Field(
        default=1, ge=1, le=2048
    )  # embeddings: inputs; rerank: documents; kserve_v2: samples
    dataset: DatasetSpec | None = None  # real prompts from a file (docs/datasets.md)

    @model_validator(mode="after")
    def _by_kind(self) -> Scenario:
        check_ceiling(self.system_prompt_tokens, MAX_TOKENS, "tokens", "system_prompt_tokens")
        if self.dataset is not None:
            _check_dataset(self)
            return self
        for key in ("input_tokens", "output_tokens"):
            given = getattr(self, key) is not None
            if self.kind not in RECORDED_KINDS and not given and not _length_optional(self, key):
                raise rule_error(
                    f"required for kind {self.kind} (a length spec, e.g. {{dist: fixed, value: 128}})", key
                )
            if self.kind in RECORDED_KINDS and given:
                raise rule_error(f"kind {self.kind} takes its lengths from the trace: remove it", key)
        if self.kind == "multi_turn" and self.session is None:
            raise rule_error(
                "kind multi_turn needs session: {turns: <length>, think_time_s: <dist>}", "session"
            )
        if self.kind != "multi_turn" and self.session is not None:
            raise rule_error(f"session applies to kind multi_turn only (kind is {self.kind})", "session")
        if self.kind == "agent" and self.agent is None:
            raise rule_error(
                "kind agent needs agent: {prefix_tokens, turns, calls_per_turn, tool_result_tokens, think_time_s}",
                "agent",
            )
        if self.kind == "agent_trace" and self.agent_trace is None:
            raise rule_error("kind agent_trace needs agent_trace: {path: <cc-traces.jsonl>}", "agent_trace")
        if self.kind != "agent_trace" and self.agent_trace is not None:
            raise rule_error(
                f"agent_trace applies to kind agent_trace only (kind is {self.kind})", "agent_trace"
            )
        if self.kind != "agent" and self.agent is not None:
            raise rule_error(f"agent applies to kind agent only (kind is {self.kind})", "agent")
        return self
