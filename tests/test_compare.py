"""`loadtest compare`: H100 against H200, workload refusal, token normalization, sweeps, headless chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadtest.cli.main import main
from loadtest.compare import stats
from loadtest.compare.workload import differences
from loadtest.contracts.run_document import read_run_document
from loadtest.contracts.sweep_document import (
    SCHEMA_VERSION,
    SweepDocument,
    SweepEndpoint,
    SweepPoint,
    write_sweep_document,
)
from loadtest.report.compare_report import CHANGE_COLOURS
from loadtest.sweep.model import point_entry
from tests.browser import ARTIFACTS, CHROMIUM, open_in_chromium
from tests.conftest import CLI, byte_level_tokenizer, run_cli, write_profile

# The engine's own clock (no speed-up): an H100 decode step of Llama 3.1 8B lasts about 5 ms and an H200's
# 3.4 ms, so a busy machine's scheduling delays (a millisecond or two) cannot hide the difference.
SPEEDUP = "1"


def _start(prof: Path, out: Path, gpu: str, *extra: str, concurrency: int = 8, duration: str = "4") -> Any:
    args = ["run", "--profile", str(prof), "--concurrency", str(concurrency), "--duration", duration]
    args += ["--engine-gpu", gpu, "--engine-speedup", SPEEDUP, "--out", str(out), *extra]
    return subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_together(runs: dict[str, tuple[Any, ...]]) -> dict[str, Path]:
    """Start the runs at once (they share whatever load the machine has), wait, and check each."""
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for key, (prof, out, gpu, extra, kw) in runs.items():
            procs[key] = _start(prof, out, gpu, *extra, **kw)
        for key, p in procs.items():
            stdout, stderr = p.communicate(timeout=180)
            assert p.returncode == 0, (key, stdout[-2000:], stderr[-2000:])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return {key: r[1] for key, r in runs.items()}


def _verbose_tokenizer(path: Path) -> Path:
    """A byte-level tokenizer with no merges: one token per character, about 4× llama3's count."""
    return byte_level_tokenizer(path)


def _point(i: int, conc: int, run_dir: Path, root: Path) -> SweepPoint:
    """The sweep.json entry `loadtest sweep` writes for a point run in ``run_dir``."""
    run = read_run_document(run_dir)
    rel = str(run_dir.relative_to(root))
    exit_code = run.verdict.exit_code if run.verdict else None
    return point_entry(
        i, f"c={conc}", conc, None, rel_dir=rel, status=run.status, exit_code=exit_code, run=run
    )


def _write_sweep(root: Path, points: list[tuple[int, Path]], knee: int | None, best: int | None) -> Path:
    """A sweep folder by the sweep.json contract, over run folders made by real `loadtest run`s."""
    first = read_run_document(points[0][1])
    doc = SweepDocument(
        schema_version=SCHEMA_VERSION,
        kind="sweep",
        mode="concurrency",
        status="completed",
        interrupted_reason=None,
        created=first.created,
        tool={"name": first.tool.name, "version": first.tool.version},
        profile=first.config.profile,
        profile_path=first.config.profile_path or "",
        seed=first.config.seed,
        fingerprint=first.workload.fingerprint,
        endpoint=SweepEndpoint(
            url=first.endpoint.url, embedded=first.endpoint.embedded, engine=first.endpoint.engine
        ),
        slo={},
        point_duration_s=first.config.duration_s,
        offline_concurrency=None,
        stop_at_saturation=False,
        points=[_point(i, c, d, root) for i, (c, d) in enumerate(points)],
        knee=knee,
        best_under_slo=best,
        stopped_because=None,
    )
    write_sweep_document(root, doc)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    # Answers long enough that decode steps (where the GPUs differ) dominate each request's time.
    prof = write_profile(root / "chat.yaml", output_tokens={"dist": "uniform", "min": 32, "max": 64})
    verbose = _verbose_tokenizer(root / "verbose-tokenizer.json")
    sa, sb = root / "sweep-h100", root / "sweep-h200"
    # The two runs whose numbers are compared start together (and alone), so machine load falls on both
    # sides alike; long enough that each of the throughput's batch-means batches holds a few dozen answers.
    long = {"duration": "8"}
    out = _run_together(
        {
            "h100": (prof, sa / "c8", "H100-SXM", (), long),
            "h200": (prof, sb / "c8", "H200", (), long),
        }
    )
    short = {"concurrency": 2, "duration": "1"}
    out |= _run_together(
        {
            "verbose": (prof, root / "verbose", "H100-SXM", ("--tokenizer", str(verbose)), {}),
            "h100_c2": (prof, sa / "c2", "H100-SXM", (), short),
            "h200_c2": (prof, sb / "c2", "H200", (), short),
            "seed2": (prof, root / "seed2", "H100-SXM", ("--seed", "2"), {"duration": "1"}),
        }
    )
    out["sweep_a"] = _write_sweep(sa, [(2, out["h100_c2"]), (8, out["h100"])], knee=1, best=None)
    out["sweep_b"] = _write_sweep(sb, [(2, out["h200_c2"]), (8, out["h200"])], knee=1, best=1)
    out["root"] = root
    return out


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["compare", *args], timeout=120)


