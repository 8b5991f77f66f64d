"""accuracy.json: one accuracy run's scores against its targets, and its entry in an MLPerf Endpoints bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from loadtest.accuracy.benchmarks import Benchmark

ACCURACY_JSON = "accuracy.json"


class AccuracyResult(msgspec.Struct, forbid_unknown_fields=True):
    """What an accuracy run measured and whether it met its benchmark's targets."""

    benchmark: str
    dataset_name: str  # the name its bundle entry carries (e.g. cnn_dailymail::llama3_8b)
    dataset_file: str
    dataset_sha256: str
    samples: int  # samples sent
    answered: int  # samples with an ok answer (the others score as empty answers)
    scores: dict[str, float]  # metric -> value (percent for ROUGE and exact match)
    targets: dict[str, float]  # metric -> lowest passing value
    passed: bool
    gen_len: float | None = None  # characters generated over all samples (length benchmarks)
    gen_len_reference: float | None = None  # the references' characters
    gen_len_tolerance: float | None = None  # ±share of gen_len_reference allowed
    tokens_per_sample: float | None = None  # mean completion tokens per answered sample
    failures: list[str] = msgspec.field(default_factory=list)  # one line per target missed
    notes: list[str] = msgspec.field(default_factory=list)
    client: str = "loadtest"


def judge(bench: Benchmark, scores: dict[str, float]) -> list[str]:
    """One line per target ``scores`` miss (empty: passed)."""
    missed = [
        f"{metric} {scores.get(metric, 0.0):.4f} < {target:.4f}"
        for metric, target in bench.targets.items()
        if scores.get(metric, 0.0) < target
    ]
    if "gen_len" in scores and "gen_len_reference" in scores:
        ref, tol = scores["gen_len_reference"], bench.length_tolerance
        if not (1 - tol) * ref <= scores["gen_len"] <= (1 + tol) * ref:
            missed.append(f"gen_len {scores['gen_len']:.0f} outside {ref:.0f} ±{tol:.0%}")
    return missed


def summary_line(result: AccuracyResult) -> str:
    """The one line a run prints: each score against its target, then PASS or FAIL."""
    parts = [f"{m} {result.scores.get(m, 0.0):.2f} (≥ {t:.2f})" for m, t in result.targets.items()]
    if result.gen_len is not None and result.gen_len_reference is not None:
        parts.append(
            f"gen_len {result.gen_len:.0f} (ref {result.gen_len_reference:.0f} ±{result.gen_len_tolerance or 0:.0%})"
        )
    verdict = "PASS" if result.passed else "FAIL: " + "; ".join(result.failures)
    return f"accuracy {result.benchmark} on {result.samples} samples: " + ", ".join(parts) + f" — {verdict}"


def write_result(run_dir: Path, result: AccuracyResult) -> Path:
    """``run_dir/accuracy.json``, written whole (a temporary file renamed into place)."""
    path = run_dir / ACCURACY_JSON
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
    tmp.replace(path)
    return path


def read_result(run_dir: Path) -> AccuracyResult | None:
    """The run folder's accuracy.json, or None when it has none."""
    path = run_dir / ACCURACY_JSON
    if not path.is_file():
        return None
    return msgspec.json.decode(path.read_bytes(), type=AccuracyResult)


def bundle_entry(run_dir: Path) -> dict[str, Any] | None:
    """The run's entry for the MLPerf Endpoints bundle's ``accuracy/accuracy_results.json``.

    The official checker's shape (endpoints-submission-cli 1.5.3.0, ``models/file/accuracy.py``):
    ``dataset_name``, ``num_samples``, ``score`` {metric: value}; metric keys in lower case as its
    targets name them (``rouge1``, ``rougel``, ``rougelsum``, ``gen_len``, ``exact_match``). ROUGE and
    exact match go as fractions (0–1), as the Endpoints client writes them: the checker scales a value
    within [0, 1] to percent, so a percentage under 1 would be misread as a passing score.
    """
    result = read_result(run_dir)
    if result is None:
        return None
    score: dict[str, float] = {
        metric.lower(): round(result.scores[metric] / 100.0, 6)
        for metric in result.targets
        if metric in result.scores
    }
    if result.gen_len is not None:
        score["gen_len"] = result.gen_len
    return {
        "dataset_name": result.dataset_name,
        "dataset_type": "accuracy",
        "num_samples": result.samples,
        "score": score,
        "status": "passed" if result.passed else "failed",
        "client": result.client,
    }
