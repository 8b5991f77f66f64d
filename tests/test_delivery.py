"""Delivery diagnosis and rate limits as verdict causes (docs/metrics.md "Merged delivery", docs/reliability.md
"Rate limits"): a buffering proxy in front of the embedded engine makes the run not a PASS, its first reason
names the buffering, its ITL and TPOT SLOs are not measurable and the console says so; the same proxy passing
reads on says nothing; an engine that answers 429 to most requests is rate limited, not just failing."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from loadtest.client.record import RequestRecord
from loadtest.metrics import delivery
from loadtest.metrics.recorder import Recorder
from loadtest.metrics.summary import build_metrics
from loadtest.metrics.verdict import (
    MERGED_DELIVERY,
    RATE_LIMITED,
    Check,
    ExtraCheck,
    OfferedLoad,
    ValidityRules,
    headline,
    judge,
)
from loadtest.sim import SimProcess
from tests.buffering_proxy import BufferingProxy
from tests.conftest import read_lines, run_cli, write_profile
from tests.fault_servers import FaultServer, _chunk, _delta, _event
from tests.test_fault_matrix import MODES, finish_run, start_run

SLOS = "ttft_p99=30s,itl_p99=5s,tpot_p99=5s,error_rate=50%"
TOKENS = 32


@pytest.mark.parametrize(
    ("times", "merged"),
    [
        (list(range(0, 80, 10)), False),  # one event per read
        ([0] * 8, True),  # the whole answer in one read
        ([0] * 5 + [10, 20, 30], True),  # the first read held most of it
        ([0, 0, 0, 0, 10, 10, 10, 10], True),  # four events a read on average
        ([0, 10, 10, 10, 20, 30, 40, 50, 60, 70], False),  # one burst: a busy client, not a proxy
        ([0] * 7, None),  # too few events to judge
    ],
)
def test_merged_delivery_counts_events_against_reads(times: list[int], merged: bool | None) -> None:
    assert delivery.merged_delivery(np.asarray(times, dtype=np.int64)) is merged


def _paced(gaps_ms: np.ndarray) -> np.ndarray:
    """Arrival times (ns) of token events separated by ``gaps_ms``."""
    return np.concatenate([[0], np.cumsum(np.round(gaps_ms * 1e6).astype(np.int64))])


@pytest.mark.parametrize("pace_ms", [0.4, 3.6, 25.0])
@pytest.mark.parametrize("seed", range(20))
def test_direct_pacing_with_jitter_is_never_bursts(pace_ms: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 200))
    gaps = pace_ms * np.clip(1 + 0.3 * rng.standard_normal(n), 0.3, None)  # the engine's jitter, measured
    gaps[rng.integers(0, n)] *= 40  # a stall (a long prefill batched in)
    times = _paced(gaps)
    assert delivery.burst_delivery(times) is False
    assert delivery.burst_gap_mask(times).sum() <= n // 10


def test_a_pace_change_is_not_bursts() -> None:
    # measured direct from the embedded engine (a batch draining): 60 ms gaps, then 2.3 ms ones
    times = _paced(np.array([60.5, 59.8, 63.8, 64.0, 36.8] + [2.3] * 10 + [5.4, 2.7]))
    assert delivery.burst_delivery(times) is False


def test_bursts_of_separate_reads_are_flagged() -> None:
    # measured through LiteLLM: a few events 0.2-0.3 ms apart in separate reads, then the next block
    times = _paced(np.array([0.3, 0.3, 0.2, 0.3, 25.0] * 8))
    mask = delivery.burst_gap_mask(times)
    assert delivery.burst_delivery(times) is True
    assert mask.sum() == 4 * 8 and not mask[4::5].any()  # the gaps between blocks are timed


def test_merged_gaps_are_not_burst_gaps() -> None:
    times = _paced(np.array([0.0, 0.0, 0.0, 0.0, 12.0] * 6))  # five events a read: merged delivery
    assert not delivery.burst_gap_mask(times).any()
    assert delivery.burst_delivery(times) is False and delivery.merged_delivery(times) is True
    assert delivery.burst_delivery(times[:7]) is None  # too few events to judge


# Measured through LiteLLM 1.106.12 on a slower 2-core host: blocks re-sent about 0.5 ms an event, close
# to a tenth of the stream's mean gap, and many of them read at once (merged).
SLOW_HOST_BLOCKS = (
    [0.0] * 7 + [0.5, 3.72] + [0.0] * 7 + [1.21, 0.54, 9.1, 0.0, 0.0, 0.0, 0.0, 77.52, 0.55, 0.5]
)
SLOW_HOST_BLOCKS += [0.49, 0.48, 0.48, 1.86, 0.0, 0.0, 0.0, 50.8, 0.82, 0.56, 0.52, 2.67, 0.0, 0.0, 0.0, 66.2]
SLOW_HOST_BLOCKS += [0.47, 0.48, 0.44, 0.5, 0.75, 0.47, 0.86, 32.01, 0.53, 0.52, 0.48, 1.18, 0.52, 0.96]


def test_bursts_partly_read_together_are_flagged() -> None:
    times = _paced(np.array(SLOW_HOST_BLOCKS))
    bursts, merged = delivery.burst_gap_mask(times).sum(), delivery.merged_gap_mask(times).sum()
    assert bursts == 8 and merged == 28  # burst gaps alone: 8 of 28 timed gaps, under 30 %
    assert delivery.merged_delivery(times) is False and delivery.burst_delivery(times) is True
    # merged gaps alone, without a burst gap between separate reads, are not bursts
    merged_only = _paced(np.array([0.0, 25.0, 25.0] * 6))
    assert delivery.burst_delivery(merged_only) is False


def test_a_gateway_catching_up_is_flagged_and_a_slowing_engine_is_not() -> None:
    # Measured through LiteLLM on a slower host: after a long TTFT the gateway re-sends the tokens it held
    # about 0.5 ms apart, then blocks, then the engine's own pace (7 ms a token direct). Against the
    # stream's mean gap (5.1 ms) 5 of its 28 gaps are burst gaps; against the pace after each, 12.
    caught_up = [0.56, 0.53, 0.53, 0.46, 0.48, 0.47, 21.66, 0.53, 0.53, 14.37, 0.52, 0.52, 9.74, 0.48, 9.26]
    caught_up += [0.53, 5.79, 6.79, 5.3, 9.66, 5.32, 10.16, 4.65, 13.64, 7.04, 0.45, 6.02, 6.56]
    times = _paced(np.array(caught_up))
    gaps = np.diff(times)
    assert (gaps < 0.1 * gaps.mean()).sum() == 5  # what the stream's mean alone sees: under 30 %
    mask = delivery.burst_gap_mask(times)
    assert mask[1:6].all() and mask.sum() == 12 and delivery.burst_delivery(times) is True
    # an engine slowing five- or tenfold mid-stream (a long prompt's prefill chunks batched in) is paced
    rng = np.random.default_rng(1)
    jitter = np.clip(1 + 0.3 * rng.standard_normal(60), 0.3, None)
    for slower in (5.0, 10.0):
        assert delivery.burst_delivery(_paced(np.repeat([7.0, 7.0 * slower], 30) * jitter)) is False


def _stream(times: np.ndarray, rid: str = "r") -> RequestRecord:
    return RequestRecord(
        request_id=rid, scenario="s", api="chat", stream=True, scheduled_epoch=1e9, scheduled_ns=1,
        sent_ns=2, first_token_ns=int(times[0]) + 10, done_ns=int(times[-1]) + 10, outcome="ok",
        chunk_ns=(times + 10).tolist(), completion_tokens_client=times.size,
    )  # fmt: skip


@pytest.mark.parametrize("whole", [0, 3, 9])
def test_streams_re_sent_whole_are_told_by_the_runs_other_streams(whole: int) -> None:
    # A gateway that read whole answers re-sends them evenly at its own pace (through LiteLLM: 0.4-0.7 ms
    # a gap against the others' 4-7 ms); each stream alone looks paced, the run's median tells them.
    rng = np.random.default_rng(whole)
    recorder = Recorder()
    for i in range(20):
        pace = 0.5 if i < whole else float(rng.uniform(3.0, 12.0))  # a varied direct pace: never whole
        recorder.add(_stream(_paced(pace * np.clip(1 + 0.3 * rng.standard_normal(40), 0.3, None)), f"r{i}"))
    merged = build_metrics(recorder.total)["itl_merged"]
    assert merged["whole_streams"] == whole and merged["burst_streams"] == whole, merged
    assert merged["streams"] == 20 and merged["burst_gaps"] == 0  # their gaps stay in ITL
    assert (delivery.diagnosis(merged) is not None) == (whole >= 10)


def test_an_overloaded_generator_is_named_before_the_delivery_diagnosis() -> None:
    # a client that falls behind reads events together too: its own overload is the first cause
    m = _metrics(40, 36)
    overloaded = {"schedule_lag_p99_ms": 120.0, "cpu_percent": 99.0, "startup_s": 1.0}
    v = judge(m, None, "itl_p99=50ms", ValidityRules(generator_health="fail"), overloaded)
    assert v.status == "invalid" and "the load generator, not the endpoint" in v.reasons[0], v.reasons
    assert any("fell behind" in r and "during merged delivery: 90 %" in r for r in v.reasons[1:]), v.reasons
    assert headline(v.status, v.checks).startswith("the load generator was overloaded")
    # Judged with a warning only, the generator still read late: the delivery check names it, not a proxy.
    proxy_note = delivery.diagnosis(m["itl_merged"])  # the run's note, written before the verdict
    assert proxy_note is not None
    rules = ValidityRules(generator_health="warn")
    warned = judge(m, None, "itl_p99=50ms", rules, overloaded, notes=[proxy_note])
    assert not any("buffering proxy" in r for r in warned.reasons), warned.reasons
    first = warned.reasons[0]
    assert warned.status == "invalid" and first.startswith(
        "the load generator fell behind (schedule lag p99 120"
    ), first
    assert (
        "during merged delivery: 90 % of 40 streamed requests" in first and "proxy" not in first.split(";")[0]
    )
    assert "not evidence of a proxy" in first and "more --processes" in first  # the fix follows
    assert (
        headline(warned.status, warned.checks)
        == "tokens read merged (the load generator fell behind); itl_p99 not measurable"
    )
    quiet = judge(
        m, None, "itl_p99=50ms", ValidityRules(generator_health="warn"), {"schedule_lag_p99_ms": 2.0}
    )
    assert quiet.reasons[0].startswith("merged delivery: 90 %") and "buffering proxy" in quiet.reasons[0]
    # a replica's errors are a health flag of the endpoint's, not the generator's: the proxy stays the cause
    replica = Check("replica_1_errors", False, "replica 1 failed 9 requests", "health", blocking=False)
    flagged = judge(
        m, None, "itl_p99=50ms", rules, {"schedule_lag_p99_ms": 2.0}, extra_checks=[ExtraCheck(replica, "r1")]
    )
    assert flagged.reasons[0].startswith("merged delivery: 90 %"), flagged.reasons
    assert headline(flagged.status, flagged.checks).startswith("tokens arrived merged (a buffering proxy?)")


def test_a_bursty_stream_leaves_its_burst_gaps_out_of_itl() -> None:
    times = _paced(np.array([0.3, 0.3, 0.2, 0.3, 25.0] * 8))
    recorder = Recorder()
    recorder.add(_stream(times))
    total = recorder.total
    assert total.totals["itl_burst_gaps"] == 32 and total.totals["delivery_burst_streams"] == 1
    assert total.totals["delivery_streams"] == 1 and not total.totals["delivery_merged_streams"]
    itl = total.hists["itl"]
    assert itl.get_total_count() == 8 and itl.get_min_value() > 20_000  # only the 25 ms gaps, in µs


def test_burst_delivery_is_its_own_diagnosis() -> None:
    m = _metrics(40, 2)
    m["itl_merged"] |= {"burst_gaps": 900, "burst_streams": 30}
    v = judge(m, None, "ttft_p99=1s,itl_p99=50ms,tpot_p99=50ms")
    assert v.status == "invalid"
    assert v.reasons[0].startswith("burst delivery: 80 % of 40 streamed requests"), v.reasons[0]
    assert "re-sends the tokens in bursts: ITL times the proxy, not the server" in v.reasons[0]
    by = {c.name: c for c in v.checks}
    assert not by[MERGED_DELIVERY].passed and by[MERGED_DELIVERY].value == pytest.approx(0.8)
    for key in ("itl_p99", "tpot_p99"):
        assert not by[key].passed and "not measurable" in by[key].detail and "bursts" in by[key].detail
    few = {"streams": 40, "merged_streams": 1, "burst_streams": 1}
    assert delivery.diagnosis(few) is None and delivery.diagnosis(few | {"burst_streams": 19}) is not None


def _metrics(streams: int, merged: int, **requests: object) -> dict:
    req = {"ok": 100, "failed": 0, "error_rate": 0.0, "by_outcome": {"ok": 100}, "completed": 100, **requests}
    return {
        "requests": req,
        "window": {"duration_s": 10.0},
        "latency_ms": {},
        "itl_merged": {"gaps": 0, "share": None, "streams": streams, "merged_streams": merged},
    }


def test_merged_delivery_fails_the_verdict_and_itl_tpot_slos_are_not_measurable() -> None:
    v = judge(_metrics(40, 36), None, "ttft_p99=1s,itl_p99=50ms,tpot_p99=50ms")
    assert v.status == "invalid"
    assert v.reasons[0].startswith("merged delivery: 90 % of 40 streamed requests")
    assert "buffering proxy" in v.reasons[0]
    by = {c.name: c for c in v.checks}
    assert not by[MERGED_DELIVERY].passed
    for key in ("itl_p99", "tpot_p99"):
        assert not by[key].passed and by[key].value is None and "not measurable" in by[key].detail
        assert f"early_stopping.{key}" not in by  # no advice to run longer: it can never help
    assert by["ttft_p99"].detail.startswith("no ttft samples")  # judged as ever, not marked
    assert not any("--duration" in r for r in v.reasons if "itl" in r or "tpot" in r)
    assert "tokens arrived merged" in headline(v.status, v.checks)
    assert "itl_p99, tpot_p99 not measurable" in headline(v.status, v.checks)


def test_a_few_merged_streams_are_no_diagnosis() -> None:
    v = judge(_metrics(40, 10), None, "itl_p99=50ms")
    assert MERGED_DELIVERY not in {c.name for c in v.checks}
    assert delivery.diagnosis({"streams": 4, "merged_streams": 2}) is None  # under MIN_STREAMS merged


def test_rate_limited_is_its_own_first_reason() -> None:
    m = _metrics(0, 0, ok=60, failed=40, error_rate=0.4, by_outcome={"ok": 60, "http_429": 40})
    v = judge(m, None, None, load=OfferedLoad(rate=20.0, retries=2))
    assert v.status == "error_rate"
    assert v.reasons[0].startswith("rate limited: 40 % of 100 requests got 429 (Retry-After honoured")
    assert "achieved 6 ok req/s against 20 req/s offered" in v.reasons[0]
    assert headline(v.status, v.checks).startswith("rate limited")
    # Every request refused: rate limited even under an error-rate limit of 100 %.
    every = _metrics(0, 0, ok=0, failed=50, error_rate=1.0, by_outcome={"http_429": 50})
    v = judge(every, None, "error_rate=100%")
    assert v.reasons[0].startswith("rate limited: 100 % of 50 requests got 429 (no retries")
    assert v.reasons[1].startswith("endpoint failing: no successful requests")
    # 429 among many other failures is not the cause: the error rate says it.
    mixed = {"ok": 60, "http_429": 8, "http_5xx": 32}
    v = judge(_metrics(0, 0, ok=60, failed=40, error_rate=0.4, by_outcome=mixed), None, None)
    assert RATE_LIMITED not in {c.name for c in v.checks}
    assert v.reasons[0].startswith("error rate over limit")


def _run_through(
    tmp_path: Path, block: int, mode: str = "single"
) -> tuple[int, str, dict, str, BufferingProxy]:
    prof = write_profile(
        tmp_path / "p.yaml",
        output_tokens={"dist": "fixed", "value": TOKENS},
        load={"concurrency": 4},
        judging={"warmup_s": 0},
    )
    out = tmp_path / "out"
    with SimProcess(speedup=2, seed=5) as sim, BufferingProxy(sim.port, block=block) as proxy:
        args = ["--profile", str(prof), "--host", proxy.base_url, "--duration", "4", "--slo", SLOS]
        master, workers = start_run(mode, [*args, "--generator-health", "warn"], out, tmp_path)
        code, logs = finish_run(master, workers, tmp_path)
    assert (out / "run.json").is_file(), logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]
    report = (out / "report.html").read_text()
    return code, logs, json.loads((out / "run.json").read_text()), report, proxy


@pytest.mark.parametrize("mode", MODES)
def test_a_buffering_proxy_is_named_first_and_itl_tpot_not_measurable(tmp_path: Path, mode: str) -> None:
    code, logs, doc, report, proxy = _run_through(tmp_path, block=65536, mode=mode)
    assert proxy.writes < proxy.reads  # the proxy did hold reads back
    merged = doc["metrics"]["itl_merged"]
    assert merged["streams"] >= 4 and merged["merged_streams"] == merged["streams"], merged
    verdict = doc["verdict"]
    assert verdict["status"] == "invalid" and code == 11, logs[-3000:]
    assert verdict["reasons"][0].startswith("merged delivery:"), verdict["reasons"]
    assert "a buffering proxy between client and server" in verdict["reasons"][0]
    by = {c["name"]: c for c in verdict["checks"]}
    for key in ("itl_p99", "tpot_p99"):
        assert not by[key]["passed"] and by[key]["value"] is None, by[key]
        assert by[key]["detail"].startswith("not measurable")
    assert not any("--duration" in r and ("itl" in r or "tpot" in r) for r in verdict["reasons"])
    assert "DELIVERY    merged delivery:" in logs  # the console summary's own line
    assert "not measurable (merged delivery)" in logs
    assert ">Delivery<" in report  # the first screen's row
    assert (
        "ITL (not measurable: merged delivery)" in report
        and "TPOT (not measurable: merged delivery)" in report
    )


@pytest.mark.parametrize("mode", MODES)
def test_a_passing_proxy_gets_no_diagnosis(tmp_path: Path, mode: str) -> None:
    code, logs, doc, report, proxy = _run_through(tmp_path, block=0, mode=mode)
    merged = doc["metrics"]["itl_merged"]
    assert merged["streams"] >= 4, merged
    assert merged["merged_streams"] <= merged["streams"] // 4, merged  # a busy client may merge a few
    names = {c["name"]: c for c in doc["verdict"]["checks"]}
    assert MERGED_DELIVERY not in names
    assert names["itl_p99"]["kind"] == "slo" and names["itl_p99"]["value"] is not None
    assert "DELIVERY" not in logs and "not measurable" not in logs
    assert ">Delivery<" not in report


def test_an_engine_answering_429_is_rate_limited(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"rate": 20}, judging={"warmup_s": 0})
    out = tmp_path / "out"
    with SimProcess(speedup=20, seed=3, faults="http_429=60%@0.1") as sim:
        res = run_cli(
            ["run", "--profile", str(prof), "--host", sim.base_url, "--duration", "3", "--out", str(out)]
            + ["--retries", "1"]
        )
    doc = json.loads((out / "run.json").read_text())
    assert res.returncode == 12, res.stdout[-3000:] + res.stderr[-3000:]
    first = doc["verdict"]["reasons"][0]
    assert first.startswith("rate limited: ") and "got 429 (Retry-After honoured, up to 1 retry)" in first
    assert "against 20 req/s offered" in first
    assert "rate limited (HTTP 429)" in res.stdout.splitlines()[-1]


EVENTS, TOKENS_PER_EVENT = 10, 8


class ChunkyServer(FaultServer):
    """A server that sends EVENTS events of TOKENS_PER_EVENT tokens each, one write every 10 ms (as an
    engine streaming in batched chunks does): many tokens per event, one event per read. It sets
    TCP_NODELAY as real servers do: without it, Nagle's algorithm holds the small writes after the
    head until the client's delayed ACK, and the first read holds the first 40 ms of events."""

    def _b_ok(self, conn: socket.socket, _h: dict[str, str]) -> bool:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(self._head(200, "text/event-stream", None))
        for _ in range(EVENTS):
            conn.sendall(_chunk(_event(_delta(" hello" * TOKENS_PER_EVENT))))
            time.sleep(0.01)
        tail = self._ok_events(0)
        n = EVENTS * TOKENS_PER_EVENT
        usage = {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}
        tail[1] = _event({"object": "chat.completion.chunk", "choices": [], "usage": usage})
        conn.sendall(b"".join(_chunk(ev) for ev in tail) + b"0\r\n\r\n")
        return True


