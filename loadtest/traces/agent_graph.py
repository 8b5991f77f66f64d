"""The session graph of a recorded agent: its calls, subagent fan-out and join, tool delays, prefix reuse."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class RecordedChat:
    """What a recording says the call sent: its whole message list (history and tool results) and its
    tool definitions, as OpenAI chat messages; and, where the recording has it, the assistant message
    that answered it (``expected``, with the row's ``intent_codes`` when it has them) and the client row's
    turn in its conversation (the inline accuracy check's key: accuracy/scorers/agentic.py)."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    expected: dict[str, Any] | None = None
    turn: int = 0


@dataclass(frozen=True, slots=True)
class AgentCall:
    """One recorded model call: when it was sent, its lengths, its prefix blocks and how long it took.

    ``delay_before_s`` is the recorded gap between the end of what this call waited for (the previous
    call of its branch, or the join of a fan-out) and this call: the tool's execution or the user's
    think time, never negative."""

    start_s: float  # seconds from the conversation's start
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    api_time_s: float  # the model call's recorded duration (0 when the recording has none)
    delay_before_s: float = 0.0
    streaming: bool = False
    model: str = ""
    ttft_s: float | None = None
    recorded: RecordedChat | None = None  # the recorded messages to send instead of hash-block text

    @property
    def end_s(self) -> float:
        """When its answer was complete, in the recording."""
        return self.start_s + self.api_time_s


@dataclass(frozen=True, slots=True)
class Subagent:
    """A subagent the conversation spawned: its calls as concurrent streams (each stream's calls run one
    after another), from ``start_s`` until ``end_s``, when its result joins the parent."""

    agent_id: str
    kind: str  # the recording's subagent type (Explore, general-purpose ...)
    start_s: float
    end_s: float
    streams: tuple[tuple[AgentCall, ...], ...]

    @property
    def calls(self) -> list[AgentCall]:
        """Every call of the subagent, by start time."""
        return sorted((c for s in self.streams for c in s), key=lambda c: c.start_s)


@dataclass(frozen=True, slots=True)
class FanOut:
    """Subagents issued together (no parent call between them); the parent's next call waits for all."""

    subagents: tuple[Subagent, ...]

    @property
    def end_s(self) -> float:
        """The join: when the last of them finished, in the recording."""
        return max(s.end_s for s in self.subagents)


Step = AgentCall | FanOut


@dataclass(frozen=True, slots=True)
class Conversation:
    """One recorded agent session: the parent's steps in order (its own calls and its fan-outs)."""

    id: str
    block_tokens: int  # tokens per hash_ids block
    steps: tuple[Step, ...]
    system_tokens: int = 0
    tool_tokens: int = 0  # the tool definitions' tokens (with system_tokens, the shared prefix)

    @property
    def parent_calls(self) -> list[AgentCall]:
        """The parent agent's own calls, in order."""
        return [s for s in self.steps if isinstance(s, AgentCall)]

    @property
    def subagents(self) -> list[Subagent]:
        """Every subagent, in the order they were spawned."""
        return [a for s in self.steps if isinstance(s, FanOut) for a in s.subagents]

    def calls(self) -> list[AgentCall]:
        """Every call, the subagents' too, in the order the recording sent them."""
        out = list(self.parent_calls) + [c for a in self.subagents for c in a.calls]
        return sorted(out, key=lambda c: c.start_s)

    @property
    def max_concurrency(self) -> int:
        """The most calls the recording had in flight at once (the fan-out's width in calls)."""
        return max_overlap((c.start_s, c.end_s) for c in self.calls())


def max_overlap(spans: Iterable[tuple[float, float]]) -> int:
    """The most half-open spans [start, end) that hold one instant (a zero-length span counts at its start)."""
    events = []
    for start, end in spans:
        events += [(start, 1), (max(end, start + 1e-9), -1)]
    events.sort(key=lambda e: (e[0], e[1]))
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def pack_streams(calls: Sequence[AgentCall]) -> tuple[tuple[AgentCall, ...], ...]:
    """Calls into the fewest sequential streams by start time: a call joins the first stream whose last
    call had ended when it started, else opens a new one (the concurrency the recording shows)."""
    streams: list[list[AgentCall]] = []
    for call in sorted(calls, key=lambda c: c.start_s):
        for stream in streams:
            if stream[-1].end_s <= call.start_s:
                stream.append(call)
                break
        else:
            streams.append([call])
    return tuple(tuple(s) for s in streams)


@dataclass(frozen=True, slots=True)
class PrefixCeiling:
    """What an unbounded prefix cache could have served: the input tokens of blocks an earlier call sent."""

    input_tokens: int
    reusable_tokens: int

    @property
    def hit_rate(self) -> float:
        """reusable ÷ input tokens (0 without input)."""
        return self.reusable_tokens / self.input_tokens if self.input_tokens else 0.0


def prefix_ceiling(conversations: Iterable[Conversation]) -> PrefixCeiling:
    """The recording's theoretical prefix-cache hit rate: each call, in the order sent, reuses its leading
    blocks that an earlier call of the same conversation sent (``hash_ids`` are prefix-chained, so a
    known block means its whole prefix is known); a cache that never evicts serves exactly those."""
    total = reusable = 0
    for conv in conversations:
        seen: set[int] = set()
        for call in conv.calls():
            n = 0
            for h in call.hash_ids:
                if h not in seen:
                    break
                n += 1
            total += call.input_tokens
            reusable += min(n * conv.block_tokens, call.input_tokens)
            seen.update(call.hash_ids)
    return PrefixCeiling(total, reusable)


def chain_hash_ids(
    branch: Sequence[AgentCall], block_tokens: int, first_id: int
) -> tuple[list[AgentCall], int]:
    """Synthetic prefix-chained block ids for a branch of calls that carry none: each call repeats its
    branch's whole previous context, so call k+1 starts with call k's full blocks (as many as both
    inputs hold) and continues with new ones; ids are drawn from ``first_id`` on. Returns the calls
    with their ids and the next free id."""
    out: list[AgentCall] = []
    prev: tuple[int, ...] = ()
    prev_in = 0
    nxt = first_id
    for call in branch:
        shared = prev[: min(prev_in, call.input_tokens) // block_tokens]
        need = -(-call.input_tokens // block_tokens) - len(shared)
        ids = shared + tuple(range(nxt, nxt + need))
        nxt += need
        out.append(replace(call, hash_ids=ids))
        prev, prev_in = ids, call.input_tokens
    return out, nxt


def subagent_of(
    agent_id: str, kind: str, start_s: float, end_s: float, calls: Sequence[AgentCall]
) -> Subagent:
    """A subagent from its calls: packed into streams; a stream's first call waited from the subagent's
    start, each later one for the call before it."""
    streams = []
    for stream in pack_streams(calls):
        ready, out = start_s, []
        for c in stream:
            out.append(replace(c, delay_before_s=max(0.0, c.start_s - ready)))
            ready = c.end_s
        streams.append(tuple(out))
    last = max((c.end_s for s in streams for c in s), default=start_s)
    return Subagent(agent_id, kind, start_s, max(end_s, last, start_s), tuple(streams))


def parent_steps(calls: Sequence[AgentCall], subagents: Sequence[Subagent]) -> tuple[Step, ...]:
    """The parent's steps in recorded order: its calls, each waiting from the end of the step before it,
    and its fan-outs (subagents spawned with no parent call between them, joined before the next call)."""
    items: list[AgentCall | Subagent] = sorted([*calls, *subagents], key=lambda x: x.start_s)
    steps: list[Step] = []
    pending: list[Subagent] = []
    ready = 0.0
    for item in items:
        if isinstance(item, Subagent):
            pending.append(item)
            continue
        if pending:
            fan = FanOut(tuple(pending))
            steps.append(fan)
            ready, pending = max(ready, fan.end_s), []
        call = replace(item, delay_before_s=max(0.0, item.start_s - ready))
        steps.append(call)
        ready = call.end_s
    if pending:
        steps.append(FanOut(tuple(pending)))
    return tuple(steps)
