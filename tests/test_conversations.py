"""Per-conversation figures: which conversations count as completed, judged and good; the conversation SLO
judged with early stopping; and a real run over two workers whose run.json figures an independent
recomputation from the record log matches, with the same figures in the report, the console summary and
the live Prometheus text."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from loadtest.contracts.record_line import RecordLine
from loadtest.fmt import fmt_ms, fmt_pct
from loadtest.locust.ui_stats import conversation_stats, request_counts, scope_stats, slo_rows, table_rows
from loadtest.metrics import early_stopping as es
from loadtest.metrics.conversations import ConversationTally
from loadtest.metrics.judged import record_from_line
from loadtest.metrics.recorder import Recorder, RunAggregates
from loadtest.metrics.slo import ConversationSlo, RequestSlo, parse_slos
from loadtest.metrics.verdict import ValidityRules, conversation_checks, judge
from loadtest.telemetry.scrape import ScrapeError, fetch
from tests.conftest import CLI, read_lines, write_profile
from tests.test_slo_verdict import SLOS, make_run


def _call(
    session: str | None, k: int, *, last: bool = False, outcome: str = "ok", ttft_ms: int = 100
) -> RecordLine:
    """A 1-s call sent at ``5 k`` s (a 4-s tool delay after the one before), 50 output tokens."""
    line = RecordLine(
        id=f"{session}.{k}",
        t=100.0 + 5.0 * k,
        outcome=outcome,
        sent_us=0,
        ttft_us=ttft_ms * 1000,
        e2e_us=1_000_000,
        output_tokens=50,
    )
    if session is not None:
        line.session = session
    if last:
        line.session_last = True
    return line


def test_only_conversations_that_reached_their_planned_end_ok_are_completed() -> None:
    tally = ConversationTally(RequestSlo(ttft_ms=500))
    tally.add([_call("done", k, last=k == 2) for k in range(3)])  # 3 calls, ends as planned
    tally.add([_call("slow", k, last=k == 1, ttft_ms=900 if k == 1 else 100) for k in range(2)])
    tally.add([_call("cut", k) for k in range(2)])  # the run ended before its last call
    tally.add([_call("failed", 0), _call("failed", 1, last=True, outcome="http_5xx")])
    tally.add([_call("stopped", 0), _call("stopped", 1, last=True, outcome="cancelled")])  # the run's end
    tally.add([_call(None, 0)])  # a single request: no conversation
    got = tally.result(duration_s=20.0)
    assert got is not None
    assert (got["started"], got["completed"]) == (5, 2)
    # judged: the completed and the failed; the cut and the stopped ones are not
    assert (got["judged"], got["good"]) == (3, 1)
    assert got["per_s"] == 0.1
    # done: 0 → 11 s, slow: 0 → 6 s; each call 1 s and 50 tokens
    assert got["latency_s"] is not None and got["latency_s"]["mean"] == 8.5
    assert got["calls_per_conversation"] is not None and got["calls_per_conversation"]["mean"] == 2.5
    assert got["e2e_interactivity"] == 50.0
    assert got["e2e_interactivity_with_tool_time"] == round((150 / 11 + 100 / 6) / 2, 4)
    assert got["slo_attainment"] == round(1 / 3, 4)  # "slow" had a call over the TTFT limit, one failed


def test_a_run_without_sessions_has_no_conversation_figures() -> None:
    tally = ConversationTally()
    tally.add([_call(None, k) for k in range(3)])
    assert tally.result(10.0) is None


@pytest.mark.parametrize(
    ("judged", "good", "passed", "evidence", "blocking"),
    [
        (60, 60, True, True, True),  # 90 %: 44 conversations prove it when none is bad
        (30, 30, True, False, True),  # met, but too few conversations: invalid
        (100, 80, False, False, False),  # missed: the missed SLO is the result, not the evidence
    ],
)
def test_conversation_attainment_is_judged_with_early_stopping_on_the_conversations(
    judged: int, good: int, passed: bool, evidence: bool, blocking: bool
) -> None:
    raw, stop = conversation_checks(ConversationSlo(0.9), judged, good)
    assert (raw.check.name, raw.check.kind, raw.check.passed) == ("conversation_attainment", "slo", passed)
    need = es.find_min_passing(judged - good, 0.9) + (judged - good)
    assert (stop.check.passed, stop.check.limit, stop.check.blocking) == (evidence, need, blocking)
    assert "conversation_attainment" in raw.reason and "conversation_attainment" in stop.reason


def test_a_conversation_slo_is_written_as_a_share() -> None:
    assert parse_slos("conversation_attainment=90%") == [ConversationSlo(0.9)]
    with pytest.raises(ValueError, match="conversation_attainment=100%: the share must be strictly between"):
        parse_slos("conversation_attainment=100%")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _series(text: str, name: str) -> float | None:
    """One unlabelled sample of Prometheus text (None when absent)."""
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Multi-turn chats over two worker processes with live metrics, and a conversation SLO (99 %) that
    the run's few conversations cannot prove: scraped while the load runs, then run.json, the record log,
    the report and the console summary."""
    tmp = tmp_path_factory.mktemp("chats")
    prof = write_profile(
        tmp / "p.yaml",
        kind="multi_turn",
        session={"turns": {"dist": "fixed", "value": 3}, "think_time_s": {"dist": "fixed", "value": 0.2}},
        load={"concurrency": 6},
        duration_s=5,
        slos={"ttft_p50": "60s", "conversation_attainment": "99%"},
    )
    port, out = _free_port(), tmp / "run"
    args = ["run", "--profile", str(prof), "--out", str(out), "--processes", "2", "--progress", "0"]
    args += ["--prometheus-port", str(port), "--prometheus-hold", "30", "--generator-health", "warn"]
    proc = subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    during: list[str] = []
    final = ""
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                text = fetch(f"http://127.0.0.1:{port}/metrics", 2.0)
            except ScrapeError:
                time.sleep(0.1)
                continue
            if _series(text, "loadtest_run_finished") == 1.0:
                final = text
                break
            if _series(text, "loadtest_conversations_started_total"):
                during.append(text)
            time.sleep(0.2)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {
        "code": proc.returncode,
        "output": output,
        "during": during,
        "final": final,
        "run": json.loads((out / "run.json").read_text()),
        "lines": read_lines(sorted(out.glob("records*.jsonl"))),
        "sessions_per_file": {
            p.name: len({r["session"] for r in read_lines([p]) if "session" in r})
            for p in out.glob("records*.jsonl")
        },
        "html": (out / "report.html").read_text(),
    }


