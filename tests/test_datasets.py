"""Prompt datasets from files: formats, columns, filters, sampling, output lengths, fingerprints, errors,
and runs against the embedded engine whose request log shows the dataset's own text arrived."""

from __future__ import annotations

import hashlib
import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import read_lines, run_cli, write_profile

from loadtest.contracts.run_document import from_data
from loadtest.metrics.endpoints import summary_metrics
from loadtest.profile.loader import SHIPPED_DIR, ProfileError, parse_profile
from loadtest.report.run_sections import endpoints_window_section
from loadtest.sim import SimProcess
from loadtest.sweep.submission import endpoints_of, result_summary
from loadtest.tokens.tokenizer import get_tokenizer
from loadtest.workload.builder import SessionUnit, SingleUnit, Workload
from loadtest.workload.dataset import DatasetError, conversation_index

DATA = SHIPPED_DIR / "datasets"
SHAREGPT, PARQUET, CHAT_JSONL, CSV = (
    DATA / n for n in ("sharegpt.json", "prompts.parquet", "openai_chat.jsonl", "prompts.csv")
)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _profile(folder: Path, dataset: dict[str, Any], **top: Any) -> Any:
    """A parsed single-scenario dataset profile written as if in ``folder``."""
    return parse_profile({"name": "ds", "seed": 3, "dataset": dataset, **top}, folder / "p.yaml")


