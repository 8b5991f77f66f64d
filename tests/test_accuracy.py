"""Accuracy runs: the scorers against hand-computed values and rouge-score's own example, the dataset
loaders on the shipped samples, bad input named in one line, and the whole path end to end against the
embedded engine (its reference-answer mode passes, its random text fails)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.accuracy.benchmarks import BENCHMARKS, benchmark
from loadtest.accuracy.datasets import DatasetError, load_dataset
from loadtest.accuracy.results import bundle_entry, judge, read_result
from loadtest.accuracy.scorers import SCORERS, scorer_for
from loadtest.accuracy.scorers.exact_match import extract_answer, normalize
from loadtest.errors import EXIT_ACCURACY_FAILED, EXIT_USAGE, UsageError
from tests.conftest import run_cli

DATA = Path(__file__).parent / "data" / "accuracy"
CNN = DATA / "cnn_eval_sample.json"
QA = DATA / "qa_sample.jsonl"


def test_rouge_matches_hand_computed_values() -> None:
    # 6 reference words, 5 predicted, all 5 in the reference: P 1, R 5/6, F 10/11; bigrams 3 of 4 and 5.
    s = scorer_for("rouge").score(["the cat on the mat"], ["the cat sat on the mat"])
    assert s["rouge1"] == pytest.approx(100 * 10 / 11, abs=1e-4)
    assert s["rouge2"] == pytest.approx(100 * 2 / 3, abs=1e-4)
    assert s["rougeL"] == pytest.approx(100 * 10 / 11, abs=1e-4)  # LCS: all 5 words in order
    assert s["rougeLsum"] == pytest.approx(100 * 10 / 11, abs=1e-4)


def test_rouge_matches_the_librarys_own_example() -> None:
    # rouge-score's README: rouge1 F 0.70588, rougeL F 0.58824 for this pair (stemmed).
    s = scorer_for("rouge").score(
        ["The quick brown dog jumps on the log."], ["The quick brown fox jumps over the lazy dog"]
    )
    assert s["rouge1"] == pytest.approx(70.5882, abs=1e-3)
    assert s["rougeL"] == pytest.approx(58.8235, abs=1e-3)


def test_rouge_is_the_mean_over_samples_and_lsum_splits_sentences() -> None:
    one = scorer_for("rouge").score(["a b c", "x y z"], ["a b c", "p q r"])
    assert one["rouge1"] == pytest.approx(50.0)
    # The same sentences in another order: rougeL (one sequence) drops, rougeLsum (per sentence) does not.
    s = scorer_for("rouge").score(
        ["Dogs bark loudly. Cats sleep all day."], ["Cats sleep all day. Dogs bark loudly."]
    )
    assert s["rougeLsum"] == pytest.approx(100.0)
    assert s["rougeL"] < 70.0


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so the total is \\boxed{42}.", "42"),
        ("first \\boxed{1}, then correct: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("The planet nearest the sun is Mercury.\nAnswer: B", "B"),
        ("I think the answer is 1,024 eggs", "1,024"),
        ("We get 12 and then 48 in all", "48"),
        ("B", "B"),
    ],
)
def test_exact_match_extracts_the_final_answer(text: str, answer: str) -> None:
    assert extract_answer(text) == answer


def test_exact_match_normalizes_and_counts() -> None:
    assert normalize("$1,024$") == normalize("1024") == "1024"
    assert normalize("2.0") == normalize("2")
    s = scorer_for("exact_match").score(
        ["\\boxed{42}", "Answer: C", "\\boxed{48.0}", "no idea", "Answer: b"], ["42", "B", "48", "7", "B"]
    )
    assert s == {"exact_match": 60.0}  # 42, 48.0 and b right; C and "no idea" wrong


def test_length_is_judged_within_ten_percent_of_the_reference() -> None:
    bench = benchmark("llama3.1-8b")
    refs = ["x" * 100]
    at_edge = {**{k: 100.0 for k in bench.targets}, **scorer_for("length").score(["y" * 110], refs)}
    assert judge(bench, at_edge) == []
    over = {**{k: 100.0 for k in bench.targets}, **scorer_for("length").score(["y" * 111], refs)}
    assert judge(bench, over) == ["gen_len 111 outside 100 ±10%"]


def test_targets_are_the_published_ones() -> None:
    assert BENCHMARKS["llama3.1-8b"].targets == {
        "rouge1": 38.3914,
        "rouge2": 15.7484,
        "rougeL": 24.2507,
        "rougeLsum": 35.4351,
    }
    assert BENCHMARKS["gpt-oss-120b"].targets == {"exact_match": 82.30}
    assert BENCHMARKS["deepseek-r1"].targets == {"exact_match": 80.54}
    assert set(SCORERS) == {"rouge", "exact_match", "length", "agentic_inference_inline"}
    with pytest.raises(UsageError, match="llama3.1-8b"):
        benchmark("llama-9b")


def test_loaders_read_the_shipped_samples() -> None:
    cnn = load_dataset("summaries", CNN)
    rows = json.loads(CNN.read_text())
    assert len(cnn.samples) == len(rows) == 4
    assert cnn.samples[0].prompt == rows[0]["input"] and cnn.samples[0].prompt.startswith("Summarize")
    assert cnn.samples[0].reference == rows[0]["output"]
    assert len(cnn.sha256) == 64
    jsonl = load_dataset("qa", QA)
    parquet = load_dataset("qa", DATA / "qa_sample.parquet")
    assert [s.reference for s in jsonl.samples] == [s.reference for s in parquet.samples]
    assert jsonl.samples[0].reference == "42" and len(jsonl.samples) == 5


def test_a_missing_field_names_file_field_and_fix(tmp_path: Path) -> None:
    bad = tmp_path / "cnn.json"
    bad.write_text(json.dumps([{"input": "an article", "output": "a summary"}, {"input": "no summary"}]))
    with pytest.raises(DatasetError) as e:
        load_dataset("summaries", bad)
    msg = str(e.value)
    assert str(bad) in msg and "row 1" in msg and "'output'" in msg and "reference summary in 'output'" in msg
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "2+2?"}\n')
    with pytest.raises(DatasetError, match="'ground_truth'"):
        load_dataset("qa", qa)
    res = run_cli(["accuracy", f"llama3.1-8b:{bad}", "-o", str(tmp_path / "run")])
    assert res.returncode == EXIT_USAGE, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "'output'" in lines[0]


def test_unknown_benchmark_and_bad_spec_are_usage_errors(tmp_path: Path) -> None:
    res = run_cli(["accuracy", f"llama-9b:{CNN}", "-o", str(tmp_path)])
    assert res.returncode == EXIT_USAGE and "llama3.1-8b" in res.stderr
    res = run_cli(["accuracy", str(CNN), "-o", str(tmp_path)])
    assert res.returncode == EXIT_USAGE and "BENCH:FILE" in res.stderr
    res = run_cli(["accuracy", f"llama3.1-8b:{CNN}", "--max-tokens", "0", "-o", str(tmp_path)])
    assert res.returncode == EXIT_USAGE and "--max-tokens must be ≥ 1" in res.stderr


def test_the_engine_answering_references_passes(tmp_path: Path) -> None:
    out = tmp_path / "ref"
    res = run_cli(
        ["accuracy", f"llama3.1-8b:{CNN}", "--engine-reference", "--engine-speedup", "20", "-o", str(out)]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout.splitlines()[-2]
    result = read_result(out)
    assert result is not None and result.passed and result.samples == result.answered == 4
    assert result.scores["rouge1"] == pytest.approx(100.0)
    assert (
        result.gen_len
        == result.gen_len_reference
        == sum(len(r["output"]) for r in json.loads(CNN.read_text()))
    )
    entry = bundle_entry(out)
    assert entry is not None
    assert entry["dataset_name"] == "cnn_dailymail::llama3_8b" and entry["num_samples"] == 4
    assert set(entry["score"]) == {"rouge1", "rouge2", "rougel", "rougelsum", "gen_len"}
    assert entry["score"]["rouge1"] == pytest.approx(1.0)  # fractions, as the Endpoints client writes


def test_the_engines_random_text_fails_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "rand"
    res = run_cli(
        ["accuracy", f"deepseek-r1:{QA}", "--engine-speedup", "50", "--max-tokens", "64", "-o", str(out)],
        timeout=240,
    )
    assert res.returncode == EXIT_ACCURACY_FAILED, res.stdout + res.stderr
    line = res.stdout.splitlines()[-2]
    assert "FAIL" in line and "exact_match 0.0000 < 80.5400" in line
    result = read_result(out)
    assert result is not None and not result.passed and result.scores == {"exact_match": 0.0}
    assert result.tokens_per_sample is not None and 0 < result.tokens_per_sample <= 64  # --max-tokens
    entry = bundle_entry(out)
    assert entry is not None and entry["score"] == {"exact_match": 0.0} and entry["status"] == "failed"


def test_bundle_entry_is_none_without_accuracy_json(tmp_path: Path) -> None:
    assert bundle_entry(tmp_path) is None


def test_the_official_checker_reads_the_bundle_entry(tmp_path: Path) -> None:
    checker = pytest.importorskip(
        "submission_checker.models.file.accuracy", reason="endpoints-submission-cli (the official checker)"
    )
    from loadtest.accuracy.results import AccuracyResult, write_result

    result = AccuracyResult(
        benchmark="llama3.1-8b",
        dataset_name="cnn_dailymail::llama3_8b",
        dataset_file="cnn_eval.json",
        dataset_sha256="0" * 64,
        samples=13368,
        answered=13368,
        scores={"rouge1": 38.9, "rouge2": 0.5, "rougeL": 24.6, "rougeLsum": 35.9},
        targets=dict(benchmark("llama3.1-8b").targets),
        passed=False,
        gen_len=8_100_000.0,
    )
    write_result(tmp_path, result)
    parsed = checker.AccuracyResult.model_validate([bundle_entry(tmp_path)])
    scores = parsed.metric_scores()["cnn_dailymail::llama3_8b"]
    # a ROUGE-2 of 0.5 % goes as 0.005: the checker's ×100 for values in [0, 1] gives 0.5 back, not 50
    assert scores["rouge2"] == pytest.approx(0.005) and scores["rouge1"] == pytest.approx(0.389)
    assert scores["gen_len"] == 8_100_000.0 and parsed.accuracy_datasets() == ["cnn_dailymail::llama3_8b"]


def test_the_engines_reference_mode_answers_only_listed_whole_requests(tmp_path: Path) -> None:
    import urllib.request

    from loadtest.sim import SimProcess

    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"prompt": "What is 17 + 25?", "answer": "It is \\boxed{42}."}) + "\n")

    def ask(sim: SimProcess, prompt: str, stream: bool) -> str:
        body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16}
        req = urllib.request.Request(
            f"{sim.base_url}/v1/chat/completions",
            data=json.dumps({**body, "stream": stream}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
        return text if stream else json.loads(text)["choices"][0]["message"]["content"]

    with SimProcess(speedup=50, extra_args=["--reference-answers", str(refs)]) as sim:
        assert ask(sim, "What is 17 + 25?", stream=False) == "It is \\boxed{42}."
        assert "boxed" not in ask(sim, "What is 17 + 25?", stream=True)  # streamed: the engine's own text
        assert "boxed" not in ask(sim, "another prompt", stream=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p"}\n')
    res = run_cli(["serve", "sim", "--reference-answers", str(bad), "--port", "0"], timeout=60)
    assert res.returncode == 2 and "line 1 needs string fields 'prompt' and 'answer'" in res.stderr


def test_ctrl_c_mid_run_writes_no_score_and_says_so(tmp_path: Path) -> None:
    import sys

    from loadtest.errors import EXIT_INTERRUPTED
    from loadtest.sim import SimProcess
    from tests.conftest import interrupt_when

    out = tmp_path / "acc"
    with SimProcess(speedup=0.05) as sim:  # slow enough that every sample is still in flight
        rc, stdout, stderr = interrupt_when(
            [
                sys.executable,
                "-m",
                "loadtest.cli.main",
                "accuracy",
                f"llama3.1-8b:{CNN}",
                "--host",
                sim.base_url,
            ]
            + ["-o", str(out)],
            lambda: sim.stats()["requests_received"] >= 4,
        )
    assert rc == EXIT_INTERRUPTED["SIGINT"], stdout + stderr
    assert "accuracy run interrupted (Ctrl-C)" in stderr and "no accuracy.json written" in stderr
    assert not (out / "accuracy.json").exists()


def test_the_api_key_is_sent_and_never_written(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from loadtest.sim import SimProcess

    key = "sk-accuracy-5ecret-k3y-0123456789"
    env = {**os.environ, "SIM_KEY": key, "ACC_KEY": key}
    with SimProcess(speedup=50, env=env, extra_args=["--api-key-env", "SIM_KEY"]) as sim:
        cmd = [
            sys.executable,
            "-m",
            "loadtest.cli.main",
            "accuracy",
            f"deepseek-r1:{QA}",
            "--host",
            sim.base_url,
        ]
        with_key = subprocess.run(
            [*cmd, "--api-key-env", "ACC_KEY", "-o", str(tmp_path / "k")],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        without = subprocess.run(
            cmd + ["-o", str(tmp_path / "n")], capture_output=True, text=True, timeout=120
        )
    assert with_key.returncode == EXIT_ACCURACY_FAILED, with_key.stdout + with_key.stderr
    result = read_result(tmp_path / "k")
    assert result is not None and result.answered == result.samples == 5  # the key went with every request
    written = "".join(p.read_text() for p in (tmp_path / "k").iterdir())
    assert key[6:18] not in written + with_key.stdout + with_key.stderr
    # without the key the model list is refused: one line, the endpoint's fault, not a score
    assert without.returncode == 1 and "401" in without.stderr, without.stderr
    assert not (tmp_path / "n" / "accuracy.json").exists()


def test_a_sample_the_endpoint_did_not_answer_fails_the_run_first(tmp_path: Path) -> None:
    out = tmp_path / "fault"
    res = run_cli(
        ["accuracy", f"llama3.1-8b:{CNN}", "--engine-reference", "--engine-faults", "http_503=#1"]
        + ["--concurrency", "1", "--engine-speedup", "20", "-o", str(out)]
    )
    assert res.returncode == EXIT_ACCURACY_FAILED, res.stdout + res.stderr
    result = read_result(out)
    assert result is not None and result.answered == 3 and not result.passed
    assert result.failures[0] == "the endpoint answered 3 of 4 samples (http_5xx for the rest)"
    assert "FAIL: the endpoint answered 3 of 4" in res.stdout.splitlines()[-2]
    assert result.notes and "accuracy-0" in result.notes[0] and "503" in result.notes[0]


def test_each_sample_goes_once_with_the_benchmarks_sampling(tmp_path: Path) -> None:
    import hashlib
    import urllib.request

    from loadtest.sim import SimProcess

    with SimProcess(speedup=50) as sim:
        res = run_cli(["accuracy", f"gpt-oss-120b:{QA}", "--host", sim.base_url, "-o", str(tmp_path / "a")])
        with urllib.request.urlopen(f"{sim.base_url}/sim/requests", timeout=10) as r:
            sent = [q for q in json.loads(r.read()) if q["path"] == "/v1/chat/completions"]
    assert res.returncode == EXIT_ACCURACY_FAILED, res.stdout + res.stderr
    questions = [json.loads(line)["question"] for line in QA.read_text().splitlines()]
    digests = sorted(q["messages"][-1]["sha256"] for q in sent)
    assert digests == sorted(hashlib.sha256(t.encode()).hexdigest() for t in questions)  # once each, unsalted
    for q in sent:
        assert q["body"]["temperature"] == 1.0 and q["body"]["top_p"] == 1.0  # gpt-oss-120b's reference
        assert q["body"]["max_tokens"] == 32768 and not q["body"].get("stream")


def test_a_model_the_endpoint_does_not_serve_is_named_with_the_served_ones(tmp_path: Path) -> None:
    from loadtest.sim import SimProcess

    with SimProcess(speedup=50) as sim:
        res = run_cli(
            ["accuracy", f"deepseek-r1:{QA}", "--host", sim.base_url, "-m", "no-such-model"]
            + ["-o", str(tmp_path / "m")]
        )
    assert res.returncode == EXIT_USAGE, res.stdout + res.stderr
    line = res.stderr.strip()
    assert "\n" not in line and "no-such-model" in line and "Llama-3.1-8B" in line
    assert not (tmp_path / "m" / "accuracy.json").exists()
