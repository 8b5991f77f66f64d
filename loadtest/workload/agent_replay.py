"""Recorded agent sessions as units: each conversation's calls in order, its subagents side by side, the
recorded delays waited, every prompt the recorded messages (salted) or built from its hash-id blocks so the
server sees the recorded reuse."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from loadtest.client.openai import PreparedRequest
from loadtest.client.record import RequestRecord
from loadtest.profile.scenario import AgentTraceSpec, Scenario
from loadtest.tokens.tokenizer import Tokenizer, get_tokenizer
from loadtest.traces.agent_formats import read_agent_trace
from loadtest.traces.agent_graph import AgentCall, Conversation, FanOut, RecordedChat
from loadtest.traces.agent_graph import Step as GraphStep
from loadtest.workload.prefix import PrefixBank
from loadtest.workload.units import Step, Unit

# A call's request from (request id, the call, its conversation's bank).
BuildCall = Callable[[str, AgentCall, PrefixBank], PreparedRequest]


@dataclass(frozen=True, slots=True)
class AgentTrace:
    """A scenario's recorded sessions and how to replay them (its ``agent_trace`` spec)."""

    conversations: list[Conversation]
    speedup: float
    tool_delays: bool
    salt: bool = True
    max_tokens: int | None = None
    sampled_start: bool = False  # t*: each unit starts at a parent call drawn for it (start_call)
    cache_bust: bool = True  # each unit's texts its own (cache_bust_first_turn)

    @classmethod
    def load(cls, spec: AgentTraceSpec, where: str, tokenizer: Tokenizer | None = None) -> AgentTrace:
        """The spec's recording; ``where`` names the field in errors (``scenarios[0].agent_trace.path``);
        ``tokenizer`` counts the tokens of recorded text (the default tokenizer without one)."""
        count = (tokenizer or get_tokenizer()).count
        try:
            convs = read_agent_trace(spec.path, spec.format, count)
        except OSError as e:
            raise ValueError(
                f"{where}: cannot read {spec.path} ({e.strerror or e}): give a recording (docs/traces.md)"
            ) from None
        if spec.accuracy_target is not None and not any(
            c.recorded is not None and c.recorded.expected is not None for conv in convs for c in conv.calls()
        ):
            field = where.removesuffix(".path") + ".accuracy_target"
            raise ValueError(
                f"{field}: {spec.path} records no answer to score (an mlperf_agentic recording does); "
                "remove accuracy_target"
            )
        return cls(convs, spec.speedup, spec.tool_delays, spec.salt, spec.max_tokens)

    def sent(self, call: AgentCall, conversation: str, repeat: int) -> AgentCall:
        """The call as this pass of its conversation sends it: the recorded messages salted, the output
        length the spec's ``max_tokens`` when it gives one."""
        if self.max_tokens is not None:
            call = replace(call, output_tokens=self.max_tokens)
        if self.salt and call.recorded is not None:
            call = replace(call, recorded=salted(call.recorded, conversation, repeat))
        return call

    def wait_s(self, recorded_s: float) -> float:
        """How long the replay waits for a recorded delay: sped up (0 without delays)."""
        return recorded_s / self.speedup if self.tool_delays else 0.0


@dataclass(frozen=True, slots=True)
class _Planned:
    """A call to build when its turn comes (a long session's prompts are not all built up front)."""

    request_id: str
    call: AgentCall
    wait_s: float
    parallel: tuple[Unit, ...] = ()
    last: bool = False

    def step(self, bank: PrefixBank, build: BuildCall) -> Step:
        req = build(self.request_id, self.call, bank)
        req.session_last = self.last
        return Step(req, self.wait_s, self.parallel)


class _Stream(Unit):
    """One subagent stream: its calls one after another, each after its recorded delay."""

    def __init__(self, scenario: str, plan: list[_Planned], bank: PrefixBank, build: BuildCall) -> None:
        self.scenario = scenario
        self._plan, self._bank, self._build = plan, bank, build
        self._k = 0

    def next(self, last: RequestRecord | None) -> Step | None:
        if self._k >= len(self._plan):
            return None
        self._k += 1
        return self._plan[self._k - 1].step(self._bank, self._build)


