"""The engine loop in its own thread: take requests, schedule a step, run the model, sample, deliver."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from servers.torch_ref.model import LlamaModel, StepInput
from servers.torch_ref.scheduler import RUNNING, ScheduledItem, Scheduler, Sequence

log = logging.getLogger(__name__)

# deliver(events): called from the engine thread once per step with (sequence, new token ids,
# finish reason or None, error or None) for every sequence that changed; it must be thread-safe.
Deliver = Callable[[list[tuple[Sequence, list[int], str | None, str | None]]], None]


@dataclass
class EngineCounters:
    steps: int = 0
    prompt_tokens: int = 0  # prefill tokens computed
    generated_tokens: int = 0
    busy_s: float = 0.0
    max_running: int = 0
    max_waiting: int = 0


class Engine:
    """Owns the scheduler, the model and the sampler; everything here runs on one thread."""

    def __init__(
        self,
        model: LlamaModel,
        scheduler: Scheduler,
        deliver: Deliver,
        end_ids: set[int],
        allowed_ids: list[int] | None = None,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.scheduler = scheduler
        self.deliver = deliver
        self.end_ids = sorted(end_ids)
        self.counters = EngineCounters()
        self.preemptions = 0  # a sequence always fits its slot: nothing is ever preempted
        dev = model.device
        vocab = model.w.lm_head.shape[0]
        self._bias: torch.Tensor | None = None
        if allowed_ids is not None:
            bias = torch.full((vocab,), float("-inf"), device=dev)
            keep = [i for i in (*allowed_ids, *self.end_ids) if i < vocab]
            bias[torch.tensor(keep, device=dev, dtype=torch.long)] = 0.0
            self._bias = bias
        self._end = torch.tensor([i for i in self.end_ids if i < vocab], device=dev, dtype=torch.long)
        self._gen = torch.Generator(device=dev).manual_seed(seed)
        self._inbox: queue.SimpleQueue[tuple[str, Sequence]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- called from other threads ----
    def submit(self, seq: Sequence) -> None:
        seq.arrival_ns = seq.arrival_ns or time.perf_counter_ns()
        self._inbox.put(("add", seq))
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        self._inbox.put(("abort", seq))
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="torch-ref-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        """Share of KV slots in use (a waiting request needs a free one)."""
        s = self.scheduler
        return (s.config.num_slots - len(s.free_slots)) / s.config.num_slots

    # ---- the engine thread ----
    def _drain_inbox(self) -> None:
        while True:
            try:
                op, seq = self._inbox.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                try:
                    self.scheduler.add(seq)
                except ValueError as e:
                    self.deliver([(seq, [], None, str(e))])
            elif seq.status != "finished":
                self.scheduler.finish(seq, "abort")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox()
            items = self.scheduler.schedule()
            c = self.counters
            c.max_running = max(c.max_running, self.num_running)
            c.max_waiting = max(c.max_waiting, self.num_waiting)
            if not items:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            t0 = time.perf_counter()
            try:
                events = self.step(items)
            except Exception as e:  # a failed step fails its sequences, not the server
                log.exception("engine step failed")
                events = []
                for it in items:
                    self.scheduler.finish(it.seq, None)
                    events.append((it.seq, [], None, f"engine step failed: {e}"))
            c.busy_s += time.perf_counter() - t0
            if events:
                self.deliver(events)
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            self.scheduler.finish(seq, None)
            self.deliver([(seq, [], None, "server shutting down")])

    def step(self, items: list[ScheduledItem]) -> list[tuple[Sequence, list[int], str | None, str | None]]:
        """Run one scheduled step and account it; returns the events to deliver."""
        token_ids: list[int] = []
        triples: list[tuple[int, int, int]] = []
        sample_rows: list[int] = []
        sampled: list[Sequence] = []
        now = time.perf_counter_ns()
        for it in items:
            seq = it.seq
            if seq.first_scheduled_ns is None:
                seq.first_scheduled_ns = now
            token_ids += [seq.token(p) for p in range(it.start, it.start + it.n)]
            triples.append((seq.slot, it.start, it.n))
            if it.samples:
                sample_rows.append(len(token_ids) - 1)
                sampled.append(seq)
            if seq.in_prefill:
                self.counters.prompt_tokens += min(it.n, len(seq.prompt_ids) - it.start)
        logits = self.model.forward(StepInput(token_ids, triples, sample_rows))
        new = self.sample(logits, sampled) if sampled else []
        self.scheduler.advance(items)
        self.counters.steps += 1
        events = []
        for seq, tok in zip(sampled, new, strict=True):
            if seq.status != RUNNING:
                continue
            reason = None
            if tok in self.end_ids and not seq.ignore_eos and len(seq.output_ids) >= seq.min_tokens:
                reason = "stop"  # the end token is neither streamed nor counted
                out: list[int] = []
            else:
                seq.output_ids.append(tok)
                self.counters.generated_tokens += 1
                out = [tok]
                if len(seq.output_ids) >= seq.max_tokens:
                    reason = "length"
            if reason is not None:
                self.scheduler.finish(seq, reason)
            events.append((seq, out, reason, None))
        return events

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Greedy for temperature 0, else seeded sampling; end tokens are barred where they may not stop."""
        if self._bias is not None:
            logits = logits + self._bias
        logits = torch.nan_to_num(logits, nan=float("-inf"))
        bar = [i for i, s in enumerate(seqs) if s.ignore_eos or len(s.output_ids) < s.min_tokens]
        if bar and self._end.numel():
            rows = torch.tensor(bar, device=logits.device, dtype=torch.long)
            logits[rows[:, None], self._end[None, :]] = float("-inf")
        out = logits.argmax(dim=-1)
        hot = [i for i, s in enumerate(seqs) if s.temperature > 0]
        for i in hot:
            s = seqs[i]
            probs = torch.softmax(logits[i] / s.temperature, dim=-1)
            gen = self._gen
            if s.seed is not None:
                gen = torch.Generator(device=logits.device).manual_seed(s.seed + len(s.output_ids))
            out[i] = torch.multinomial(probs, 1, generator=gen)[0]
        return out.tolist()
