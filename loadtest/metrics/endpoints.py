"""The ``endpoints`` metric convention: MLPerf Endpoints v1.0's figures recomputed from record-log lines.

Every figure is the reference client's (docs/sources.md §2; docs/metrics.md, "Conventions"): percentiles
with numpy's ``method="lower"`` (the sorted sample at ⌊(n−1)·p⌋) over a fixed grid, TTFT from issue to the
first output-bearing chunk (judged at P90), TPOT = (complete − first chunk) / the tokens after the first
chunk, output tokens through the model's chat template, ``tps_per_user`` = 1000 / TPOT P90 (ms). LoadGen's
⌊n·p⌋ (the ``loadgen`` convention) stays in results/mlperf_summary; loadtest's own figures in run.json.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadtest.contracts.record_line import RecordLine
from loadtest.metrics.early_stopping import estimate_t

# The metric conventions an output can state (docs/metrics.md, "Conventions").
CONVENTIONS: tuple[str, ...] = ("endpoints", "loadgen", "loadtest")
# The reference client's percentile grid and the keys it writes them under ("99.0", not "99").
PERCENTILES: tuple[float, ...] = (99.9, 99.0, 97.0, 95.0, 90.0, 80.0, 75.0, 50.0, 25.0, 10.0, 5.0, 1.0)
JUDGED_TTFT_PERCENTILE = 90.0  # v1.0 judges TTFT at P90 (v0.7: P95)
TPOT_PERCENTILE = 90.0  # tps_per_user = 1000 / TPOT P90 (ms)
HISTOGRAM_BUCKETS = 30  # the reference client's default
# The finish reasons the reference client counts; any other is "other".
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "tool_calls", "content_filter", "function_call", "other")


def percentile_key(p: float) -> str:
    """A grid point as the reference client keys it: ``str(float(p))`` ("99.9", "90.0")."""
    return str(float(p))


def lower_percentiles(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """The grid's percentiles, numpy ``method="lower"`` (the sorted sample at ⌊(n−1)·p/100⌋)."""
    arr = np.asarray(values, dtype=np.float64)
    got = np.percentile(arr, PERCENTILES, method="lower")
    return {percentile_key(p): float(v) for p, v in zip(PERCENTILES, got, strict=True)}


def histogram(values: np.ndarray) -> dict[str, list[Any]]:
    """The reference client's histogram: ``HISTOGRAM_BUCKETS`` log-spaced buckets over [max(min, 1),
    max(max, 10·low)], values clipped into them; ``buckets`` as [low, high] pairs, ``counts`` beside."""
    low = max(float(values.min()), 1.0)
    high = max(float(values.max()), low * 10.0)
    step = (math.log(high) - math.log(low)) / HISTOGRAM_BUCKETS
    edges = [math.exp(math.log(low) + i * step) for i in range(HISTOGRAM_BUCKETS + 1)]
    counts, _ = np.histogram(np.clip(values, edges[0], edges[-1]), bins=edges)
    return {
        "buckets": [[edges[i], edges[i + 1]] for i in range(HISTOGRAM_BUCKETS)],
        "counts": [int(c) for c in counts],
    }


def early_stopping_percentiles(sorted_values: np.ndarray) -> dict[str, float | None]:
    """The reference client's early-stopping map: for each grid point from the median up, LoadGen's
    estimate (confidence 0.99) sorted[n − t] for the largest t ≥ 1 with n ≥ find_min_passing(t) + t;
    None when n is too small for t = 1."""
    n = len(sorted_values)
    out: dict[str, float | None] = {}
    for p in PERCENTILES:
        if not 50.0 <= p < 100.0:
            continue
        t = estimate_t(n, p / 100) if n else None
        out[percentile_key(p)] = float(sorted_values[n - t]) if t else None
    return out


