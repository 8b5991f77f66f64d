"""Whether a workload's requests fit the model's context window: prompt plus requested output, sampled before a run."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.workload.builder import Workload

SAMPLE = 200  # first requests of the run checked (a session's first call: later calls only grow)


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


def check_fit(workload: Workload, max_model_len: int, sample: int = SAMPLE) -> ContextFit:
    """Build the first ``sample`` requests and count those that cannot fit ``max_model_len``."""
    over = prompt_over = largest = 0
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
    return ContextFit(max_model_len, n, over, prompt_over, largest)
