"""The session graph of a recorded agent: its calls, subagent fan-out and join, tool delays, prefix reuse."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


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