def stat_block(values: Sequence[float] | np.ndarray, early_stopping: bool = False) -> dict[str, Any]:
    """A Report stat block: total, min, max, median (P50), avg, std_dev (n − 1), percentiles (then the
    early-stopping map, for a latency series), histogram; ``{}`` when there is no value (as the
    reference client writes an empty series)."""
    arr = np.sort(np.asarray(values, dtype=np.float64))
    if arr.size == 0:
        return {"early_stopping_percentiles": early_stopping_percentiles(arr)} if early_stopping else {}
    perc = lower_percentiles(arr)
    integral = bool(np.all(arr == np.round(arr)))

    def num(v: float) -> float | int:
        return int(v) if integral else float(v)

    block: dict[str, Any] = {
        "total": num(float(arr.sum())),
        "min": num(float(arr[0])),
        "max": num(float(arr[-1])),
        "median": perc[percentile_key(50.0)],
        "avg": float(arr.mean()),
        "std_dev": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
        "percentiles": perc,
    }
    if early_stopping:
        block["early_stopping_percentiles"] = early_stopping_percentiles(arr)
    block["histogram"] = histogram(arr)
    return block


def output_tokens(line: RecordLine) -> int:
    """A line's Endpoints output tokens (the reference client's count, made when the answer came), else
    the client tokenizer's count (an older record log); never the server's usage."""
    n = line.templated_output_tokens
    return n if n is not None else line.output_tokens


def tpot_ns(line: RecordLine) -> float | None:
    """v1.0 TPOT of one streamed answer: (complete − first output-bearing chunk) / the tokens of what
    followed that chunk (the line's ``endpoints_tpot_tokens``; an older line's output count less its
    first chunk's tokens, or less 1). None when no token followed the first chunk or the answer was not
    streamed."""
    if not line.stream or line.ttft_us is None or line.e2e_us is None:
        return None
    after = line.tokens_after_first
    if after is None:
        first = line.first_tokens
        after = output_tokens(line) - (1 if first is None else first)
    if after <= 0:
        return None
    return (line.e2e_us - line.ttft_us) * 1000 / after


@dataclass
class UsageAgreement:
    """The Endpoints output count against the server's usage, over the ok answers that carried usage."""

    answers: int = 0
    endpoints_total: int = 0
    usage_total: int = 0
    differing: int = 0
    templated: int = 0  # of the answers, those the line counts the Endpoints way

    def add(self, line: RecordLine) -> None:
        """One line (only an ok answer with usage counts)."""
        usage = line.usage_completion_tokens
        if line.outcome != "ok" or usage is None:
            return
        n = output_tokens(line)
        self.answers += 1
        self.endpoints_total += n
        self.usage_total += usage
        self.differing += n != usage
        self.templated += line.templated_output_tokens is not None

    def to_dict(self) -> dict[str, Any]:
        """run.json ``tokens.endpoints`` and result_summary.json's ``loadtest.usage_disagreement``."""
        return {
            "counted_by": "endpoints"
            if self.answers and self.templated == self.answers
            else "client_tokenizer",
            "answers_with_usage": self.answers,
            "endpoints_output_total": self.endpoints_total,
            "usage_output_total": self.usage_total,
            "differing_answers": self.differing,
            "relative_difference": (
                round((self.endpoints_total - self.usage_total) / self.usage_total, 6)
                if self.usage_total
                else None
            ),
        }


