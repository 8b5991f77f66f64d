"""--seed-set: an MLCommons seed set drives the arrivals (scheduler seed) and the workload (sample-index seed) apart, and is recorded."""

from __future__ import annotations

import hashlib
import json
from itertools import islice
from pathlib import Path

import pytest

from loadtest.client.record import RequestRecord
from loadtest.profile.loader import load_profile
from loadtest.results.mlperf_detail import DETAIL_NAME
from loadtest.results.mlperf_summary import SUMMARY_NAME
from loadtest.workload.builder import Workload
from loadtest.workload.seed_set import SeedSetError, load_seed_set
from tests.conftest import run_cli
from tests.loadgen_summary import parse_summary, read_detail

# LoadGen's mlperf.conf schedule and sample-index seeds (docs/sources.md §1): both above 2^63
SCHED, INDEX = 16159082839903944936, 2747215439041700203
SEEDSET = f"""
cohorts:
  v1.0:
    set1:
      scheduler_rng_seed: {SCHED}
      sample_index_rng_seed: {INDEX}
      model_seed: 42
    set2:
      scheduler_rng_seed: 7
      sample_index_rng_seed: 8
      model_seed: 9
  solo:
    only:
      scheduler_rng_seed: 1
      sample_index_rng_seed: 2
      model_seed: 3
"""


@pytest.fixture
def seedset(tmp_path: Path) -> Path:
    path = tmp_path / "seedset.yaml"
    path.write_text(SEEDSET)
    return path


def test_selection_and_record(seedset: Path) -> None:
    s = load_seed_set(f"{seedset}:v1.0:set1")
    assert (s.scheduler_rng_seed, s.sample_index_rng_seed, s.model_seed) == (SCHED, INDEX, 42)
    assert s.sha256 == hashlib.sha256(seedset.read_bytes()).hexdigest()
    assert (s.cohort, s.set) == ("v1.0", "set1")
    assert load_seed_set(f"{seedset}:solo").set == "only"  # a cohort of one set needs no SET


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("{f}", ["FILE.yaml:COHORT[:SET]"]),
        ("{f}:v2", ["no cohort 'v2'", "v1.0, solo"]),
        ("{f}:v1.0", ["has sets set1, set2", ":v1.0:SET"]),
        ("{f}:v1.0:set9", ["no set 'set9'", "set1, set2"]),
        ("{d}/missing.yaml:v1.0", ["missing.yaml", "cannot read it"]),
    ],
)
def test_bad_selections_say_what_to_do(seedset: Path, spec: str, words: list[str]) -> None:
    with pytest.raises(SeedSetError) as e:
        load_seed_set(spec.format(f=seedset, d=seedset.parent))
    assert all(w in str(e.value) for w in words), str(e.value)
    assert "\n" not in str(e.value)


def test_bad_values_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("cohorts: {c: {s: {scheduler_rng_seed: -1, sample_index_rng_seed: 2, model_seed: 3}}}")
    with pytest.raises(SeedSetError, match=r"cohorts\.c\.s\.scheduler_rng_seed: -1 is not a seed"):
        load_seed_set(f"{path}:c")
    path.write_text("cohorts: {c: {s: {scheduler_rng_seed: 1}}}")
    with pytest.raises(SeedSetError, match="missing sample_index_rng_seed, model_seed"):
        load_seed_set(f"{path}:c:s")


def test_schedule_and_samples_follow_their_own_seeds() -> None:
    profile, _ = load_profile("mlperf-llama3.1-8b-server")
    split = Workload(profile, INDEX, run_nonce=1, schedule_seed=SCHED)
    one_index, one_sched = Workload(profile, INDEX, run_nonce=1), Workload(profile, SCHED, run_nonce=1)
    assert list(islice(split.arrival_offsets(), 200)) == list(islice(one_sched.arrival_offsets(), 200))
    assert list(islice(split.arrival_offsets(), 200)) != list(islice(one_index.arrival_offsets(), 200))
    for i in range(20):
        assert split.request(i).body == one_index.request(i).body
    # The model seed goes out as the OpenAI `seed` of chat requests; without one no body carries a seed
    seeded = Workload(profile, INDEX, run_nonce=1, schedule_seed=SCHED, model_seed=42)
    assert seeded.request(0).body["seed"] == 42 and "seed" not in split.request(0).body
    as_messages = Workload(profile.model_copy(update={"api": "messages"}), INDEX, run_nonce=1, model_seed=42)
    assert "seed" not in as_messages.request(0).body
    # and of every turn of a multi-turn chat and an agent session
    for name in ("chat-agent-mix", "long-context-agent"):
        sessions = Workload(load_profile(name)[0], 3, run_nonce=1, model_seed=42)
        for i in range(6):
            unit, last, turns = sessions.unit(i), None, 0
            while turns < 3 and (step := unit.next(last)) is not None:
                assert step.request.body["seed"] == 42, (name, i, turns)
                last, turns = RequestRecord(request_id="r", outcome="ok", answer_text="Noted."), turns + 1
    # Without a seed set nothing moves: the one seed drives both, the fingerprint is the sample seed's
    assert split.fingerprint() == one_index.fingerprint()
    plain = Workload(profile, 42, run_nonce=1)
    assert plain.schedule_seed == 42
    assert list(islice(plain.arrival_offsets(), 50)) == list(
        islice(Workload(profile, 42).arrival_offsets(), 50)
    )


def test_run_records_the_set_and_loadgen_files_carry_it(seedset: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["run", "--profile", "mlperf-llama3.1-8b-server", "--duration", "2", "--rate", "5"]
    proc = run_cli([*args, "--seed-set", f"{seedset}:v1.0:set1", "--engine-speedup", "50", "--out", str(out)])
    assert proc.returncode in (0, 10, 11), proc.stderr[-2000:]
    cfg = json.loads((out / "run.json").read_text())["config"]
    assert cfg["seed"] == INDEX
    assert cfg["seed_set"] == {
        "file": str(seedset.resolve()),
        "sha256": hashlib.sha256(seedset.read_bytes()).hexdigest(),
        "cohort": "v1.0",
        "set": "set1",
        "scheduler_rng_seed": SCHED,
        "sample_index_rng_seed": INDEX,
        "model_seed": 42,
    }
    summary = parse_summary((out / SUMMARY_NAME).read_text())
    params = summary.params
    assert "model_seed : 42" in summary.rest
    assert (
        f"seed_set : seedset.yaml cohort v1.0 set set1 (sha256 {cfg['seed_set']['sha256']})" in summary.rest
    )
    assert params["schedule_rng_seed"] == str(SCHED) and params["sample_index_rng_seed"] == str(INDEX)
    records = [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines() if ln]
    assert records and all(r["outcome"] == "ok" for r in records)  # bodies with `seed` were answered
    detail = {m["key"]: m["value"] for m in read_detail((out / DETAIL_NAME).read_text())}
    assert (
        detail["effective_schedule_rng_seed"] == SCHED and detail["effective_sample_index_rng_seed"] == INDEX
    )


def test_seed_and_seed_set_together_is_a_usage_error(seedset: Path, tmp_path: Path) -> None:
    args = ["run", "--profile", "mlperf-llama3.1-8b-server", "--duration", "1", "--out", str(tmp_path / "r")]
    proc = run_cli([*args, "--seed", "5", "--seed-set", f"{seedset}:v1.0:set1"])
    assert proc.returncode == 2 and "--seed and --seed-set" in proc.stderr
    proc = run_cli([*args, "--seed-set", f"{seedset}:v1.0"])
    assert proc.returncode == 2 and "has sets set1, set2" in proc.stderr and str(seedset) in proc.stderr
