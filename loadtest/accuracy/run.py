"""One accuracy run: every dataset sample sent once (no salt, the benchmark's sampling, whole answers), then scored."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loadtest import __version__
from loadtest.accuracy.benchmarks import Benchmark
from loadtest.accuracy.datasets import Dataset
from loadtest.accuracy.results import AccuracyResult, judge
from loadtest.accuracy.scorers import scorer_for
from loadtest.client.openai import OpenAIClient, PreparedRequest, Timeouts
from loadtest.client.record import RequestRecord
from loadtest.tokens.tokenizer import Tokenizer


@dataclass(frozen=True)
class AccuracyTarget:
    """Where the answers come from: the endpoint, its served model, the key, how many in flight."""

    base_url: str
    model: str | None
    tokenizer: Tokenizer
    api_key: str | None = None
    concurrency: int = 8
    timeouts: Timeouts | None = None


def _request(bench: Benchmark, i: int, prompt: str, tokenizer: Tokenizer) -> PreparedRequest:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": bench.max_tokens,
        "temperature": bench.temperature,
        "top_p": bench.top_p,
    }
    return PreparedRequest(
        request_id=f"accuracy-{i}",
        api="chat",
        body=body,
        prompt_tokens=tokenizer.count(prompt),
        requested_output_tokens=bench.max_tokens,
        scenario="accuracy",
        stream=False,
    )


def collect_answers(
    bench: Benchmark,
    dataset: Dataset,
    target: AccuracyTarget,
    progress: Callable[[int, int], None] | None = None,
) -> list[RequestRecord]:
    """Each sample's record, in dataset order: ``concurrency`` connections, each sample sent once;
    ``progress(done, total)`` after every tenth of the samples."""
    import gevent.pool

    total = len(dataset.samples)
    records: list[RequestRecord | None] = [None] * total
    pending = iter(range(total))
    step = max(1, total // 10)
    done = 0

    def lane(worker: int) -> None:
        nonlocal done
        client = OpenAIClient(
            target.base_url, target.model, target.tokenizer, target.api_key, target.timeouts, worker=worker
        )
        try:
            for i in pending:
                req = _request(bench, i, dataset.samples[i].prompt, target.tokenizer)
                records[i] = client.send(req, time.perf_counter_ns(), time.time())
                done += 1
                if progress is not None and (done % step == 0 or done == total):
                    progress(done, total)
        finally:
            client.close()

    pool = gevent.pool.Pool(max(1, target.concurrency))
    for w in range(min(max(1, target.concurrency), len(dataset.samples))):
        pool.spawn(lane, w)
    pool.join(raise_error=True)
    return [r for r in records if r is not None]


def score_run(bench: Benchmark, dataset: Dataset, records: list[RequestRecord]) -> AccuracyResult:
    """The records' answers scored by the benchmark's scorers and judged against its targets."""
    answers = [r.answer_text if r.outcome == "ok" else "" for r in records]
    references = [s.reference for s in dataset.samples]
    scores: dict[str, float] = {}
    for name in bench.scorers:
        scores.update(scorer_for(name).score(answers, references))
    answered = sum(r.outcome == "ok" for r in records)
    failures = []
    notes = []
    if answered < len(records):  # the endpoint's fault comes first: a score with holes never passes
        outcomes = sorted({r.outcome for r in records if r.outcome != "ok"})
        failures.append(
            f"the endpoint answered {answered} of {len(records)} samples ({', '.join(outcomes)} for the rest)"
        )
        first = next(r for r in records if r.outcome != "ok")
        notes.append(
            f"first sample without an answer: {first.request_id}: {first.outcome} {first.error}".strip()
        )
    failures += judge(bench, scores)
    tokens = [r.completion_tokens_server or r.completion_tokens_client for r in records if r.outcome == "ok"]
    length = "gen_len" in scores
    return AccuracyResult(
        benchmark=bench.name,
        dataset_name=bench.dataset_name,
        dataset_file=str(dataset.path),
        dataset_sha256=dataset.sha256,
        samples=len(records),
        answered=answered,
        scores={k: v for k, v in scores.items() if k in bench.targets},
        targets=dict(bench.targets),
        passed=not failures,
        gen_len=scores.get("gen_len") if length else None,
        gen_len_reference=scores.get("gen_len_reference") if length else None,
        gen_len_tolerance=bench.length_tolerance if length else None,
        tokens_per_sample=round(sum(tokens) / len(tokens), 2) if tokens else None,
        failures=failures,
        notes=notes,
        client=f"loadtest {__version__}",
    )


def reference_answers(dataset: Dataset, path: Path) -> Path:
    """A prompt → reference-answer JSONL file for the embedded engine's reference mode."""
    import json

    with path.open("w", encoding="utf-8") as f:
        for s in dataset.samples:
            f.write(json.dumps({"prompt": s.prompt, "answer": s.reference}) + "\n")
    return path