def _sharegpt_user_turns() -> list[list[dict[str, str]]]:
    """Each conversation of the sample file as chat messages (roles mapped)."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    convs = json.loads(SHAREGPT.read_text())
    return [[{"role": roles[t["from"]], "content": t["value"]} for t in c["conversations"]] for c in convs]


# ---- reading and shaping ----


def test_sharegpt_conversations_become_sessions_with_the_dataset_history() -> None:
    w = Workload(_profile(DATA, {"path": "sharegpt.json"}))
    convs = _sharegpt_user_turns()
    assert len(w.datasets["ds"].conversations) == len(convs)
    tok = w.tokenizer
    for i, msgs in enumerate(convs):
        unit = w.unit(i)
        users = [k for k, m in enumerate(msgs) if m["role"] == "user"]
        assert isinstance(unit, SessionUnit if len(users) > 1 else SingleUnit)
        for k in users:
            step = unit.next(None) if k == users[0] else unit.next(_ok())
            assert step is not None
            req = step.request
            assert req.body["messages"] == msgs[: k + 1]  # the earlier turns verbatim, then the prompt
            assert req.reference == msgs[k + 1]["content"]  # the next gpt turn
            assert req.requested_output_tokens == req.body["max_tokens"] == tok.count(msgs[k + 1]["content"])
            assert req.prompt_tokens == tok.count_chat(msgs[: k + 1])
        assert unit.next(_ok()) is None
    # cycling: the run needs more units than the file has conversations
    assert w.request(len(convs)).body == w.request(0).body


def _ok() -> Any:
    from loadtest.client.record import RequestRecord

    rec = RequestRecord(request_id="x", scenario="ds")
    rec.outcome, rec.answer_text = "ok", "the server's own answer, not carried"
    return rec


def test_openai_chat_last_user_message_is_the_prompt_earlier_ones_the_history() -> None:
    w = Workload(
        _profile(DATA, {"path": "openai_chat.jsonl", "output_tokens": {"dist": "fixed", "value": 7}})
    )
    lines = [json.loads(x)["messages"] for x in CHAT_JSONL.read_text().splitlines()]
    for i, msgs in enumerate(lines):
        req = w.request(i)
        last_user = max(k for k, m in enumerate(msgs) if m["role"] == "user")
        assert req.body["messages"] == msgs[: last_user + 1]
        assert req.reference == msgs[last_user + 1]["content"]
        assert req.requested_output_tokens == 7 and req.session is None


def test_csv_columns_map_onto_prompt_reference_and_output_tokens() -> None:
    cols = {"question": "prompt", "answer": "reference", "max_out": "output_tokens"}
    w = Workload(_profile(DATA, {"path": "prompts.csv", "columns": cols}))
    import csv

    rows = list(csv.DictReader(CSV.read_text().splitlines()))
    for i, row in enumerate(rows):
        req = w.request(i)
        assert req.body["messages"] == [{"role": "user", "content": row["question"]}]
        assert req.reference == row["answer"] and req.requested_output_tokens == int(row["max_out"])


def test_completions_api_sends_the_prompt_text_and_counts_it_plain() -> None:
    w = Workload(_profile(DATA, {"path": "prompts.parquet"}, api="completions"))
    rows = pq.read_table(PARQUET).to_pylist()
    req = w.request(2)
    assert req.body["prompt"] == rows[2]["prompt"] and "messages" not in req.body
    assert req.prompt_tokens == w.tokenizer.count(rows[2]["prompt"])


def _save_to_disk(folder: Path, table: pa.Table) -> Path:
    """What ``datasets.Dataset.save_to_disk`` writes: Arrow stream files named in state.json."""
    folder.mkdir()
    for n, part in enumerate((table.slice(0, 3), table.slice(3))):
        with pa.ipc.new_stream(folder / f"data-0000{n}-of-00002.arrow", part.schema) as sink:
            sink.write_table(part)
    state = {"_data_files": [{"filename": f"data-0000{n}-of-00002.arrow"} for n in range(2)]}
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "dataset_info.json").write_text("{}")
    return folder


def test_hf_save_to_disk_folder_is_read_with_pyarrow(tmp_path: Path) -> None:
    table = pq.read_table(PARQUET).rename_columns(["text", "reference", "output_tokens"])
    _save_to_disk(tmp_path / "saved", table)
    w = Workload(_profile(tmp_path, {"path": "saved", "columns": {"text": "prompt"}}))
    rows = table.to_pylist()
    assert len(w.datasets["ds"].conversations) == len(rows)
    for i, row in enumerate(rows):  # both Arrow files, in state.json's order
        assert w.request(i).body["messages"][-1]["content"] == row["text"]
        assert w.request(i).requested_output_tokens == row["output_tokens"]


def test_a_dataset_dict_folder_asks_for_one_split(tmp_path: Path) -> None:
    (tmp_path / "dd").mkdir()
    _save_to_disk(tmp_path / "dd" / "train", pq.read_table(PARQUET))
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(
        DatasetError, match=r"scenarios\[0\]\.dataset\.path: .*holds several splits \(train\).*dd/train"
    ):
        Workload(_profile(tmp_path, {"path": "dd"}))
    assert len(Workload(_profile(tmp_path, {"path": "dd/train"})).datasets["ds"].conversations) == 8


def test_token_filters_and_the_seeded_sample() -> None:
    tok = get_tokenizer("llama3")
    rows = pq.read_table(PARQUET).to_pylist()
    counts = [tok.count_chat([{"role": "user", "content": r["prompt"]}]) for r in rows]
    lo, hi = sorted(counts)[2], sorted(counts)[-3]
    w = Workload(_profile(DATA, {"path": "prompts.parquet", "min_input_tokens": lo, "max_input_tokens": hi}))
    kept = [c[0].prompt_tokens for c in w.datasets["ds"].conversations]
    assert kept == [c for c in counts if lo <= c <= hi] and len(kept) < len(counts)

    def drawn(seed: int) -> list[str]:
        ws = Workload(_profile(DATA, {"path": "prompts.parquet", "sample": 4}), seed=seed)
        return [ws.request(i).body["messages"][-1]["content"] for i in range(8)]

    a = drawn(1)
    assert len(set(a)) == 4 and a[:4] == a[4:]  # 4 drawn, cycled
    assert drawn(1) == a and set(drawn(2)) != set(a)  # the seed decides which


def test_fingerprint_follows_the_content_not_the_path(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    copy = shutil.copy(SHAREGPT, tmp_path / "elsewhere" / "renamed.json")
    base = Workload(_profile(DATA, {"path": "sharegpt.json"})).fingerprint()
    assert Workload(_profile(tmp_path, {"path": str(copy)})).fingerprint() == base
    data = json.loads(SHAREGPT.read_text())
    data[-1]["conversations"][-1]["value"] += " One more sentence."  # beyond the first requests' bodies too
    Path(copy).write_text(json.dumps(data))
    assert Workload(_profile(tmp_path, {"path": str(copy)})).fingerprint() != base


# ---- bad input ----


@pytest.mark.parametrize(
    ("dataset", "field", "says"),
    [
        ({"path": "nope.json"}, "dataset.path", "no such file"),
        ({"path": "prompts.parquet", "format": "sharegpt"}, "dataset.columns", "no conversations column"),
        ({"path": "prompts.csv"}, "dataset.columns", "its columns: question, answer, max_out"),
        ({"path": "prompts.parquet", "min_input_tokens": 5000}, "dataset.max_input_tokens", "widen them"),
        (
            {"path": "sharegpt.json", "output_tokens": "dataset"},
            "dataset.output_tokens",
            "no output_tokens column",
        ),
        ({"path": "sharegpt.json", "format": "hf_disk"}, "dataset.format", "is a file"),
    ],
)
def test_bad_datasets_name_the_file_the_field_and_the_fix(
    dataset: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(DatasetError) as e:
        Workload(_profile(DATA, dataset))
    msg = str(e.value)
    assert f"scenarios[0].{field}:" in msg and says in msg and str(DATA / dataset["path"]) in msg, msg


@pytest.mark.parametrize(
    ("scenario", "says"),
    [
        (
            {"dataset": {"path": "x.json", "format": "yaml"}},
            "dataset.format: input should be 'auto', 'sharegpt'",
        ),
        (
            {"dataset": {"path": "x.json"}, "input_tokens": {"dist": "fixed", "value": 8}},
            "input_tokens: a dataset",
        ),
        (
            {"dataset": {"path": "x.json"}, "salt": True},
            "salt: a dataset scenario sends the dataset's prompts",
        ),
        ({"dataset": {"path": "x.json"}, "kind": "multi_turn"}, "kind: a dataset scenario is kind chat"),
        ({"dataset": {"path": "x.json", "columns": {"a": "prompt", "b": "prompt"}}}, "two source columns"),
        (
            {"dataset": {"path": "x.json", "output_tokens": "refrence"}},
            "output_tokens: use dataset, reference or a length",
        ),
        (
            {"dataset": {"path": "x.json", "output_tokens": {"dist": "fixed", "value": -1}}},
            "dataset.output_tokens.value: input should be greater than or equal to 0",
        ),
    ],
)
def test_bad_dataset_specs_are_profile_errors(tmp_path: Path, scenario: dict[str, Any], says: str) -> None:
    with pytest.raises(ProfileError) as e:
        parse_profile({"name": "ds", "scenarios": [{"name": "s", **scenario}]}, tmp_path / "p.yaml")
    assert str(tmp_path / "p.yaml") in str(e.value) and says in str(e.value), str(e.value)


def test_cli_refuses_a_missing_dataset_with_one_line_naming_it(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml", input_tokens=None, output_tokens=None, dataset={"path": "gone.jsonl"}
    )
    text = prof.read_text()
    prof.write_text(json.dumps({k: v for k, v in json.loads(text).items() if v is not None}))
    res = run_cli(["run", "--profile", str(prof), "--out", str(tmp_path / "run"), "--duration", "1"])
    assert res.returncode == 2, res.stderr
    assert f"{prof}: scenarios[0].dataset.path: {tmp_path / 'gone.jsonl'}: no such file" in res.stderr
    bad = run_cli(["profiles", "validate", str(prof)])
    assert bad.returncode == 2 and "scenarios[0].dataset.path" in bad.stderr, bad.stdout + bad.stderr


# ---- runs against the embedded engine ----


@pytest.fixture(scope="module")
def engine():
    with SimProcess(speedup=20, seed=5) as sim:
        yield sim


def _sent(sim: SimProcess) -> dict[str, dict[str, Any]]:
    """The engine's request log by wire id (X-Request-Id)."""
    with urllib.request.urlopen(sim.base_url + "/sim/requests", timeout=10) as r:
        return {item["headers"]["x-request-id"]: item for item in json.loads(r.read())}