def _recompute(lines: list[dict[str, Any]], ttft_limit_us: float) -> dict[str, Any]:
    """run.json ``conversations`` from the record lines alone (docs/metrics.md, "Per conversation")."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in lines:
        if "session" in r:
            groups[r["session"]].append(r)
    done = [
        v
        for v in groups.values()
        if all(r["outcome"] == "ok" for r in v) and any(r.get("session_last") for r in v)
    ]
    failed = [v for v in groups.values() if any(r["outcome"] not in ("ok", "cancelled") for r in v)]
    good = [v for v in done if all(r.get("ttft_us") is not None and r["ttft_us"] <= ttft_limit_us for r in v)]
    latency = [
        max(r["t"] + r["e2e_us"] / 1e6 for r in v) - min(r["t"] + r.get("sent_us", 0) / 1e6 for r in v)
        for v in done
    ]
    busy = [
        sum(r["output_tokens"] for r in v) / sum((r["e2e_us"] - r.get("sent_us", 0)) / 1e6 for r in v)
        for v in done
    ]
    whole = [sum(r["output_tokens"] for r in v) / lat for v, lat in zip(done, latency, strict=True)]
    calls = [len(v) for v in done]
    return {
        "started": len(groups),
        "completed": len(done),
        "judged": len(done) + len(failed),
        "good": len(good),
        "latency_s": {f"p{p}": float(np.percentile(latency, p)) for p in (50, 90, 95, 99)}
        | {"mean": float(np.mean(latency))},
        "calls_per_conversation": {f"p{p}": float(np.percentile(calls, p)) for p in (50, 90, 95, 99)}
        | {"mean": float(np.mean(calls))},
        "e2e_interactivity": float(np.mean(busy)),
        "e2e_interactivity_with_tool_time": float(np.mean(whole)),
        "slo_attainment": len(good) / (len(done) + len(failed)),
    }


def test_every_conversation_figure_is_the_record_log_s(chats: dict[str, Any]) -> None:
    conv = chats["run"]["conversations"]
    want = _recompute(chats["lines"], 60e6)
    assert want["completed"] >= 5
    for key in ("started", "completed", "judged", "good"):
        assert conv[key] == want[key], key
    duration = chats["run"]["metrics"]["window"]["duration_s"]
    assert conv["per_s"] == pytest.approx(want["completed"] / duration, abs=1e-3)
    for key in ("latency_s", "calls_per_conversation"):
        for stat, v in want[key].items():
            assert conv[key][stat] == pytest.approx(v, abs=1e-3), (key, stat)
    for key in ("e2e_interactivity", "e2e_interactivity_with_tool_time", "slo_attainment"):
        assert conv[key] == pytest.approx(want[key], rel=1e-3), key
    assert conv["calls_per_conversation"]["p50"] == 3.0


def test_a_conversation_slo_without_the_evidence_fails_the_run_and_names_itself_first(
    chats: dict[str, Any],
) -> None:
    verdict, conv = chats["run"]["verdict"], chats["run"]["conversations"]
    assert conv["slo_attainment"] == 1.0  # every call within 60 s: met, but not proven
    need = es.find_min_passing(0, 0.99)
    assert conv["judged"] < need
    assert chats["code"] not in (0, None) and verdict["status"] == "invalid", chats["output"][-2000:]
    first = verdict["reasons"][0]
    assert "conversation_attainment" in first and f"needs ≥ {need} conversations" in first, verdict["reasons"]
    names = {c["name"]: c for c in verdict["checks"]}
    assert names["conversation_attainment"]["passed"] is True
    assert names["early_stopping.conversation_attainment"]["passed"] is False
    assert chats["run"]["config"]["slos"]["conversation_attainment"] == 0.99


def test_the_report_and_the_console_show_the_same_conversation_figures(chats: dict[str, Any]) -> None:
    conv, html, out = chats["run"]["conversations"], chats["html"], chats["output"]
    section = html[html.index('<section id="conversations">') :]
    section = section[: section.index("</section>")]
    assert f"{conv['completed']} of {conv['started']} completed" in section
    for figure in (
        fmt_ms(conv["per_s"]),
        fmt_ms(conv["latency_s"]["p99"]),
        fmt_ms(conv["e2e_interactivity"]),
        fmt_ms(conv["e2e_interactivity_with_tool_time"]),
        f"{fmt_pct(conv['slo_attainment'])} of {conv['judged']} judged",
    ):
        assert figure in section, figure
    block = out[out.index("Conversations (whole run)") :].splitlines()[:6]
    assert all(len(line) <= 80 for line in block), block
    text = "\n".join(block)
    assert f"{conv['completed']} of {conv['started']} started" in text
    assert f"p99 {fmt_ms(conv['latency_s']['p99'])}" in text


def test_prometheus_serves_the_conversations_during_the_run_merged_over_workers(
    chats: dict[str, Any],
) -> None:
    conv, during, final = chats["run"]["conversations"], chats["during"], chats["final"]
    assert len(during) >= 2 and final, len(during)
    started = [_series(t, "loadtest_conversations_started_total") or 0.0 for t in during]
    assert started == sorted(started) and started[0] > 0
    # Both workers' conversations, merged: the final figures are run.json's.
    assert _series(final, "loadtest_conversations_started_total") == conv["started"]
    assert _series(final, "loadtest_conversations_completed_total") == conv["completed"]
    assert _series(final, "loadtest_conversations_judged_total") == conv["judged"]
    assert _series(final, "loadtest_conversations_good_total") == conv["good"]
    assert _series(final, "loadtest_conversation_seconds_count") == conv["completed"]
    mean = (_series(final, "loadtest_conversation_seconds_sum") or 0.0) / conv["completed"]
    assert mean == pytest.approx(conv["latency_s"]["mean"], rel=0.02)
    assert sum(1 for n in chats["sessions_per_file"].values() if n) == 2  # each worker ran some


def test_the_live_figures_follow_the_record_log_rules_and_merge_from_two_workers() -> None:
    """Two workers' recorders each see their own conversations' calls as they finish; the master's merge of
    their deltas gives the UI's figures and its conversation SLO row the record log's counts."""
    slo = RequestSlo(ttft_ms=500)
    calls = {
        0: [_call("done", k, last=k == 2) for k in range(3)]
        + [_call("cut", k) for k in range(2)]
        + [_call("stopped", 0), _call("stopped", 1, last=True, outcome="cancelled")],
        1: [_call("slow", k, last=k == 1, ttft_ms=900 if k == 1 else 100) for k in range(2)]
        + [_call("failed", 0), _call("failed", 1, last=True, outcome="http_5xx")],
    }
    tally = ConversationTally(slo)
    master = RunAggregates()
    for lines in calls.values():
        worker = Recorder()
        for line in lines:
            rec = record_from_line(line)
            worker.add(rec)
            worker.converse(rec, slo.is_good_record(rec))
        master.merge_wire(worker.take_delta())
        tally.add(lines)
    want = tally.result(20.0)
    live = conversation_stats(master.all)
    assert want is not None and live is not None
    for key in ("started", "completed", "judged", "good", "slo_attainment"):
        assert live[key] == want[key], key
    assert master.all.hists["conversation"].get_total_count() == want["completed"]
    assert live["latency_s"]["p99"] == pytest.approx(11.0, rel=0.01)  # "done": 0 → 11 s
    (row,) = slo_rows([ConversationSlo(0.9)], master.all, request_counts(master.all))
    assert (row["key"], row["value"], row["met"]) == (
        "conversation_attainment",
        want["slo_attainment"],
        False,
    )
    assert conversation_stats(Recorder().result().all) is None  # no conversation yet
    # The LLM tab's row of the whole run
    stats = {
        "profile": {"name": "p", "load": "closed", "slos_text": "conversation_attainment ≥ 90.00%"},
        "overall": scope_stats(master.all, 200.0),
        "scenarios": {},
        "slos": [row],
        "verdict": None,
        "run": None,
    }
    (conv_row,) = [r for r in table_rows(stats) if r["metric"] == "conversations completed / started"]
    assert conv_row["value"].startswith(f"{want['completed']} / {want['started']}, latency p50 ")
    assert f"{fmt_pct(want['slo_attainment'])} of {want['judged']} judged" in conv_row["value"]


def test_a_missed_conversation_slo_is_the_verdict_s_first_reason_and_exit_10() -> None:
    """A run whose requests all pass their own SLO but whose conversations miss their target: the
    verdict is slo_missed (exit 10) and its first reason names conversation_attainment; met and proven,
    it passes."""
    slos = [*parse_slos(SLOS), ConversationSlo(0.9)]
    missed = judge(
        *make_run(), slos, ValidityRules(), {}, extra_checks=conversation_checks(slos[-1], 400, 300)
    )
    assert (missed.status, missed.exit_code) == ("slo_missed", 10), missed.reasons
    assert missed.reasons[0].startswith("SLO missed: conversation_attainment: 75.00 % of 400"), missed.reasons
    kept = judge(*make_run(), slos, ValidityRules(), {}, extra_checks=conversation_checks(slos[-1], 400, 390))
    assert kept.status == "pass", kept.reasons