def test_many_tokens_per_event_is_no_merged_delivery(tmp_path: Path) -> None:
    prof = write_profile(
        tmp_path / "p.yaml", output_tokens={"dist": "fixed", "value": EVENTS * TOKENS_PER_EVENT}
    )
    out = tmp_path / "out"
    with ChunkyServer(["ok"]) as srv:
        res = run_cli(
            ["run", "--profile", str(prof), "--host", srv.base_url, "--duration", "3", "--out", str(out)]
            + ["--endpoint-check", "none", "--model", "fault-model", "--slo", "itl_p99=5s"]
        )
    assert (out / "run.json").is_file(), res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads((out / "run.json").read_text())
    lines = [ln for ln in read_lines(sorted(out.glob("records*.jsonl"))) if ln["outcome"] == "ok"]
    assert lines and all(ln["usage_completion_tokens"] == EVENTS * TOKENS_PER_EVENT for ln in lines)
    assert all(len(ln["chunks_us"]) == EVENTS for ln in lines)
    merged = doc["metrics"]["itl_merged"]
    assert merged["streams"] == len(lines) and merged["merged_streams"] <= len(lines) // 4, merged
    assert merged["burst_streams"] == 0 and merged["burst_gaps"] == 0, merged  # one event per write, paced
    assert MERGED_DELIVERY not in {c["name"] for c in doc["verdict"]["checks"]}
    assert "DELIVERY" not in res.stdout
