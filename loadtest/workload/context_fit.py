"""Whether a workload's requests fit the model's context window: the shortest request each scenario can
send, from the profile alone, and the first requests built and counted (bounded), before a run."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.profile.schema import Length, Profile, Scenario
from loadtest.workload.builder import Workload

SAMPLE = 200  # first requests of the run checked (a session's first call: later calls only grow)
SAMPLE_TOKENS = 4_000_000  # stop building sampled requests past this many prompt tokens (about a second)


@dataclass(frozen=True, slots=True)
class ContextFit:
    """How many of the sampled requests exceed ``max_model_len``, and the largest one."""

    max_model_len: int
    sampled: int
    over: int  # prompt + requested output > max_model_len
    prompt_over: int  # the prompt alone does not fit
    largest: int  # the largest prompt + requested output seen

    @property
    def nothing_fits(self) -> bool:
        return self.sampled > 0 and self.prompt_over == self.sampled

    def message(self) -> str:
        share = 100.0 * self.over / self.sampled if self.sampled else 0.0
        return (
            f"{self.over} of the first {self.sampled} requests ({share:.0f} %) need more than the model's "
            f"context of {self.max_model_len} tokens (prompt + max_tokens, up to {self.largest}); "
            "the server will refuse them (outcome context_length)"
        )


def check_fit(
    workload: Workload, max_model_len: int, sample: int = SAMPLE, sample_tokens: int = SAMPLE_TOKENS
) -> ContextFit:
    """Build the first ``sample`` requests (fewer once their prompts total ``sample_tokens``: huge
    prompts take seconds each to build) and count those that cannot fit ``max_model_len``."""
    over = prompt_over = largest = built = 0
    n = 0
    for i in range(sample):
        try:
            req = workload.request(i)
        except IndexError:  # a trace shorter than the sample
            break
        n += 1
        need = req.prompt_tokens + (req.requested_output_tokens or 0)
        largest = max(largest, need)
        over += need > max_model_len
        prompt_over += req.prompt_tokens >= max_model_len
        built += req.prompt_tokens
        if built >= sample_tokens:
            break
    return ContextFit(max_model_len, n, over, prompt_over, largest)


def _least(length: Length) -> int:
    """The smallest value a length spec can give."""
    if length.dist == "fixed":
        return length.value
    if length.dist == "empirical":
        return round(length.points[0][1])
    return length.min


def shortest_request(sc: Scenario) -> int | None:
    """The fewest tokens (prompt + requested output) a request of ``sc`` can need; None when the profile
    alone does not say (a trace, a dataset, recorded bodies, embeddings and rerank)."""
    if sc.dataset is not None or sc.raw is not None or sc.kind in ("trace", "agent_trace"):
        return None
    if sc.api in ("embeddings", "rerank") or sc.input_tokens is None or sc.output_tokens is None:
        return None
    prompt = max(_least(sc.input_tokens), sc.system_prompt_tokens, 1)
    if sc.agent is not None:
        prompt = max(prompt, sc.agent.prefix_tokens)
    return prompt + max(1, _least(sc.output_tokens))


def scenarios_over(profile: Profile, max_model_len: int) -> tuple[list[tuple[str, int]], bool]:
    """The scenarios whose shortest request needs more than ``max_model_len`` tokens, with that need,
    and whether that is every scenario (no request of the profile can fit)."""
    over: list[tuple[str, int]] = []
    for sc in profile.scenarios:
        if sc.api is None and profile.api in ("embeddings", "rerank"):
            continue
        need = shortest_request(sc)
        if need is not None and need > max_model_len:
            over.append((sc.name, need))
    return over, bool(over) and len(over) == len(profile.scenarios)
