"""The accuracy benchmarks: which scorers each runs and its published targets (docs/sources.md §2)."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadtest.errors import UsageError


@dataclass(frozen=True)
class Benchmark:
    """One accuracy benchmark: its dataset kind, scorers, targets and request parameters."""

    name: str
    dataset_kind: str  # "summaries" (input/output JSON) or "qa" (question/ground_truth)
    dataset_name: str  # the entry's name in the bundle's accuracy_results.json
    scorers: tuple[str, ...]
    # metric -> lowest passing value (percent); "gen_len" is checked as ±10 % of the reference instead
    targets: dict[str, float] = field(default_factory=dict)
    max_tokens: int = 128
    temperature: float = 0.0  # the reference's sampling (docs/sources.md §2)
    top_p: float = 1.0
    length_tolerance: float = 0.10


# llama3.1-8b: ROUGE ≥ 99 % of the FP32 reference; generated length within ±10 % (docs/sources.md §2).
_ROUGE_REF = {"rouge1": 38.7792, "rouge2": 15.9075, "rougeL": 24.4957, "rougeLsum": 35.793}

BENCHMARKS: dict[str, Benchmark] = {
    "llama3.1-8b": Benchmark(
        name="llama3.1-8b",
        dataset_kind="summaries",
        dataset_name="cnn_dailymail::llama3_8b",
        scorers=("rouge", "length"),
        targets={k: round(v * 0.99, 4) for k, v in _ROUGE_REF.items()},
        max_tokens=128,
    ),
    "gpt-oss-120b": Benchmark(
        name="gpt-oss-120b",
        dataset_kind="qa",
        dataset_name="mlperf_gpt_oss_accuracy",  # the checker's name for the 4,395-sample set
        scorers=("exact_match",),
        targets={"exact_match": 82.30},
        max_tokens=32768,  # the reference's accuracy setting (10,240 for performance)
        temperature=1.0,
    ),
    "deepseek-r1": Benchmark(
        name="deepseek-r1",
        dataset_kind="qa",
        dataset_name="mlperf_deepseek_r1_accuracy",
        scorers=("exact_match",),
        targets={"exact_match": 80.54},
        max_tokens=20000,
    ),
}


def benchmark(name: str) -> Benchmark:
    """The benchmark called ``name``, or a usage error listing the known ones."""
    try:
        return BENCHMARKS[name]
    except KeyError:
        known = ", ".join(sorted(BENCHMARKS))
        raise UsageError(f"--accuracy: unknown benchmark {name!r}; use one of {known}") from None