def _rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in doc["metrics"]}


def test_h200_beats_h100_with_significant_deltas(runs: dict[str, Path], tmp_path: Path) -> None:
    r = _compare(str(runs["h100"]), str(runs["h200"]), "--names", "H100,H200", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "H200 vs H100" in r.stdout
    # The console line says which way each change goes: H200's higher throughput is better.
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("H200 vs H100 (baseline): better on "))
    assert re.search(r"Output tokens/s \+\d+\.\d % \(better\)", line), line
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert doc["workload"]["same"] and not doc["workload"]["allowed_different"]
    rows = _rows(doc)
    # H200 has 4.8 TB/s of HBM against 3.35: decode steps are shorter, so more tokens/s at equal concurrency.
    for key, sign in (("output_tps", +1), ("tps_per_user", +1), ("tpot_p50", -1), ("itl_p50", -1)):
        d = rows[key]["deltas"][1]
        assert d["abs"] * sign > 0, (key, d)
        assert d["significant"] and d["better"], (key, d)
        lo, hi = d["abs_ci"]
        assert lo <= d["abs"] <= hi
    # Each value's interval contains the value, and the baseline's matches its run.json within HDR precision.
    for row in rows.values():
        for v in row["values"]:
            if v is not None:
                assert v["ci_lo"] <= v["value"] <= v["ci_hi"], row["key"]
    # compared over the judged window (by default the warm-up is left out)
    h100 = read_run_document(runs["h100"]).judged_metrics()
    tpot = h100.latency_ms["tpot"].p50
    assert rows["tpot_p50"]["values"][0]["value"] == pytest.approx(tpot, rel=0.02, abs=0.01)
    assert rows["output_tps"]["values"][0]["value"] == pytest.approx(
        h100.throughput.output_tokens_per_s, rel=0.02
    )
    html = (tmp_path / "compare.html").read_text()
    assert "Verdicts" in html and "Deltas against H100" in html and "PASS" in html
    assert not doc["tokens"]["active"]


def test_different_workloads_refused_then_allowed_loudly(runs: dict[str, Path], tmp_path: Path) -> None:
    a, b = str(runs["h100"]), str(runs["seed2"])
    r = _compare(a, b, "--out", str(tmp_path / "refused"))
    assert r.returncode == 3
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    # One readable sentence: who differs and in what, what to do; no raw JSON, nothing cut.
    line = lines[0]
    assert "differ in seed 1 vs 2" in line and line.endswith("or pass --allow-different-workloads"), line
    assert "{" not in line and "..." not in line, line
    assert not (tmp_path / "refused").exists()

    r = _compare(a, b, "--allow-different-workloads", "--out", str(tmp_path / "allowed.html"))
    assert r.returncode == 0, r.stderr
    assert "WARNING: different workloads" in r.stderr
    html = (tmp_path / "allowed.html").read_text()
    assert "DIFFERENT WORKLOADS" in html
    banner = html[html.index("DIFFERENT WORKLOADS") : html.index("</div>", html.index("DIFFERENT WORKLOADS"))]
    assert "differ in seed 1 vs 2" in banner and "{" not in banner  # the same words as the console's
    doc = json.loads((tmp_path / "allowed.json").read_text())
    assert doc["workload"]["allowed_different"] and not doc["workload"]["same"]


