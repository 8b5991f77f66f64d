"""Which token count the figures use: the server's usage when it sends one, the client tokenizer
otherwise, and a loud warning (console, run.json) when that tokenizer is only a guess."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import models, pre_tokenizers, trainers

from loadtest.client.record import RequestRecord, line_input_tokens, line_output_tokens
from loadtest.contracts.record_line import to_dict
from loadtest.metrics.judged_scan import JudgingScan
from loadtest.metrics.recorder import Recorder
from loadtest.metrics.slo import parse_slos
from loadtest.metrics.summary import build_metrics
from loadtest.sim import SimProcess
from loadtest.workload.text import WORDS
from tests.conftest import read_lines, run_cli, write_profile

MS = 1_000_000


def record(
    i: int, client: int, server: int | None, prompt_client: int = 50, prompt_server: int | None = None
) -> RequestRecord:
    """An ok streamed request: TTFT 100 ms, then ``client`` chunks 10 ms apart."""
    t0 = (i + 1) * 1000 * MS
    chunks = [t0 + 100 * MS + k * 10 * MS for k in range(client)]
    return RequestRecord(
        request_id=str(i),
        scheduled_epoch=1_700_000_000 + i,
        scheduled_ns=t0,
        sent_ns=t0,
        first_token_ns=chunks[0],
        first_answer_ns=chunks[0],
        chunk_ns=chunks,
        done_ns=chunks[-1],
        outcome="ok",
        completion_tokens_client=client,
        completion_tokens_server=server,
        prompt_tokens_client=prompt_client,
        prompt_tokens_server=prompt_server,
    )


def test_server_usage_is_the_count_and_the_client_count_the_fallback() -> None:
    with_usage = record(0, client=41, server=51, prompt_server=60)
    assert with_usage.output_tokens == 51 and with_usage.input_tokens == 60
    assert with_usage.tpot_us() == pytest.approx(400_000 / 50)  # 400 ms over 50 more tokens
    without = record(1, client=41, server=None)
    assert without.output_tokens == 41 and without.input_tokens == 50
    assert without.tpot_us() == pytest.approx(400_000 / 40)
    assert record(2, client=5, server=0).output_tokens == 0  # the server's word, even when it is 0
    line = with_usage.to_log()
    assert line.output_tokens == 41 and line.usage_completion_tokens == 51  # both kept
    assert line_output_tokens(line) == 51 and line_input_tokens(line) == 60
    assert line_output_tokens(to_dict(line)) == 51 and line_input_tokens(to_dict(line)) == 60
    assert line.tpot_us == pytest.approx(8000.0)
    assert line_output_tokens(without.to_log()) == 41 and line_input_tokens(without.to_log()) == 50


@pytest.mark.parametrize(
    ("servers", "counted_by"),
    [([51, 61, 71], "server_usage"), ([51, None, 71], "mixed"), ([None, None, None], "client_tokenizer")],
)
def test_throughput_and_tpot_count_usage_and_keep_the_client_count(
    servers: list[int | None], counted_by: str
) -> None:
    rec = Recorder()
    recs = [record(i, client=41, server=s) for i, s in enumerate(servers)]
    for r in recs:
        rec.add(r)
    m = build_metrics(rec.total)
    tok = m["tokens"]
    counted = sum(s if s is not None else 41 for s in servers)
    assert tok["counted_by"] == counted_by
    assert tok["counted_output_total"] == counted and tok["output_total"] == 3 * 41  # the cross-check
    assert m["throughput"]["output_tokens_per_s"] == pytest.approx(
        counted / m["window"]["duration_s"], rel=1e-3
    )
    assert sum(m["series"]["output_tokens"]) == counted
    assert tok["mismatched_requests"] == sum(s is not None for s in servers)
    tpots = sorted(400_000 / ((s if s is not None else 41) - 1) for s in servers)
    assert m["latency_ms"]["tpot"]["p50"] == pytest.approx(tpots[1] / 1000, rel=2e-3)


def test_goodput_counts_the_servers_tokens() -> None:
    lines = [record(i, client=41, server=51).to_log() for i in range(4)]
    scan = JudgingScan(0.0, 0.0, parse_slos("ttft_p99=1s"), per_scenario=False)
    scan.add(lines)
    gp = scan.goodput(scan.window())
    assert gp is not None and gp["good"] == gp["judged"] == 4
    # good tokens per good request: the server's 51, not the client's 41
    assert gp["good_output_tokens_per_s"] / gp["good_requests_per_s"] == pytest.approx(51, rel=1e-3)


@pytest.fixture
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No model is in the Hugging Face cache (the runs below must not find one on this machine)."""
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return hub