def _dataset_run(
    tmp_path: Path, sim: SimProcess, dataset: dict[str, Any], *extra: str, **top: Any
) -> list[dict[str, Any]]:
    """A short run of a dataset profile against ``sim`` (``extra``: more options); its record lines (every one ok)."""
    prof = {"name": "ds", "seed": 3, "duration_s": 2, "load": {"concurrency": 3}, "dataset": dataset, **top}
    prof["judging"] = {"generator_health": "warn"}
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(prof))
    out = tmp_path / "run"
    res = run_cli(
        ["run", "--profile", str(path), "--host", sim.base_url, "--out", str(out), "--no-telemetry", *extra]
    )
    assert res.returncode == 0, res.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["tokens"]["tokenizer"]["name"] == prof.get("tokenizer", "llama3")  # the count under test
    lines = read_lines(sorted(out.glob("records*.jsonl")))
    assert lines and all(x["outcome"] == "ok" for x in lines)
    return lines


def _unit_and_call(record_id: str) -> tuple[int, int]:
    """(unit index, call number from 1) of a record id: ``<seed hex>-<i>`` or a session's ``ds-<i>.<k>``."""
    head, _, call = record_id.partition(".")
    return int(head.rsplit("-", 1)[-1]), int(call or 1)


def test_sharegpt_run_sends_the_dataset_text_and_sessions_with_their_history(
    tmp_path: Path, engine: SimProcess
) -> None:
    shutil.copy(SHAREGPT, tmp_path / "sharegpt.json")
    lines = _dataset_run(tmp_path, engine, {"path": "sharegpt.json", "format": "sharegpt"})
    sent = _sent(engine)
    convs = _sharegpt_user_turns()
    tok = get_tokenizer("llama3")
    multi = 0
    for line in lines:
        index, call = _unit_and_call(line["id"])
        msgs = convs[index % len(convs)]
        k = [k for k, m in enumerate(msgs) if m["role"] == "user"][call - 1]
        got = sent[line["wire_id"]]
        want = [{"role": m["role"], "sha256": _sha(m["content"])} for m in msgs[: k + 1]]
        assert got["messages"] == want, line["id"]  # the prompt and every earlier turn, byte for byte
        assert (
            got["body"]["max_tokens"] == line["requested_output_tokens"] == tok.count(msgs[k + 1]["content"])
        )
        assert line["prompt_tokens"] == line["usage_prompt_tokens"] == tok.count_chat(msgs[: k + 1])
        multi += call > 1
        assert line["scenario"] == "ds"
    assert multi >= 2  # later turns of a session went out, carrying their history
    info = json.loads((tmp_path / "run" / "run.json").read_text())["workload"]["datasets"]
    users = sum(m["role"] == "user" for c in convs for m in c)
    digest = hashlib.sha256(SHAREGPT.read_bytes()).hexdigest()
    assert info == {
        "ds": {"file": "sharegpt.json", "sha256": digest, "rows": 6, "conversations": 6, "requests": users}
    }


