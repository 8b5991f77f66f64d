"""Multi-turn chat and agent sessions whose context grows with the server's actual answers."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from loadtest.tokens.tokenizer import Tokenizer
from loadtest.workload.salt import SALT_TOKENS, salt_text
from loadtest.workload.text import synth_text
from loadtest.workload.tools import (
    shared_prefix,
    tool_call_message,
    tool_calls_from_answer,
    tool_result_message,
)

Sampler = float | Callable[[random.Random], float]


def draw(value: Sampler, rng: random.Random) -> float:
    """A sampler's draw, or the plain value."""
    return value(rng) if callable(value) else value


@dataclass(frozen=True)
class SessionCall:
    """One model call of a session: what to send and when (``think_before_s`` after the previous answer)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    max_tokens: int
    expect_reasoning: bool = False
    think_before_s: float = 0.0
    prompt_tokens: int = 0
    turn: int = 0
    call: int = 0
    answer_in_text: bool = False  # an agent turn's last call: the tools stay, the answer is text
    reference: str | None = None  # a dataset's reference answer for this call (quality checks)
    last: bool = False  # the session's planned last call (its context may still end it sooner)


class ChatSession:
    """A multi-turn chat: each turn adds a synthetic user message, then the server's actual answer.

    ``salt`` puts the per-query salt after the system prompt; otherwise a run ``nonce`` puts the run
    salt at the start of the first user message (after the shared system prompt, before everything
    the session adds), so the session's history is shared between its turns but never across runs.
    """

    def __init__(
        self,
        seed: int,
        index: int,
        tokenizer: Tokenizer,
        *,
        turns: Sampler,
        input_tokens: Sampler,
        output_tokens: Sampler,
        think_time_s: Sampler = 0.0,
        system_prompt: str = "",
        salt: bool = False,
        expect_reasoning: bool = False,
        max_context_tokens: int | None = None,
        nonce: int | None = None,
    ) -> None:
        self.seed, self.index, self.tokenizer = seed, index, tokenizer
        rng = random.Random(f"{seed}:chat:{index}")
        self.turns = max(1, int(draw(turns, rng)))
        self.think_times = [0.0] + [max(0.0, float(draw(think_time_s, rng))) for _ in range(self.turns - 1)]
        self._input, self._output = input_tokens, output_tokens
        self.expect_reasoning = expect_reasoning
        self.max_context_tokens = max_context_tokens
        system = system_prompt + (salt_text(seed, index, nonce) if salt else "")
        self._run_salt = salt_text(seed, index, nonce) if nonce is not None and not salt else ""
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        self.turn = 0
        self.done = False
        self._awaiting = False

    def prompt_tokens(self, messages: Sequence[dict[str, Any]]) -> int:
        """Prompt tokens of a request with these messages (the tokenizer's chat-template count)."""
        return self.tokenizer.count_chat(messages)

    def next_request(self) -> SessionCall | None:
        """The next turn's call, or None when the session is over (turns done, failed, context full)."""
        if self.done:
            return None
        if self._awaiting:
            raise RuntimeError("record_answer() the previous call first")
        rng = random.Random(f"{self.seed}:chat:{self.index}:{self.turn}")
        n_in = max(1, int(draw(self._input, rng)))
        max_tokens = max(1, int(draw(self._output, rng)))
        if self.turn == 0 and self._run_salt:
            user = (self._run_salt + synth_text(max(1, n_in - SALT_TOKENS), rng)).lstrip()
        else:
            user = synth_text(n_in, rng).lstrip()
        messages = [*self.messages, {"role": "user", "content": user}]
        n = self.prompt_tokens(messages)
        if self.max_context_tokens is not None and n + max_tokens > self.max_context_tokens:
            self.done = True
            return None
        self.messages = messages
        self._awaiting = True
        return SessionCall(
            list(messages),
            None,
            max_tokens,
            self.expect_reasoning,
            self.think_times[self.turn],
            n,
            self.turn,
            0,
            last=self.turn == self.turns - 1,
        )

    def record_answer(self, text: str | None) -> None:
        """Append the answer the server streamed; None (the call failed) ends the session."""
        if not self._awaiting:
            raise RuntimeError("no call is waiting for an answer")
        self._awaiting = False
        if text is None:
            self.done = True
            return
        self.messages.append({"role": "assistant", "content": text})
        self.turn += 1
        self.done = self.turn >= self.turns


class AgentSession:
    """An agent loop: a cacheable system+tools prefix, then per turn a user message and several tool-calling calls.

    Every call but a turn's last records a tool call and its result; the last records the answer
    text (or the tool call, if the server made one). When a call would not fit
    ``max_context_tokens`` (prompt + max_tokens), ``overflow="stop"`` ends the session and
    ``"truncate"`` first drops the oldest whole turns (the prefix is always kept). A run ``nonce``
    puts the run salt at the start of every user turn (after the shared prefix; a kept turn still
    starts with one when older turns are dropped).
    """

    def __init__(
        self,
        seed: int,
        index: int,
        tokenizer: Tokenizer,
        *,
        prefix_tokens: int,
        tools: int = 8,
        turns: Sampler = 1,
        input_tokens: Sampler = 200,
        calls_per_turn: Sampler = 4,
        output_tokens: Sampler = 64,
        tool_result_tokens: Sampler = 400,
        max_context_tokens: int = 131072,
        think_time_s: Sampler = 0.0,
        tool_latency_s: Sampler = 0.0,
        expect_reasoning: bool = False,
        overflow: Literal["stop", "truncate"] = "stop",
        nonce: int | None = None,
    ) -> None:
        self.seed, self.index, self.tokenizer = seed, index, tokenizer
        system, self.tools = shared_prefix(seed, tokenizer, prefix_tokens, tools)
        self._head: list[dict[str, Any]] = [{"role": "system", "content": system}]
        self._turns: list[list[dict[str, Any]]] = []
        rng = random.Random(f"{seed}:agent:{index}")
        self.turns = max(1, int(draw(turns, rng)))
        self.think_times = [0.0] + [max(0.0, float(draw(think_time_s, rng))) for _ in range(self.turns - 1)]
        self._input, self._calls, self._output = input_tokens, calls_per_turn, output_tokens
        self._result, self._latency = tool_result_tokens, tool_latency_s
        self.max_context_tokens = max_context_tokens
        self.expect_reasoning = expect_reasoning
        self.overflow = overflow
        self.nonce = nonce
        self.turn = self.call = 0
        self._n_calls = 0
        self.done = False
        self._awaiting = False

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far: the prefix, then every kept turn."""
        return [*self._head, *(m for t in self._turns for m in t)]

    def prompt_tokens(self, messages: Sequence[dict[str, Any]]) -> int:
        """The request's prompt tokens, tools and tool calls included (``Tokenizer.count_request``,
        the same count the embedded engine makes)."""
        return self.tokenizer.count_request(messages, self.tools)

    def next_request(self) -> SessionCall | None:
        """The next model call, or None when the session is over (turns done, failed, context full)."""
        if self.done:
            return None
        if self._awaiting:
            raise RuntimeError("record_answer() the previous call first")
        key = f"{self.seed}:agent:{self.index}:{self.turn}"
        if self.call == 0:
            rng = random.Random(key)
            self._n_calls = max(1, int(draw(self._calls, rng)))
            n_in = max(1, int(draw(self._input, rng)))
            if self.nonce is None:
                user = synth_text(n_in, rng).lstrip()
            else:
                salt = salt_text(self.seed, f"{self.index}:{self.turn}", self.nonce)
                user = (salt + synth_text(max(1, n_in - SALT_TOKENS), rng)).lstrip()
            self._turns.append([{"role": "user", "content": user}])
            think = self.think_times[self.turn]
        else:
            think = max(0.0, float(draw(self._latency, random.Random(f"{key}:{self.call}:latency"))))
        max_tokens = max(1, int(draw(self._output, random.Random(f"{key}:{self.call}"))))
        messages = self.messages
        n = self.prompt_tokens(messages)
        while (
            n + max_tokens > self.max_context_tokens and self.overflow == "truncate" and len(self._turns) > 1
        ):
            self._turns.pop(0)
            messages = self.messages
            n = self.prompt_tokens(messages)
        if n + max_tokens > self.max_context_tokens:
            self.done = True
            return None
        self._awaiting = True
        return SessionCall(
            messages,
            self.tools,
            max_tokens,
            self.expect_reasoning,
            think,
            n,
            self.turn,
            self.call,
            answer_in_text=self.call == self._n_calls - 1,
            last=self.turn == self.turns - 1 and self.call == self._n_calls - 1,
        )

    def record_answer(self, text: str | None, tool_calls: Sequence[dict[str, Any]] | None = None) -> None:
        """Append the call's outcome: the server's tool calls or answer text; None and no calls ends the session."""
        if not self._awaiting:
            raise RuntimeError("no call is waiting for an answer")
        self._awaiting = False
        if text is None and not tool_calls:
            self.done = True
            return
        conv = self._turns[-1]
        last = self.call == self._n_calls - 1
        if last and not tool_calls:
            conv.append({"role": "assistant", "content": text})
        else:
            key = f"{self.seed}:agent:{self.index}:{self.turn}:{self.call}"
            rng = random.Random(f"{key}:tool")
            name = rng.choice(self.tools)["function"]["name"] if self.tools else "tool"
            calls = tool_calls_from_answer(text, tool_calls, name, f"call_{self.turn}_{self.call}")
            conv.append(tool_call_message(calls))
            for c in calls:
                result = synth_text(max(1, int(draw(self._result, rng))), rng).lstrip()
                conv.append(tool_result_message(c["id"], result))
        self.call += 1
        if last:
            self.turn += 1
            self.call = 0
            self.done = self.turn >= self.turns