class AgentTraceUnit(Unit):
    """Conversation ``index % n`` of the recording: the parent's calls in order; a fan-out's subagents run
    side by side before the parent's next call, which waits for all (the join) and then its recorded
    delay. A failed parent call ends the conversation. Each unit has its own block texts (``bank``), so
    replays of one recorded session share nothing but what the recording shares within it. A fan-out
    after the parent's last call is not replayed (nothing waits for it)."""

    def __init__(
        self, trace: AgentTrace, scenario: str, index: int, bank: PrefixBank, build: BuildCall
    ) -> None:
        self.scenario = scenario
        conv = trace.conversations[index % len(trace.conversations)]
        repeat = index // len(trace.conversations)
        base = f"{scenario}-{index}"
        self._plan: list[_Planned] = []
        self._bank, self._build = bank, build
        branches: list[Unit] = []
        ready = 0.0  # when the parent's previous call ended, in the recording
        first = start_call(conv, scenario, index) if trace.sampled_start else 0
        for step in steps_from(conv, first):
            if isinstance(step, FanOut):
                branches += _branches(trace, step, base, len(branches), ready, bank, build, scenario)
                continue
            wait = trace.wait_s(step.delay_before_s)
            call = trace.sent(step, conv.id, repeat)
            self._plan.append(_Planned(f"{base}.{len(self._plan)}", call, wait, tuple(branches)))
            branches, ready = [], step.end_s
        if self._plan:
            self._plan[-1] = replace(self._plan[-1], last=True)
        self._k = 0

    def next(self, last: RequestRecord | None) -> Step | None:
        if last is not None and last.outcome != "ok":
            return None
        if self._k >= len(self._plan):
            return None
        self._k += 1
        return self._plan[self._k - 1].step(self._bank, self._build)


def _branches(
    trace: AgentTrace,
    fan: FanOut,
    base: str,
    first: int,
    ready: float,
    bank: PrefixBank,
    build: BuildCall,
    scenario: str,
) -> list[Unit]:
    """Each subagent stream of a fan-out as a unit (ids ``<unit>.a<subagent>-<stream>.<call>``); a stream's
    first call waits the subagent's start after the parent's previous call ended (``ready``), then its
    own delay from the subagent's start."""
    out: list[Unit] = []
    for j, agent in enumerate(fan.subagents, start=first):
        spawn = max(0.0, agent.start_s - ready)
        for s, stream in enumerate(agent.streams):
            plan = [
                _Planned(
                    f"{base}.a{j}-{s}.{k}",
                    trace.sent(call, agent.agent_id, 0),
                    trace.wait_s(call.delay_before_s + (spawn if k == 0 else 0.0)),
                )
                for k, call in enumerate(stream)
            ]
            out.append(_Stream(scenario, plan, bank, build))
    return out


def salted(chat: RecordedChat, conversation: str, repeat: int) -> RecordedChat:
    """The MLPerf Endpoints trajectory salt (docs/sources.md §20): the first system message becomes
    ``[salt: <pass>]\n\n<system>\n\n[salt: <conversation>]``, each a 2-byte BLAKE2b of the pass number and
    of the conversation id, so no two passes nor conversations share a cached prefix; a recording
    without a system prompt is sent as it is."""
    messages = list(chat.messages)
    for i, m in enumerate(messages):
        if m.get("role") == "system" and isinstance(m.get("content"), str):
            first = hashlib.blake2b(str(repeat).encode(), digest_size=2).hexdigest()
            last = hashlib.blake2b(conversation.encode(), digest_size=2).hexdigest()
            messages[i] = {**m, "content": f"[salt: {first}]\n\n{m['content']}\n\n[salt: {last}]"}
            return replace(chat, messages=tuple(messages))
    return chat


def trajectory_units(scenarios: list[Scenario]) -> int | None:
    """Units a run issues when its agent_trace scenario gives ``trajectories`` (None when none does);
    ValueError when the profile has other scenarios too (their share would decide the count)."""
    given = [
        (i, s) for i, s in enumerate(scenarios) if s.agent_trace is not None and s.agent_trace.trajectories
    ]
    if not given:
        return None
    i, sc = given[0]
    if len(scenarios) > 1:
        raise ValueError(
            f"scenarios[{i}].agent_trace.trajectories: a trajectory count needs a profile with one scenario; "
            "remove trajectories or the other scenarios"
        )
    assert sc.agent_trace is not None
    return sc.agent_trace.trajectories


def with_replay_options(trace: AgentTrace, spec: AgentTraceSpec) -> AgentTrace:
    """The recording with the spec's AgentX options: t* (``start``) and first-turn cache busting."""
    return replace(trace, sampled_start=spec.start == "sampled", cache_bust=spec.cache_bust_first_turn)


def start_call(conv: Conversation, scenario: str, index: int) -> int:
    """t*: the parent call unit ``index`` starts at, drawn uniformly from the conversation's parent calls
    (seeded by the scenario and the unit, so a run and its replays draw the same)."""
    n = len(conv.parent_calls)
    return random.Random(f"{scenario}:t-star:{index}").randrange(n) if n else 0


def steps_from(conv: Conversation, first: int) -> tuple[GraphStep, ...]:
    """The conversation's steps from its ``first`` parent call on (the fan-outs before it dropped): that
    call's recorded input holds the earlier context, so the server sees the recorded prefix from it."""
    if first <= 0:
        return conv.steps
    at = conv.steps.index(conv.parent_calls[first])
    return conv.steps[at:]


def bank_key(trace: AgentTrace, scenario: str, index: int) -> str:
    """What a unit's block texts are keyed by (with the run nonce): the unit itself when each
    conversation's first call is made unique (cache busting: its first block, hence every prefix, is its
    own), else the recorded session, so replays of one recording send the same texts."""
    conv = index % len(trace.conversations)
    return f"{scenario}:{index}" if trace.cache_bust else f"{scenario}:session:{conv}"