@pytest.mark.parametrize("tokenizer", ["llama3", "qwen3"])
def test_parquet_run_lengths_land_on_the_dataset(tmp_path: Path, engine: SimProcess, tokenizer: str) -> None:
    shutil.copy(PARQUET, tmp_path / "prompts.parquet")
    lines = _dataset_run(tmp_path, engine, {"path": "prompts.parquet"}, tokenizer=tokenizer)
    rows = pq.read_table(PARQUET).to_pylist()
    by_text = {_sha(r["prompt"]): r for r in rows}
    tok = get_tokenizer(tokenizer)
    overhead = tok.count_chat([{"role": "user", "content": ""}])
    sent = _sent(engine)
    assert len(lines) >= len(rows)
    for line in lines:
        got = sent[line["wire_id"]]
        assert [m["role"] for m in got["messages"]] == ["user"]
        row = by_text[got["messages"][0]["sha256"]]  # the server got a dataset prompt, unchanged
        assert rows.index(row) == int(line["id"].rsplit("-", 1)[-1]) % len(rows)
        expected = tok.count(row["prompt"]) + overhead
        assert abs(line["prompt_tokens"] - expected) <= 0.01 * expected, (line["prompt_tokens"], expected)
        assert line["requested_output_tokens"] == got["body"]["max_tokens"] == row["output_tokens"]
        assert line["output_tokens"] == row["output_tokens"]  # ignore_eos: the engine wrote all of them