def test_two_load_levels_of_one_workload_are_compared_with_a_note(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """c2 against c8 of the same profile and seed: the same requests at two loads. Compared without the
    flag; one line on stderr and a banner say that what differs is the load."""
    r = _compare(str(runs["h100_c2"]), str(runs["h100"]), "--names", "c2,c8", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("loadtest compare: note:")]
    assert len(notes) == 1 and "WARNING" not in r.stderr, r.stderr
    assert "c2 and c8 differ only in load (concurrency 2 vs 8)" in notes[0] and "{" not in notes[0]
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert doc["workload"]["same"] and not doc["workload"]["allowed_different"]
    assert doc["workload"]["load_differences"] == [notes[0].split("note: ", 1)[1]]
    html = (tmp_path / "compare.html").read_text()
    assert "Different load: c2 and c8 differ only in load (concurrency 2 vs 8)" in html
    assert "DIFFERENT WORKLOADS" not in html


def test_each_difference_reads_as_words_never_raw_json() -> None:
    """Resolved profiles that differ in nested sections, lists and long texts: each differing setting by
    its path with both values in words; a long text or a section by its size; nothing cut."""
    long_a, long_b = "x" * 300, "y" * 300
    a = {"seed": 1, "load": {"concurrency": 4}, "scenarios": [{"name": "s", "input_tokens": {"value": 64}}]}
    b = {"seed": 2, "load": {"rate": 2.5}, "scenarios": [{"name": "s", "input_tokens": {"value": 128}}]}
    a["system_prompt"], b["system_prompt"], b["extra"] = long_a, long_b, {"k": 1, "j": [1, 2]}
    got = differences(a, b)
    assert got == [
        "extra none vs a section of 2 keys",
        "load.concurrency 4 vs none",
        "load.rate none vs 2.5",
        "scenarios[0].input_tokens.value 64 vs 128",
        "seed 1 vs 2",
        "system_prompt differs (a text of 300 characters on each side)",
    ]
    assert not any("{" in d or "..." in d for d in got)


def test_tokenizers_differ_throughput_is_normalized(runs: dict[str, Path], tmp_path: Path) -> None:
    r = _compare(str(runs["h100"]), str(runs["verbose"]), "--names", "llama3,verbose", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr  # the same profile and seed: not refused
    doc = json.loads((tmp_path / "compare.json").read_text())
    tok = doc["tokens"]
    assert tok["active"] and tok["tokenizers_differ"] and tok["unit"] == "llama3 tokens"
    base, verbose = tok["runs"]
    assert base["factor"] == 1.0 and 0.15 < verbose["factor"] < 0.4
    rows = _rows(doc)
    raw, norm, usage = rows["output_tps"], rows["output_tps_norm"], rows["output_tps_usage"]
    assert norm["values"][1]["value"] == pytest.approx(raw["values"][1]["value"] * verbose["factor"])
    # The engine's own tokens (server usage) are one word each in both runs, so they measure the work
    # done. One character per client token inflates the raw count about 4×; normalized, it is near 1×.
    raw_v, norm_v, usage_v = (row["values"][1]["value"] for row in (raw, norm, usage))
    assert raw["values"][0]["value"] == pytest.approx(usage["values"][0]["value"])  # llama3 = engine's count
    assert raw_v / usage_v > 2.5, raw_v / usage_v
    assert 0.6 < norm_v / usage_v < 1.5, norm_v / usage_v
    html = (tmp_path / "compare.html").read_text()
    assert "Token counts are normalized" in html and "Output tokens/s, normalized" in html


def test_sweeps_overlaid_and_representative_points(runs: dict[str, Path], tmp_path: Path) -> None:
    r = _compare(str(runs["sweep_a"]), str(runs["sweep_b"]), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "compare.json").read_text())
    a, b = doc["sides"]
    assert a["kind"] == b["kind"] == "sweep"
    assert a["sweep"]["compared_point"] == "c=8" and "knee" in a["sweep"]["compared_because"]
    assert b["sweep"]["compared_point"] == "c=8" and "best" in b["sweep"]["compared_because"]
    assert [len(p["points"]) for p in doc["pareto"]] == [2, 2]
    assert doc["pareto"][1]["points"][1]["best"] and doc["pareto"][0]["points"][1]["knee"]
    assert _rows(doc)["tpot_p50"]["deltas"][1]["abs"] < 0
    html = (tmp_path / "compare.html").read_text()
    assert "Pareto: system output tokens/s against tokens/s per user" in html


def test_bad_inputs_are_one_clear_line(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h100, h200 = str(runs["h100"]), str(runs["h200"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-records").mkdir()
    shutil.copy(runs["h100"] / "run.json", tmp_path / "no-records" / "run.json")
    cases = [
        ([h100, str(tmp_path / "missing")], "no such file or folder"),
        ([h100, str(tmp_path / "empty")], "no run.json there"),
        ([h100, str(tmp_path / "no-records")], "no record log"),
        ([h100], "at least two"),
        ([h100, h200, "--names", "only-one"], "one name per path"),
        ([h100, h200, "--baseline", "7"], "--baseline 7"),
    ]
    for args, want in cases:
        assert main(["compare", *args, "--out", str(tmp_path / "out")]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and want in err[0], (args, err)
    assert not (tmp_path / "out").exists()


def test_bootstrap_intervals_cover_and_detect() -> None:
    rng = np.random.default_rng(1)
    same_a = rng.lognormal(3, 0.5, 4000)
    same_b = rng.lognormal(3, 0.5, 4000)
    slower = same_b * 1.1
    pa = stats.percentiles(same_a, (50.0, 90.0), stats.rng_for("a"))
    pb = stats.percentiles(same_b, (50.0, 90.0), stats.rng_for("b"))
    ps = stats.percentiles(slower, (50.0, 90.0), stats.rng_for("s"))
    assert pa and pb and ps
    true_median = float(np.exp(3))
    lo, hi = pa[50.0].ci
    assert lo <= true_median <= hi
    assert not stats.delta(pa[50.0], pb[50.0]).significant
    d = stats.delta(pa[50.0], ps[50.0])
    assert d.significant and d.abs > 0 and 5 < (d.pct or 0) < 15
    # Seeded: the same inputs give the same interval.
    again = stats.percentiles(same_a, (50.0, 90.0), stats.rng_for("a"))
    assert again and again[90.0].ci == pa[90.0].ci
    # Gaps bootstrapped by request: equal to the plain percentile as a point estimate.
    owner = np.repeat(np.arange(400), 10)
    itl = stats.clustered_percentiles(same_a, owner, 400, (50.0,), stats.rng_for("i"))
    assert itl and itl[50.0].value == pa[50.0].value


COMPARE_PROBE = """(() => {
  const h = document.getElementById('headline').getBoundingClientRect();
  const g = document.querySelector('#delta-chart .js-plotly-plot') ||
    [...document.querySelectorAll('.js-plotly-plot')].find(p => (p.layout.title.text || '').startsWith('Change'));
  return {headline: {bottom: h.bottom, text: document.getElementById('headline').innerText},
          deltas: g.data.map(t => ({colors: t.marker.color, words: t.customdata, x: t.x}))};
})()"""


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless chromium")
def test_compare_html_in_headless_chromium(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "report"
    r = _compare(str(runs["sweep_a"]), str(runs["sweep_b"]), "--names", "H100,H200", "--out", str(out))
    assert r.returncode == 0, r.stderr
    html = (out / "compare.html").read_text()
    low = html.lower()
    for bad in ('src="http', "src='http", 'href="http', "href='http", 'src="//', "src='//", 'href="//'):
        assert bad not in low, bad
    shot = ARTIFACTS / "compare.png"
    page = open_in_chromium(
        out / "compare.html", shot, tmp_path / "chromium", expect_plots=5, evaluate=COMPARE_PROBE
    )
    assert page["errors"] == [], page["errors"]
    # The headline on the first screen; the delta bars coloured by what each change means, not by input.
    probe = page["value"]
    assert (
        0 < probe["headline"]["bottom"] < 900
        and "H200 vs H100 (baseline): better on " in probe["headline"]["text"]
    )
    bars = [b for t in probe["deltas"] for b in zip(t["colors"], t["words"], t["x"], strict=True)]
    assert bars and all(c == CHANGE_COLOURS[w] for c, w, _ in bars), bars
    words = {w for _, w, _ in bars}
    assert "better" in words and len({c for c, _, _ in bars}) == len(words)
    # H200's faster decode: throughput up (better) and TPOT down (better), both green.
    doc = json.loads((out / "compare.json").read_text())
    assert sum(1 for _, w, _ in bars if w == "better") >= 2 and doc["baseline"] == 0
    assert [u for u in page["requests"] if not u.startswith("data:")] == [page["url"]]
    assert page["cards"] == 2
    titles = page["titles"]
    for want in ("Pareto", "Change against the baseline", "TTFT", "TPOT and ITL", "E2E"):
        assert any(want in t for t in titles), (want, titles)
    assert page["svgs"] >= 5
    assert shot.stat().st_size > 20_000
