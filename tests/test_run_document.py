"""run.json and sweep.json as typed documents (loadtest/contracts/): a real run's file and a real sweep's
file keep every key and value through the typed form and back; a version 1 run.json is migrated; a file
with a key the schema does not know, a wrong type or a newer version is refused with the file, the
field and the fix named."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import run_cli, write_profile  # noqa: E402

from loadtest.contracts import run_document as rd  # noqa: E402
from loadtest.contracts import sweep_document as sd  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded run with SLOs (goodput), a warm-up (the judged window) and two scenarios."""
    tmp = tmp_path_factory.mktemp("rundoc")
    prof = write_profile(
        tmp / "p.yaml",
        input_tokens={"dist": "fixed", "value": 64},
        output_tokens={"dist": "uniform", "min": 8, "max": 16},
        load={"concurrency": 4},
        seed=5,
        slos={"ttft_p99": "5s", "tpot_p90": "500ms"},
    )
    out = tmp / "out"
    res = run_cli(
        [
            "run",
            "--profile",
            str(prof),
            "--duration",
            "4",
            "--warmup",
            "1",
            "--engine-speedup",
            "5",
            "--out",
            str(out),
        ]
    )
    assert (out / "run.json").is_file(), res.stdout[-2000:] + res.stderr[-2000:]
    return out


def _raw(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    return data


def test_a_real_run_json_keeps_every_key_and_value_through_the_typed_document(run_dir: Path) -> None:
    raw = _raw(run_dir)
    doc = rd.read_run_document(run_dir)
    assert doc.schema_version == rd.SCHEMA_VERSION == raw["schema_version"]
    assert doc.judged is not None and doc.goodput is not None and doc.verdict is not None
    assert rd.to_data(doc) == raw
    # and the bytes the writer writes decode to the same document
    rd.write_run_document(run_dir.parent, doc)
    assert rd.read_run_document(run_dir.parent) == doc


def test_the_judged_metrics_are_the_windows_when_there_is_one(run_dir: Path) -> None:
    doc = rd.read_run_document(run_dir)
    assert doc.judged is not None
    assert doc.judged_metrics() is doc.judged.metrics
    whole = msgspec.structs.replace(doc, judged=None)
    assert whole.judged_metrics() is doc.metrics


def test_a_version_1_run_json_is_migrated(run_dir: Path) -> None:
    v1 = _raw(run_dir)
    v1["schema_version"] = 1
    del v1["config"]["judging"]["generator_health"]
    doc = rd.from_data(copy.deepcopy(v1), "old/run.json")
    assert doc.schema_version == rd.SCHEMA_VERSION
    assert doc.config.judging is not None and doc.config.judging.generator_health == "fail"
    assert rd.to_data(doc) == {
        **_raw(run_dir),
        "config": {
            **_raw(run_dir)["config"],
            "judging": {**_raw(run_dir)["config"]["judging"], "generator_health": "fail"},
        },
    }


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d["metrics"].update(surprise=1), "unknown field `surprise` - at `$.metrics`"),
        (
            lambda d: d["verdict"].update(exit_code="ten"),
            "Expected `int`, got `str` - at `$.verdict.exit_code`",
        ),
        (lambda d: d.pop("run_id"), "missing required field `run_id`"),
        (
            lambda d: d.update(schema_version=99),
            "schema_version 99 is not one this loadtest reads; read it with a newer loadtest",
        ),
    ],
    ids=["unknown-key", "wrong-type", "missing-key", "newer-version"],
)
def test_a_run_json_that_does_not_fit_names_the_file_and_the_field(
    run_dir: Path, tmp_path: Path, change: Any, says: str
) -> None:
    data = _raw(run_dir)
    change(data)
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(rd.RunDocumentError) as e:
        rd.read_run_document(tmp_path)
    assert str(e.value).startswith(str(tmp_path / "run.json")) and says in str(e.value)


def test_a_run_json_that_is_not_json_is_named(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text("{half")
    with pytest.raises(rd.RunDocumentError, match="run.json: not valid JSON"):
        rd.read_run_document(tmp_path)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sweepdoc")
    prof = write_profile(
        tmp / "p.yaml",
        input_tokens={"dist": "fixed", "value": 32},
        output_tokens={"dist": "fixed", "value": 8},
        load={"concurrency": 2},
        seed=3,
    )
    out = tmp / "sweep"
    res = run_cli(
        [
            "sweep",
            "--profile",
            str(prof),
            "--ladder",
            "concurrency",
            "--points",
            "1,2",
            "--no-offline",
            "--point-duration",
            "2",
            "--engine-speedup",
            "5",
            "--out",
            str(out),
        ]
    )
    assert (out / "sweep.json").is_file(), res.stdout[-2000:] + res.stderr[-2000:]
    return out


def test_a_real_sweep_json_keeps_every_key_and_value_through_the_typed_document(sweep_dir: Path) -> None:
    raw = json.loads((sweep_dir / "sweep.json").read_text())
    doc = sd.read_sweep_document(sweep_dir)
    assert [p.label for p in doc.points] == ["c1", "c2"]
    assert all(p.status == "completed" and p.output_tps for p in doc.points)
    assert msgspec.to_builtins(doc) == raw
    sd.write_sweep_document(sweep_dir.parent, doc)
    assert sd.read_sweep_document(sweep_dir.parent) == doc


def test_a_sweep_json_that_does_not_fit_names_the_file_and_the_field(sweep_dir: Path, tmp_path: Path) -> None:
    raw = json.loads((sweep_dir / "sweep.json").read_text())
    raw["points"][1]["status"] = 3
    (tmp_path / "sweep.json").write_text(json.dumps(raw))
    with pytest.raises(
        sd.SweepFormatError, match=r"sweep.json: Expected `str`, got `int` - at `\$.points\[1\].status`"
    ):
        sd.read_sweep_document(tmp_path)
    raw = json.loads((sweep_dir / "sweep.json").read_text())
    raw["knee"] = 7
    (tmp_path / "sweep.json").write_text(json.dumps(raw))
    with pytest.raises(sd.SweepFormatError, match="'knee' is not a point index"):
        sd.read_sweep_document(tmp_path)
