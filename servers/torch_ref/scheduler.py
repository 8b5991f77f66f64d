"""Continuous batching: waiting and running queues, max_num_seqs, a per-step token budget, chunked prefill."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine: its prompt, its output so far and how much the cache holds."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int  # output tokens at most (already clipped to the slot length)
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int | None = None
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is in the cache
    slot: int = -1
    status: str = WAITING
    finish_reason: str | None = None
    arrival_ns: int = 0
    first_scheduled_ns: int | None = None
    aborted: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    def token(self, pos: int) -> int:
        p = len(self.prompt_ids)
        return self.prompt_ids[pos] if pos < p else self.output_ids[pos - p]


@dataclass
class ScheduledItem:
    seq: Sequence
    start: int  # first position computed this step
    n: int  # tokens computed this step

    @property
    def samples(self) -> bool:
        """Whether this step yields the sequence's next token (its known tokens are all computed)."""
        return self.start + self.n == self.seq.num_tokens


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_slots: int = 256  # KV-cache regions; a request waits while none is free
    max_model_len: int = 4096  # positions per slot


class Scheduler:
    """vLLM-V1-style policy: running sequences first (decodes and prefill chunks, in admission order),
    then waiting ones FCFS while the sequence limit, the token budget and a free KV slot allow.
    A sequence whose whole length fits its slot never needs preemption: admission is the control."""

    def __init__(self, config: SchedulerConfig) -> None:
        if config.max_num_seqs < 1 or config.max_num_batched_tokens < 1 or config.num_slots < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and the slot count must be >= 1")
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots = list(range(config.num_slots))  # kept sorted: lowest slot first
        self.tokens_in_cache = 0

    def add(self, seq: Sequence) -> None:
        if seq.num_tokens + seq.max_tokens > self.config.max_model_len + 1:
            raise ValueError(f"request {seq.request_id} needs more than max_model_len positions")
        seq.status = WAITING
        self.waiting.append(seq)

    def schedule(self) -> list[ScheduledItem]:
        """The next step's work; empty when there is nothing to do."""
        budget = self.config.max_num_batched_tokens
        items: list[ScheduledItem] = []
        for seq in self.running:
            if budget <= 0:
                break
            n = min(seq.num_tokens - seq.num_computed, budget)
            if n <= 0:
                continue
            items.append(ScheduledItem(seq, seq.num_computed, n))
            budget -= n
        while (
            self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs and self.free_slots
        ):
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.pop(0)
            seq.status = RUNNING
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed, budget)
            items.append(ScheduledItem(seq, seq.num_computed, n))
            budget -= n
        return items

    def advance(self, items: list[ScheduledItem]) -> None:
        """Account a finished step: the scheduled tokens are now in the cache."""
        for it in items:
            it.seq.num_computed += it.n
            self.tokens_in_cache += it.n

    def finish(self, seq: Sequence, reason: str | None) -> None:
        """Release a sequence (done, aborted or failed): it leaves its queue and frees its slot."""
        if seq.status == FINISHED:
            return
        if seq.status == RUNNING:
            self.running.remove(seq)
            self.free_slots.append(seq.slot)
            self.free_slots.sort()
            self.tokens_in_cache -= seq.num_computed
        else:
            self.waiting.remove(seq)
        seq.status = FINISHED
        seq.finish_reason = reason

    @property
    def kv_usage(self) -> float:
        """Share of the cache's positions that hold a running sequence's tokens (1 = full)."""
        c = self.config
        return self.tokens_in_cache / (c.num_slots * c.max_model_len)