def test_shipped_sharegpt_profile_runs_on_the_embedded_engine(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run_cli(
        ["run", "--profile", "sharegpt-chat", "--duration", "3", "--engine-speedup", "5", "--out", str(out)]
    )
    run = json.loads((out / "run.json").read_text())
    assert res.returncode == 0 == run["verdict"]["exit_code"], res.stderr[-2000:]
    assert run["metrics"]["requests"]["ok"] > 0 and run["metrics"]["requests"]["failed"] == 0
    # The dataset's unsalted prompts repeat within the run: the prefix cache's reuse is expected, not a warning.
    cache = run.get("prefix_cache") or {}
    assert "warning" not in cache and "dataset" in cache.get("expected_reuse", ""), cache


def test_workers_find_a_relative_dataset_path(tmp_path: Path, engine: SimProcess) -> None:
    """--processes 2: each worker's copy of the profile lies elsewhere; the master hands it the path."""
    shutil.copy(PARQUET, tmp_path / "prompts.parquet")
    lines = _dataset_run(tmp_path, engine, {"path": "prompts.parquet"}, "--processes", "2")
    assert {x["worker"] for x in lines} == {0, 1}


def test_dataset_option_replays_a_file_with_any_chat_profile(tmp_path: Path) -> None:
    """`run --dataset FILE`: the file's prompts replace the profile's scenarios, in every worker too."""
    shutil.copy(PARQUET, tmp_path / "prompts.parquet")
    out = tmp_path / "run"
    res = run_cli(
        ["run", "--dataset", str(tmp_path / "prompts.parquet"), "--processes", "2", "--duration", "2"]
        + ["--engine-speedup", "5", "--out", str(out)]
    )
    assert res.returncode == 0, res.stderr[-2000:]
    lines = read_lines(sorted(out.glob("records*.jsonl")))
    assert lines and {x["scenario"] for x in lines} == {"dataset"}
    assert {x["worker"] for x in lines} == {0, 1}
    rows = set(pq.read_table(PARQUET).column("output_tokens").to_pylist())
    assert {x["requested_output_tokens"] for x in lines} <= rows  # each answer's length from its row
    run = json.loads((out / "run.json").read_text())
    assert run["workload"]["datasets"]["dataset"]["file"] == "prompts.parquet"


def test_dataset_option_refuses_a_missing_file_and_a_non_chat_profile(tmp_path: Path) -> None:
    missing = run_cli(["run", "--dataset", str(tmp_path / "nope.json"), "--duration", "1"])
    assert missing.returncode == 2 and "--dataset" in missing.stderr and "nope.json" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    prof = write_profile(tmp_path / "emb.yaml", api="embeddings", output_tokens=None)
    other = run_cli(["run", "--profile", str(prof), "--dataset", str(PARQUET), "--duration", "1"])
    assert other.returncode == 2 and "use a chat profile" in other.stderr, other.stderr


# ---- whole passes, sampled with replacement ----


def _forty_prompts(folder: Path) -> list[str]:
    """A 40-row prompts table (docs/datasets.md), each prompt distinct."""
    prompts = [f"Question {i}: name {i} things you would pack for a trip." for i in range(40)]
    pq.write_table(pa.table({"prompt": prompts, "output_tokens": [8] * 40}), folder / "forty.parquet")
    return prompts


@pytest.mark.parametrize("processes", ["1", "2"])
def test_whole_passes_with_replacement_issue_a_multiple_of_the_dataset_drawn_with_the_seed(
    tmp_path: Path, engine: SimProcess, processes: str
) -> None:
    prompts = _forty_prompts(tmp_path)
    spec = {"path": "forty.parquet", "sampling": "with_replacement", "passes": 2}
    lines = _dataset_run(tmp_path, engine, spec, "--processes", processes, duration_s=120)
    assert len(lines) == 2 * 40  # whole passes, then the run ends (long before its 120 s)
    sent = _sent(engine)
    by_text = {_sha(p): i for i, p in enumerate(prompts)}
    drawn = sorted(by_text[sent[x["wire_id"]]["messages"][0]["sha256"]] for x in lines)
    units = sorted(int(x["id"].rsplit("-", 1)[-1]) for x in lines)
    assert units == list(range(80))
    wl = Workload(_profile(tmp_path, spec), 3)
    expected = sorted(conversation_index(wl.scenarios[0].dataset, 3, "ds", i, 40) for i in range(80))
    assert drawn == expected  # each unit's row is the seeded draw
    assert len(set(drawn)) < 40  # with replacement: some rows twice, some not at all in 80 draws
    assert wl.pass_units == 80
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    window = run["reporting_window"]
    assert window["dataset_size"] == 40 and window["super_pass_size"] == 40 and window["super_passes"] == 2
    assert window["status"] == "insufficient_passes" and window["verdict"] == "not found"
    html = (tmp_path / "run" / run["files"]["report"]).read_text()
    assert "MLPerf Endpoints reporting window" in html and "insufficient_passes" in html
    # result_summary.json takes the window's figures only when it stands, and says which basis it used
    as_run = from_data(run)
    figures = endpoints_of(as_run, tmp_path / "run")
    total = result_summary(as_run, "run", figures)
    assert total["reporting_window"]["basis"] == "total"
    assert total["system_tps"] == summary_metrics(figures)["system_tps"]  # the judged window's figures
    steady = {**window, "status": "windowable", "verdict": "STEADY STATE", "start": 10.0, "end": 20.0}
    standing = from_data({**run, "reporting_window": steady | {"system_tps": 123.5}})
    summary = result_summary(standing, "run", endpoints_of(standing, tmp_path / "run"))
    assert summary["system_tps"] == 123.5 and summary["reporting_window"]["basis"] == "window"
    assert summary["reporting_window"]["start_issue_ns"] == 10_000_000_000
    del run["reporting_window"]  # a run.json written before the window still reads
    old = from_data(run)
    assert old.reporting_window is None and endpoints_window_section(old) is None


def test_cycle_sampling_keeps_file_order_and_passes_need_one_scenario(tmp_path: Path) -> None:
    _forty_prompts(tmp_path)
    wl = Workload(_profile(tmp_path, {"path": "forty.parquet", "passes": 3}), 3)
    assert wl.pass_units == 120
    spec = wl.scenarios[0].dataset
    assert [conversation_index(spec, 3, "ds", i, 40) for i in (0, 39, 40, 81)] == [0, 39, 0, 1]
    two = parse_profile(
        {
            "name": "two",
            "seed": 3,
            "scenarios": [
                {"name": "a", "weight": 1, "dataset": {"path": "forty.parquet", "passes": 1}},
                {"name": "b", "weight": 1, "dataset": {"path": "forty.parquet"}},
            ],
        },
        tmp_path / "p.yaml",
    )
    with pytest.raises(ValueError, match=r"scenarios\[0\]\.dataset\.passes: .*one scenario"):
        Workload(two, 3)
    with pytest.raises(ProfileError, match="passes"):
        _profile(tmp_path, {"path": "forty.parquet", "passes": 0})
