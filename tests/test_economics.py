"""Token economics: per-GPU throughput and cost per million tokens, in runs, sweeps and comparisons."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli, write_profile

from loadtest.contracts.run_document import RunDocument, read_run_document
from loadtest.economics.cost import run_economics
from loadtest.economics.spec import EndpointSpecError, load_endpoint_file
from loadtest.sim import SimProcess
from loadtest.sweep import load_sweep

GPUS, PER_GPU_HOUR = 2, 2.5
PRICE_IN, PRICE_OUT = 0.2, 0.6


def _hand(run: RunDocument) -> tuple[float, float]:
    """(output tok/s, input tok/s) the verdict judged, read straight from run.json (the judged window's
    metrics: by default the warm-up is left out)."""
    thr = run.judged_metrics().throughput
    return thr.output_tokens_per_s, thr.input_tokens_per_s


def test_endpoint_file_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "endpoint.yaml"
    f.write_text("hardware: {gpu_kind: H200, gpu_count: 8}\nprice: {per_gpu_hour: 3.1}\n")
    spec = load_endpoint_file(f)
    assert spec.hardware.gpu_count == 8 and spec.price is not None and spec.price.kind == "gpu_hour"
    f.write_text("hardware: {gpu_kind: H200}\nprice: {per_gpu_hour: 3.1}\n")
    with pytest.raises(EndpointSpecError, match="gpu_count"):
        load_endpoint_file(f)
    f.write_text("price: {per_m_input: 1}\n")
    with pytest.raises(EndpointSpecError, match=r"endpoint\.yaml.*per_m_output"):
        load_endpoint_file(f)
    res = run_cli(["run", "--price-gpu-hour", "2", "--duration", "1", "--out", str(tmp_path / "x")])
    assert res.returncode == 2 and "gpu_count" in res.stderr and "Traceback" not in res.stderr


def test_nothing_shown_without_inputs() -> None:
    run = {"endpoint": {"url": "x"}, "metrics": {"throughput": {"output_tokens_per_s": 10.0}}}
    assert run_economics(run) is None
    run["endpoint"]["hardware"] = {"gpu_kind": "unknown", "gpu_count": None}
    assert run_economics(run) is None


@pytest.fixture(scope="module")
def engine():
    sim = SimProcess(speedup=20, gpu="H200", seed=3)
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()


def test_sweep_with_gpu_price_matches_hand_computation(engine: SimProcess, tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", duration_s=2)
    sweep_dir = tmp_path / "sweep"
    res = run_cli(
        ["sweep", "--profile", str(prof), "--host", engine.base_url, "--points", "1,4", "--no-offline"]
        + [
            "--point-duration",
            "2",
            "--slo",
            "ttft_p50=60s",
            "--no-stop-at-saturation",
            "--out",
            str(sweep_dir),
        ]
        + ["--gpu-kind", "H200", "--gpu-count", str(GPUS), "--price-gpu-hour", str(PER_GPU_HOUR)],
        timeout=240,
    )
    assert (sweep_dir / "sweep.json").is_file(), res.stderr + res.stdout
    sweep = load_sweep(sweep_dir)
    costs = {}
    for p in sweep.points:
        run = read_run_document(sweep_dir / p.dir)
        hw, price, e = run.endpoint.hardware, run.endpoint.price, run.economics
        assert hw is not None and (hw.gpu_kind, hw.gpu_count) == ("H200", GPUS)
        assert price is not None and price["per_gpu_hour"] == PER_GPU_HOUR  # price: a JSON object
        out_tps, in_tps = _hand(run)
        assert out_tps > 0 and e is not None
        assert e.output_tokens_per_s_per_gpu == pytest.approx(out_tps / GPUS, abs=1e-3)
        per_hour = PER_GPU_HOUR * GPUS
        assert e.cost_per_hour == pytest.approx(per_hour)
        assert e.cost_per_m_output == pytest.approx(per_hour / (out_tps * 3600) * 1e6, rel=1e-5)
        assert e.cost_per_m_input == pytest.approx(per_hour / (in_tps * 3600) * 1e6, rel=1e-5)
        blended = per_hour / ((in_tps + out_tps) * 3600) * 1e6
        assert e.cost_per_m_blended == pytest.approx(blended, rel=1e-5)
        costs[p.index] = (p.verdict, e.cost_per_m_output)
        html = (sweep_dir / p.dir / "report.html").read_text()
        assert 'id="cost"' in html and "USD / 1M output tokens" in html and "tok/s/GPU" in html
    passing = {i: c for i, (v, c) in costs.items() if v == "pass"}
    assert passing, costs
    cheapest = min(passing, key=passing.get)
    html = (sweep_dir / "sweep.html").read_text()
    assert "USD / 1M out" in html and "cheapest meeting the SLOs" in html
    from loadtest.economics.sweep import sweep_economics

    assert sweep_economics(sweep_dir)["cheapest_under_slo"] == cheapest

    # A second "vendor": the same workload priced per token; the comparison ranks them by cost.
    run_dir = tmp_path / "vendor-b"
    res = run_cli(
        ["run", "--profile", str(prof), "--host", engine.base_url, "--concurrency", "4", "--duration", "2"]
        + ["--slo", "ttft_p50=60s", "--price-in-per-m", str(PRICE_IN), "--price-out-per-m", str(PRICE_OUT)]
        + ["--out", str(run_dir), "--no-telemetry"],
        timeout=120,
    )
    run = read_run_document(run_dir)
    out_tps, in_tps = _hand(run)
    cost_s = (in_tps * PRICE_IN + out_tps * PRICE_OUT) / 1e6
    assert run.economics is not None
    assert run.economics.cost_per_m_output == pytest.approx(cost_s / out_tps * 1e6, rel=1e-5)
    assert run.economics.output_tokens_per_s_per_gpu is None  # no GPU count given: none shown
    cmp = tmp_path / "cmp"
    res = run_cli(
        ["compare", str(sweep_dir), str(run_dir), "--names", "gpu-hour,per-token", "--out", str(cmp)]
    )
    assert res.returncode == 0, res.stderr
    page = (cmp / "compare.html").read_text()
    assert 'id="cost"' in page and "Cost at equal SLO" in page
    ranked = sorted(
        [("gpu-hour", passing[cheapest]), ("per-token", run.economics.cost_per_m_output)],
        key=lambda x: x[1],
    )
    assert page.index(f"<td>{ranked[0][0]}</td>") < page.index(f"<td>{ranked[1][0]}</td>")