def _run(tmp_path: Path, name: str, prof: Path, host: str, *extra: str) -> tuple[dict[str, Any], Any]:
    res = run_cli(["run", "--profile", str(prof), "--host", host, "--out", str(tmp_path / name), *extra])
    assert res.returncode == 0, res.stderr
    return json.loads((tmp_path / name / "run.json").read_text()), res


def test_the_servers_usage_is_the_headline_count(tmp_path: Path, empty_hf_cache: Path) -> None:
    """The client counts with a small tokenizer of its own, the engine with Llama 3's: tokens/s, TPOT
    and the totals follow the server's usage; the client's count stays beside it as the cross-check."""
    folder = tmp_path / "tiny"
    _tiny_tokenizer(folder)
    prof = write_profile(tmp_path / "p.yaml", tokenizer=str(folder), duration_s=2)
    with SimProcess(speedup=8) as sim:
        run, res = _run(tmp_path, "usage", prof, sim.base_url)
    assert "a guess" not in res.stderr
    tok = run["metrics"]["tokens"]
    assert tok["counted_by"] == "server_usage" and tok["usage_reports"] == run["metrics"]["requests"]["ok"]
    assert tok["counted_output_total"] == tok["usage_output_total"] != tok["output_total"]
    assert tok["counted_input_total"] == tok["usage_input_total"]
    assert tok["mismatched_requests"] > 0  # the agreement check still sees the two counts differ
    assert run["tokens"]["counted_by"] == "server_usage" and run["tokens"]["tokenizer"]["source"] == "profile"
    assert run["tokens"]["description"].startswith("server usage (all ")
    whole = run["metrics"]
    assert whole["throughput"]["output_tokens_per_s"] == pytest.approx(
        tok["usage_output_total"] / whole["window"]["duration_s"], rel=1e-3
    )
    lines = read_lines([tmp_path / "usage" / "records.jsonl"])
    assert any(ln["output_tokens"] != ln["usage_completion_tokens"] for ln in lines if ln["outcome"] == "ok")
    for line in lines:
        if line["outcome"] == "ok" and line["usage_completion_tokens"] > 1:
            per_token = (line["e2e_us"] - line["ttft_us"]) / (line["usage_completion_tokens"] - 1)
            assert line["tpot_us"] == pytest.approx(per_token, rel=1e-2)  # µs-rounded times in the log


def test_a_guessed_tokenizer_is_said_at_the_start_and_in_run_json(
    tmp_path: Path, empty_hf_cache: Path
) -> None:
    """cl100k for a Llama 3 model is a guess: the run warns at the start; with the server's usage the
    figures are exact anyway, without it run.json says they rest on the guess."""
    prof = write_profile(tmp_path / "p.yaml", tokenizer="cl100k", duration_s=1.5)
    with SimProcess(speedup=8) as sim:
        run, res = _run(tmp_path, "usage", prof, sim.base_url)
    assert "warning: tokenizer bundled cl100k_base, a guess" in res.stderr
    assert "llama-3.1-8b" in res.stderr.lower() and "--tokenizer" in res.stderr
    assert run["tokens"]["tokenizer"]["guessed"] is True and run["tokens"]["counted_by"] == "server_usage"
    assert not [n for n in run["notes"] if n.startswith("tokens:")]  # usage everywhere: nothing rests on it

    with SimProcess(speedup=8, faults="no_usage=100%") as sim:
        run, res = _run(tmp_path, "no-usage", prof, sim.base_url)
    tok = run["metrics"]["tokens"]
    assert tok["counted_by"] == "client_tokenizer" and tok["usage_reports"] == 0
    assert tok["counted_output_total"] == tok["output_total"] > 0
    assert run["tokens"]["description"] == "client tokenizer cl100k_base (a guess): the server sent no usage"
    notes = [n for n in run["notes"] if n.startswith("tokens:")]
    assert len(notes) == 1 and "a guess" in notes[0] and "--tokenizer" in notes[0]