@dataclass
class EndpointsFigures:
    """The ``endpoints`` figures of a set of record-log lines (the judged window's, or the run's)."""

    issued: int = 0
    completed: int = 0
    failed: int = 0
    duration_ns: int | None = None
    ttft_ns: list[float] = field(default_factory=list)
    tpot_ns: list[float] = field(default_factory=list)
    latency_ns: list[float] = field(default_factory=list)
    osl: list[int] = field(default_factory=list)
    isl: list[int] = field(default_factory=list)
    usage: UsageAgreement = field(default_factory=lambda: UsageAgreement())
    finish_reasons: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    templated: int = 0  # completed answers the line counts the Endpoints way
    first_counted: int = 0  # streamed answers whose line holds the tokens after their first chunk

    @property
    def tps(self) -> float | None:
        """Output tokens per second over the duration (system_tps)."""
        return sum(self.osl) / (self.duration_ns / 1e9) if self.duration_ns else None

    @property
    def qps(self) -> float | None:
        return self.completed / (self.duration_ns / 1e9) if self.duration_ns else None

    def percentile_ms(self, series: list[float], p: float) -> float | None:
        """One grid percentile of a ns series, in ms (None without values)."""
        return lower_percentiles(series)[percentile_key(p)] / 1e6 if series else None

    @property
    def tps_per_user(self) -> float | None:
        """1000 / TPOT P90 (ms)."""
        p90 = self.percentile_ms(self.tpot_ns, TPOT_PERCENTILE)
        return 1000 / p90 if p90 else None

    def notes(self) -> list[str]:
        """What the figures could not take as v1.0 says, one sentence each."""
        out: list[str] = []
        if self.completed and self.templated < self.completed:
            out.append(
                f"output tokens of {self.completed - self.templated} of {self.completed} answers counted by the "
                "run's client tokenizer, not as the reference client counts them (the record log predates "
                "the count)"
            )
        streamed = len(self.ttft_ns)
        if streamed and self.first_counted < streamed:
            out.append(
                f"{streamed - self.first_counted} streamed answers do not say their tokens after the first "
                "chunk (an older record log): TPOT takes the output count less the first chunk's tokens"
            )
        return out


def endpoints_figures(
    lines: Iterable[RecordLine], window: tuple[float, float] | None = None
) -> EndpointsFigures:
    """The figures of the lines whose scheduled time is in ``window`` [start, end) (all lines: None).

    Issued: every request that was sent (a request the generator cancelled before sending was never
    issued); completed: ``ok``; failed: the rest of the issued. The duration runs from the first issue
    to the last completion, as the reference client's tracked duration does."""
    f = EndpointsFigures()
    first_t = math.inf
    last_done = -math.inf
    for line in lines:
        if window is not None and not window[0] <= line.t < window[1]:
            continue
        if line.sent_us is None:
            continue
        f.issued += 1
        first_t = min(first_t, line.t)
        if line.e2e_us is not None:
            last_done = max(last_done, line.t + line.e2e_us / 1e6)
        if line.outcome != "ok":
            f.failed += 1
            continue
        f.completed += 1
        n = output_tokens(line)
        f.osl.append(n)
        f.templated += line.templated_output_tokens is not None
        f.isl.append(line.prompt_tokens)
        f.usage.add(line)
        reason = line.finish_reason if line.finish_reason in FINISH_REASONS else "other"
        f.finish_reasons[reason] += 1
        if line.e2e_us is not None:
            f.latency_ns.append(line.e2e_us * 1000)
        if line.stream and line.ttft_us is not None:
            f.ttft_ns.append(line.ttft_us * 1000)
            f.first_counted += line.tokens_after_first is not None
            tp = tpot_ns(line)
            if tp is not None:
                f.tpot_ns.append(tp)
    if f.issued and last_done > first_t:
        f.duration_ns = round((last_done - first_t) * 1e9)
    return f


def summary_metrics(f: EndpointsFigures) -> dict[str, Any]:
    """The Report fields the figures give: counts, duration, qps, tps (and ``system_tps``), tps_per_user,
    the ttft / tpot / latency / sequence-length stat blocks and the finish reasons."""
    return {
        "n_samples_issued": f.issued,
        "n_samples_completed": f.completed,
        "n_samples_failed": f.failed,
        "duration_ns": f.duration_ns,
        "qps": f.qps,
        "tps": f.tps,
        "system_tps": f.tps,
        "tps_per_user": f.tps_per_user,
        "ttft": stat_block(f.ttft_ns, early_stopping=True),
        "tpot": stat_block(f.tpot_ns, early_stopping=True),
        "latency": stat_block(f.latency_ns, early_stopping=True),
        "output_sequence_lengths": stat_block(f.osl),
        "input_sequence_lengths": stat_block(f.isl),
        "finish_reason_counts": dict(f.finish_reasons),
    }
