"""Token units across runs: each tokenizer's characters per token on a reference text, and the factors."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from loadtest.tokens.tokenizer import Tokenizer

# The reference text: ordinary English prose, a little code, numbers and punctuation, the mix an
# assistant's answers tend to have. Each tokenizer's characters-per-token on it sets its factor.
REFERENCE_TEXT = """\
When a team compares two serving stacks, the first question is rarely about peak numbers. It is about
whether the answers arrive quickly enough for the people waiting on them, and whether the system keeps
that promise as more people arrive. A chat assistant that streams its first words within half a second
feels responsive even when the full answer takes several seconds; a batch pipeline that summarizes
documents overnight cares only about how many pages it finishes per hour.

The measurements below follow the same plan for every endpoint. Requests are drawn from one profile
with one seed, so each endpoint sees the same prompts in the same order. The client timestamps every
chunk of every response as it leaves the socket, counts the tokens of the answer, and keeps the record
of each request so that any statistic can be recomputed later. Percentiles come from those records,
not from averages of averages.

Here is a short function that computes a moving average over a list of numbers:

    def moving_average(values: list[float], window: int = 5) -> list[float]:
        if window <= 0:
            raise ValueError("window must be positive")
        out, total = [], 0.0
        for i, v in enumerate(values):
            total += v
            if i >= window:
                total -= values[i - window]
            out.append(total / min(i + 1, window))
        return out

In the first trial, 1,024 requests finished in 61.7 seconds (16.6 requests per second) with a median
time to first token of 182 ms and a 99th percentile of 740 ms. The second trial, on the newer GPUs,
finished 1,024 requests in 44.2 s; its median fell to 131 ms. Costs were $2.49 and $3.10 per hour.

Questions worth asking before trusting any comparison: Were both runs long enough to reach a steady
state? Did either client machine run out of CPU? Did the servers count tokens the same way the client
did? Would the ranking change under a stricter latency objective, say 300 ms at the 90th percentile?
"""


@dataclass(frozen=True)
class TokenUnit:
    """One run's tokenizer and how to express its token counts in the common unit."""

    tokenizer: str
    chars_per_token: float | None  # on REFERENCE_TEXT; None when the tokenizer is not available here
    factor: float | None  # multiply this run's token counts by it to get common-unit tokens


@cache
def chars_per_token(name: str) -> float | None:
    """Characters per token of a tokenizer on the reference text (None if it cannot be loaded here)."""

    try:
        n = Tokenizer(name).count(REFERENCE_TEXT)
    except (ValueError, OSError):
        return None
    return len(REFERENCE_TEXT) / n if n else None


def token_units(tokenizers: list[str], baseline: int) -> list[TokenUnit]:
    """Per run, the factor that turns its token counts into baseline-tokenizer tokens.

    Equal tokenizers get factor 1 exactly (their counts already share a unit); otherwise
    factor = chars/token of the run's tokenizer ÷ chars/token of the baseline's, so a tokenizer that
    needs more tokens for the same text is scaled down.
    """
    base = tokenizers[baseline]
    base_cpt = chars_per_token(base)
    units = []
    for name in tokenizers:
        cpt = chars_per_token(name)
        if name == base:
            factor: float | None = 1.0
        elif cpt is None or base_cpt is None:
            factor = None
        else:
            factor = cpt / base_cpt
        units.append(TokenUnit(name, cpt, factor))
    return units
