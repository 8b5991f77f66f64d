"""Accuracy datasets from local files in their published formats: summaries JSON, QA JSONL or Parquet."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.errors import UsageError

# The QA sets' published column names, first match wins (gpt-oss-120b and deepseek-r1 pickles and
# their JSONL/Parquet exports name them differently).
_QUESTION = ("question", "prompt", "text_input", "problem")
_TRUTH = ("ground_truth", "answer", "gt_output")


@dataclass(frozen=True)
class Sample:
    """One dataset row: the prompt sent and the reference the answer is scored against."""

    prompt: str
    reference: str


@dataclass(frozen=True)
class Dataset:
    """A loaded accuracy dataset and the file it came from."""

    path: Path
    sha256: str
    samples: list[Sample]


class DatasetError(UsageError):
    """A dataset file that cannot be read: names the file, the field and the fix."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _text(row: Any, names: tuple[str, ...], path: Path, i: int, fix: str) -> str:
    value = None
    if isinstance(row, dict):
        value = next((row[n] for n in names if isinstance(row.get(n), str | int | float)), None)
    if value is None or str(value).strip() == "":
        raise DatasetError(f"{path}: row {i}: field {names[0]!r} is missing or empty; {fix}")
    return str(value)


def _summaries(path: Path) -> list[Sample]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: not a JSON file ({e}); give the MLPerf CNN/DailyMail eval JSON") from e
    if not isinstance(rows, list) or not rows:
        raise DatasetError(f"{path}: expected a JSON list of rows with 'input' and 'output'; got none")
    fix = "each row needs the prompt in 'input' and the reference summary in 'output'"
    out = []
    for i, row in enumerate(rows):
        text = _text(row, ("input",), path, i, fix)
        # The reference feeds `input` as it is (the whole prompt, instruction included; `tok_input` is
        # the same text tokenized), and scores against `output`.
        out.append(Sample(text, _text(row, ("output",), path, i, fix)))
    return out


def _qa_rows(path: Path) -> list[Any]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_table(path).to_pylist())
        except (OSError, ValueError) as e:
            raise DatasetError(f"{path}: not a readable Parquet file ({e})") from e
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot read ({e}); give a JSONL or Parquet QA set") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: line {n} is not JSON ({e}); one JSON object per line") from e
    return rows


def _qa(path: Path) -> list[Sample]:
    rows = _qa_rows(path)
    if not rows:
        raise DatasetError(f"{path}: no rows; a QA set needs 'question' and 'ground_truth' per row")
    fix = "each row needs 'question' (or prompt/text_input) and 'ground_truth' (or answer)"
    return [
        Sample(_text(r, _QUESTION, path, i, fix), _text(r, _TRUTH, path, i, fix)) for i, r in enumerate(rows)
    ]


def load_dataset(kind: str, path: Path) -> Dataset:
    """Read ``path`` as a ``summaries`` or ``qa`` dataset; a `DatasetError` names what is wrong."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such file; --accuracy BENCH:FILE names a local dataset file")
    samples = _summaries(path) if kind == "summaries" else _qa(path)
    return Dataset(path=path, sha256=_sha256(path), samples=samples)