def _tiny_tokenizer(folder: Path) -> None:
    """A byte-level BPE small enough that the engine's words take several of its tokens."""
    tok = HfTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=100,
        show_progress=False,
        special_tokens=["<unk>", "<s>", "<|end|>", "<|user|>", "<|assistant|>"],
    )
    rng = random.Random(0)
    tok.train_from_iterator([" ".join(rng.choices(WORDS, k=40)) for _ in range(200)], trainer)
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )


def test_a_model_served_from_a_local_folder_brings_its_own_tokenizer(
    tmp_path: Path, empty_hf_cache: Path
) -> None:
    """vLLM / llama.cpp started with --model /path/to/dir serve that path: the run counts with the
    tokenizer.json there and renders chat prompts with its chat_template.jinja."""
    folder = tmp_path / "models" / "tiny-chat"
    _tiny_tokenizer(folder)
    prof = write_profile(tmp_path / "p.yaml", duration_s=1.5)  # the profile says nothing of tokenizers
    with SimProcess(speedup=8, extra_args=["--served-model-name", str(folder)]) as sim:
        run, res = _run(tmp_path, "local", prof, sim.base_url)
    assert f"tokenizer: {folder}, the model's own (the served model id {folder} is this folder)" in res.stdout
    assert "a guess" not in res.stderr
    assert run["config"]["tokenizer"] == str(folder) and run["config"]["model"] == str(folder)
    t = run["tokens"]["tokenizer"]
    assert (t["source"], t["guessed"], t["template"]) == ("model_folder", False, "chat_template.jinja")
    from loadtest.tokens.tokenizer import Tokenizer

    tiny = Tokenizer(str(folder))
    lines = read_lines([tmp_path / "local" / "records.jsonl"])
    got = sorted({ln["prompt_tokens"] for ln in lines})
    # The profile's length in the model's own tokens (a coarse tokenizer overshoots by a few); the
    # engine, counting with Llama 3's, sees far fewer.
    assert lines and got[0] >= 64 and got[-1] <= 70, got
    assert all(ln["usage_prompt_tokens"] < 0.8 * ln["prompt_tokens"] for ln in lines if ln["outcome"] == "ok")
    msgs = [{"role": "user", "content": "x"}]
    assert tiny.count_chat(msgs) == len(tiny.encode("<|user|>\nx<|end|>\n<|assistant|>\n"))


def test_token_agreement_compares_input_tokens_too(tmp_path: Path, empty_hf_cache: Path) -> None:
    """cl100k counts prompts differently from the engine's Llama 3 tokenizer: the agreement check counts
    the input disagreements and names them; with the engine's own tokenizer nothing disagrees."""
    wrong = write_profile(tmp_path / "wrong.yaml", tokenizer="cl100k", duration_s=1.5)
    right = write_profile(tmp_path / "right.yaml", tokenizer="llama3", duration_s=1.5)
    with SimProcess(speedup=8) as sim:
        bad, _ = _run(tmp_path, "wrong", wrong, sim.base_url)
        good, _ = _run(tmp_path, "right", right, sim.base_url)
    lines = read_lines([tmp_path / "wrong" / "records.jsonl"])
    ok = [ln for ln in lines if ln["outcome"] == "ok"]
    differ = sum(ln["usage_prompt_tokens"] != ln["prompt_tokens"] for ln in ok)
    tok = bad["metrics"]["tokens"]
    assert differ == len(ok) > 0 and tok["input_mismatched_requests"] == differ
    check = next(c for c in bad["verdict"]["checks"] if c["name"] == "token_agreement")
    assert check["passed"] is False
    # The check judges the judged window (after the warm-up): every request there disagrees on input.
    said = re.search(r"input: (\d+), output: (\d+) of (\d+) requests", check["detail"])
    assert said is not None, check["detail"]
    assert int(said[1]) == int(said[3]) > 0 and int(said[2]) == 0
    assert good["metrics"]["tokens"]["input_mismatched_requests"] == 0
    check = next(c for c in good["verdict"]["checks"] if c["name"] == "token_agreement")
    assert check["passed"] is True and "input: 0, output: 0 of" in check["detail"]
