"""The MLPerf Endpoints reporting window (metrics/window.py): super-passes, status, verdict, bounds."""

from __future__ import annotations

import random

import pytest

from loadtest.contracts.record_line import RecordLine
from loadtest.metrics.window import (
    WindowScan,
    compute_window,
    in_window,
    min_duration_s,
    pettitt,
    super_pass_size,
    trend,
)


def _requests(
    passes: int,
    dataset: int,
    gap_s: float,
    ttft=lambda sp: 100.0,
    tpot=lambda sp: 10.0,
    tokens: int = 50,
    seed: int = 1,
) -> list[tuple[float, float | None, float | None, int]]:
    """``passes`` × ``dataset`` requests issued ``gap_s`` apart; TTFT/TPOT per super-pass with ±2 % noise."""
    rng = random.Random(seed)
    out = []
    for i in range(passes * dataset):
        sp = i // dataset
        out.append(
            (
                1000.0 + i * gap_s,
                ttft(sp) * rng.uniform(0.98, 1.02),
                tpot(sp) * rng.uniform(0.98, 1.02),
                tokens,
            )
        )
    return out


def test_super_pass_size_and_minimum_duration_follow_the_rules() -> None:
    assert super_pass_size(1, 40) == 40
    assert super_pass_size(40, 40) == 40
    assert super_pass_size(41, 40) == 80
    assert super_pass_size(13368 * 2 + 1, 13368) == 3 * 13368
    assert super_pass_size(8, None) == 8
    assert min_duration_s(32) == 600.0
    assert min_duration_s(33) == 1200.0


def test_trend_and_pettitt_see_a_rise_and_a_step_and_not_noise() -> None:
    rng = random.Random(3)
    assert trend([10 + i for i in range(8)]) == "up"
    assert trend([10 - i for i in range(8)]) == "down"
    assert trend([10 * rng.uniform(0.99, 1.01) for _ in range(10)]) == "steady"
    assert trend([1.0, 2.0, 3.0]) == "insufficient"
    cp, significant = pettitt([1.0] * 8 + [2.0] * 8)
    assert (cp, significant) == (8, True)
    assert pettitt([1.0, 2.0] * 4)[1] is False


def test_a_flat_run_is_steady_state_with_the_ramp_cropped_and_the_window_on_issue_time() -> None:
    # 7 passes of 40, one request each 4 s: each super-pass spans 156 s, so 6 post-ramp passes ≈ 940 s
    rows = _requests(7, 40, 4.0, ttft=lambda sp: 400.0 if sp == 0 else 100.0)
    w = compute_window(rows, concurrency=8, dataset_size=40)
    assert w.verdict == "STEADY STATE", w
    assert w.status == "windowable"
    assert w.first_super_pass == 1 and w.passes == 6 and w.super_passes == 7
    assert w.start == 1000.0 + 40 * 4.0 and w.end == 1000.0 + (7 * 40 - 1) * 4.0
    assert w.requests == 240 and w.output_tokens == 240 * 50
    assert w.system_tps == pytest.approx(240 * 50 / (w.end - w.start), rel=1e-3)
    assert w.tps_per_user == pytest.approx(100.0, rel=0.02)


def test_short_runs_get_their_status() -> None:
    assert compute_window(_requests(7, 40, 1.0), 8, 40).status == "insufficient_duration"
    assert compute_window(_requests(4, 40, 10.0), 8, 40).status == "insufficient_passes"
    assert compute_window(_requests(1, 40, 1.0)[:30], 8, 40).status == "partial_dataset"
    # above concurrency 32 the minimum is 1,200 s: the same 940 s window falls short
    assert compute_window(_requests(7, 40, 4.0), 33, 40).status == "insufficient_duration"


def test_a_climbing_run_has_no_steady_state_and_a_step_is_an_anomaly() -> None:
    climbing = compute_window(_requests(10, 40, 4.0, tpot=lambda sp: 10.0 * 1.1**sp), 8, 40)
    assert climbing.verdict == "not found" and climbing.start is None and climbing.reason
    assert climbing.trend["tpot_p50"] == "up"
    step = compute_window(_requests(12, 40, 4.0, tpot=lambda sp: 10.0 if sp < 6 else 14.0), 8, 40)
    assert step.verdict == "anomaly", step
    assert step.level_shift_at == 6 and step.level_shift_pct == pytest.approx(40.0, abs=3.0)
    assert (step.first_super_pass, step.passes) == (1, 5)  # the first plateau is the window


def test_the_scan_reads_record_lines_and_skips_retries() -> None:
    lines = [
        RecordLine(id=str(i), t=1000.0 + i, outcome="ok", ttft_us=100_000, tpot_us=10_000.0, output_tokens=50)
        for i in range(7 * 40)
    ]
    lines.append(RecordLine(id="r", t=1500.0, outcome="ok", ttft_us=1, attempt=1))
    scan = WindowScan()
    scan.add(lines)
    w = scan.window(concurrency=4, dataset_size=40)
    assert w.super_passes == 7 and w.verdict == "STEADY STATE"
    assert in_window(lines[40], w.start, w.end) and not in_window(lines[39], w.start, w.end)
    assert in_window(lines[0], None, None)
