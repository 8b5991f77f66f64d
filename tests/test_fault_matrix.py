"""The fault matrix: every fault the engine injects and every misbehaviour of a proxy or broken server, run
in one process, with ``--processes 2`` and with a master and two workers; each request ends in exactly one
outcome class, and the counts per class equal the server's own ground truth.

Prints (and writes to tests/artifacts/fault_matrix.txt) the table fault × mode × outcome counts × truth.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from summary_sections import add_lines

from loadtest.client.record import OUTCOMES
from loadtest.sim import SimProcess
from tests.conftest import CLI, read_lines, write_profile
from tests.fault_servers import CR_GAP_S, FaultServer, SilentServer, self_signed_cert, wait_until

MODES = ("single", "processes2", "master+2")
ARTIFACT = Path(__file__).parent / "artifacts" / "fault_matrix.txt"

# The outcome class each engine fault must end in (docs/reliability.md).
ENGINE_FAULTS = {
    "none": "ok",
    "http_500": "http_5xx",
    "http_503": "http_5xx",
    "http_429": "http_429",
    "reset_before_headers": "connect_error",
    "disconnect_mid_stream": "stream_error",
    "stall_mid_stream": "ok",
    "malformed_chunk": "stream_error",
    "error_frame": "stream_error",
    "no_done": "truncated",
    "slow_headers": "ok",
    "no_usage": "ok",
}
ENGINE_SPEC = ",".join(
    f"{k}=4%" + {"stall_mid_stream": "@0.3", "slow_headers": "@0.2", "http_429": "@1"}.get(k, "")
    for k in ENGINE_FAULTS
    if k != "none"
)
# ... and each misbehaviour of the fault server; "refused" = sent after the listener went away.
SERVER_FAULTS = {
    "ok": "ok",
    "html_502": "http_5xx",
    "redirect_301": "protocol_error",
    "redirect_307": "protocol_error",
    "json_not_sse": "protocol_error",
    "invalid_utf8": "stream_error",
    "big_event": "protocol_error",  # one 10 MB event for a 4-token request: past its 8 MiB size cap
    "never_answer": "timeout",
    "empty_done": "empty",
    "context_400": "context_length",
    "continue_100": "ok",
    "switching_101": "protocol_error",
    "trailing_503": "ok",
    "gzip_stream": "ok",
    "br_stream": "protocol_error",
    "events_after_done": "ok",
    "bom_stream": "ok",
    "huge_header": "protocol_error",
    "endless_stream": "protocol_error",
    # Dead endpoints: silent after the headers (the read timeout), or dripping a byte at a time so that no
    # read timeout fires: still waiting on the endpoint when the drain ends, they are its timeouts.
    "stall_after_headers": "timeout",
    "drip_headers": "timeout",
    "drip_body": "timeout",
    "bursty_stream": "ok",  # several events in one read: merged gaps, still ok (docs/metrics.md)
    # SSE and HTTP as the standards allow (docs/sources.md §5): a "data:" heartbeat, CR-only line
    # endings (each token timed at the read that ends its line), a media type in mixed case with a
    # parameter; and a tool call off the API's shape (arguments as a JSON object) is the endpoint's error.
    "heartbeat_data": "ok",
    "cr_paced": "ok",
    "mixed_case_type": "ok",
    "object_arguments": "protocol_error",
    "refused": "connect_error",
}
# Behaviours whose answer carries exactly the four " hello" tokens of an ok stream, nothing more or less.
FOUR_TOKENS = {
    "ok",
    "continue_100",
    "trailing_503",
    "gzip_stream",
    "events_after_done",
    "bom_stream",
    "heartbeat_data",
    "cr_paced",
    "mixed_case_type",
}
SCHEDULE = [b for b in SERVER_FAULTS if b != "refused"]

# (case, mode, requests the server saw, outcome counts, expected, whether the counts equal the truth)
_table: list[tuple[str, str, int, dict[str, int], str, bool]] = []


@pytest.fixture(scope="module", autouse=True)
def _print_table() -> Iterator[None]:
    yield
    if not _table:
        return
    rows = [("case", "mode", "truth", "outcome counts", "expected", "equal")]
    rows += [
        (f, m, str(n), " ".join(f"{k}={v}" for k, v in sorted(c.items())), e, "yes" if ok else "NO")
        for f, m, n, c, e, ok in _table
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text("\n".join(lines) + "\n")
    add_lines("fault matrix: case x mode x outcome counts x server truth", lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(CLI + args, stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def start_run(
    mode: str, args: list[str], out: Path, tmp: Path
) -> tuple[subprocess.Popen, list[subprocess.Popen]]:
    """The run in ``mode``: ``loadtest run``, ``run --processes 2`` or ``master`` + 2 ``worker``s."""
    common = [*args, "--out", str(out)]
    if mode == "single":
        return _start(["run", *common], tmp / "run.log"), []
    if mode == "processes2":
        return _start(["run", *common, "--processes", "2"], tmp / "run.log"), []
    port = _free_port()
    master = _start(["master", *common, "--expect-workers", "2", "--master-port", str(port)], tmp / "run.log")
    workers = [
        _start(["worker", "--master-port", str(port), "--out", str(tmp / f"w{i}")], tmp / f"w{i}.log")
        for i in range(2)
    ]
    return master, workers


def finish_run(master: subprocess.Popen, workers: list[subprocess.Popen], tmp: Path) -> tuple[int, str]:
    """Wait for the run to end; its exit code and every log it wrote (master, workers, worker logs)."""
    try:
        code = master.wait(timeout=120)
        for w in workers:
            assert w.wait(timeout=30) == 0, (tmp / "w0.log").read_text()
    finally:
        _stop([master, *workers])
    logs = "".join(p.read_text(errors="replace") for p in sorted(tmp.rglob("*.log")))
    return code, logs


def _check_accounting(
    out: Path, expected: dict[str, str], mode: str, label_of: dict[str, str], logs: str
) -> dict[str, Any]:
    """Per request: one documented outcome equal to what its ground-truth behaviour maps to."""
    assert "Traceback" not in logs, logs[-3000:]
    run = json.loads((out / "run.json").read_text())
    records = read_lines(sorted(out.glob("records*.jsonl")))
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)), "a request was recorded twice"
    assert all(r["outcome"] in OUTCOMES for r in records)
    wrong = [
        (r["id"], label_of[r["wire_id"]], r["outcome"], r["error"])
        for r in records
        if r["outcome"] != expected[label_of[r["wire_id"]]]
    ]
    assert not wrong, wrong[:5]
    got = Counter(r["outcome"] for r in records)
    by = run["metrics"]["requests"]["by_outcome"]
    assert {k: v for k, v in by.items() if v} == dict(got)
    truth = Counter(label_of[r["wire_id"]] for r in records)
    want = Counter()
    for label, n in truth.items():
        want[expected[label]] += n
    assert got == want  # counts per class == ground truth: nothing lost, nothing double-counted
    # Latency histograms hold the ok requests only.
    lat = run["metrics"]["latency_ms"]
    assert lat["e2e"]["count"] == lat["ttft"]["count"] == got["ok"] > 0
    # The verdict names every failed class.
    reasons = " ".join(run["verdict"]["reasons"])
    # Over its limit, or (a server gone mid-run: the judged window after the default warm-up may
    # hold no ok request) not one request succeeded; either is the endpoint's failure, named first.
    assert run["verdict"]["reasons"][0].startswith(
        ("error rate over limit", "endpoint failing: no successful")
    )
    for outcome in got:
        if outcome != "ok":
            assert outcome in reasons, (outcome, reasons)
    for label, n in sorted(truth.items()):
        per = Counter(r["outcome"] for r in records if label_of[r["wire_id"]] == label)
        _table.append((label, mode, n, dict(per), expected[label], per == {expected[label]: n}))
    return run


@pytest.mark.parametrize("mode", MODES)
def test_engine_faults(tmp_path: Path, mode: str) -> None:
    prof = write_profile(
        tmp_path / "p.yaml", load={"concurrency": 8}, output_tokens={"dist": "uniform", "min": 8, "max": 16}
    )
    out = tmp_path / "out"
    with SimProcess(speedup=20, faults=ENGINE_SPEC, seed=3) as sim:
        args = ["--profile", str(prof), "--host", sim.base_url, "--duration", "4", "--slo", "error_rate=1%"]
        master, workers = start_run(mode, args, out, tmp_path)
        code, logs = finish_run(master, workers, tmp_path)
        truth = sim.truth()
        stats = sim.stats()
    assert code in (11, 12), logs[-3000:]  # error rate (11 too when a loaded CI box lags)
    label_of = {t["request_id"]: t["fault"] or "none" for t in truth}
    assert len(label_of) == len(truth) == stats["requests_received"]
    run = _check_accounting(out, ENGINE_FAULTS, mode, label_of, logs)
    assert run["metrics"]["requests"]["completed"] == len(truth)  # every request the engine saw, once
    assert set(stats["faults_injected"]) == set(ENGINE_FAULTS) - {"none"}  # every kind was exercised


@pytest.mark.parametrize("mode", MODES)
def test_proxy_and_server_faults(tmp_path: Path, mode: str) -> None:
    prof = write_profile(
        tmp_path / "p.yaml",
        load={"rate": 30.0},
        output_tokens={"dist": "fixed", "value": 4},
        client={"drain_timeout_s": 2},
    )
    out = tmp_path / "out"
    with FaultServer(SCHEDULE) as srv:
        # A read timeout well above the server's own pauses (a drip every 0.3 s, 40 ms between CR-paced
        # events), so that a busy machine's late server thread is not read as a silent endpoint.
        args = ["--profile", str(prof), "--host", srv.base_url, "--duration", "5", "--read-timeout", "3"]
        master, workers = start_run(mode, [*args, "--slo", "error_rate=1%"], out, tmp_path)
        try:
            # Mid-run, once every behaviour was served twice, the server goes away: connections refused.
            wait_until(lambda: sum(srv.counts().values()) >= 2 * len(SCHEDULE), 60, "two rounds of faults")
            srv.stop_accepting()
        finally:
            code, logs = finish_run(master, workers, tmp_path)
        label_of = dict(srv.truth)
    records = read_lines(sorted(out.glob("records*.jsonl")))
    for r in records:
        label_of.setdefault(r["wire_id"], "refused")  # never reached the server
    assert code in (11, 12), logs[-3000:]  # error rate (11 too when a loaded CI box lags)
    run = _check_accounting(out, SERVER_FAULTS, mode, label_of, logs)
    # Every request the server received has its record, and some were refused after it went away.
    assert set(srv.truth) <= {r["wire_id"] for r in records}
    assert run["metrics"]["requests"]["by_outcome"]["connect_error"] > 0
    assert all(n >= 2 for n in Counter(srv.truth.values()).values())
    # Interim responses, trailing bytes, a gzip body, events after [DONE] and a BOM change no count.
    counted = [r for r in records if label_of[r["wire_id"]] in FOUR_TOKENS]
    assert counted and all(r["output_tokens"] == 4 for r in counted), [
        (label_of[r["wire_id"]], r["output_tokens"]) for r in counted if r["output_tokens"] != 4
    ]
    assert all(h.lower() == "identity" for h in srv.accept_encoding), set(srv.accept_encoding)
    # CR-only endings: the first token came with the headers, each next one CR_GAP_S later; a token timed
    # at the read after the one ending its line would be a whole gap late.
    paced = [r for r in records if label_of[r["wire_id"]] == "cr_paced"]
    assert paced and all(r["ttft_us"] - r["headers_us"] < CR_GAP_S * 1e6 / 2 for r in paced), [
        (r["headers_us"], r["ttft_us"], r["chunks_us"]) for r in paced
    ]
    assert all(len(r["chunks_us"]) == 4 and r["chunks_us"][0] == r["ttft_us"] for r in paced)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.mark.parametrize("mode", MODES)
def test_tls_bad_certificate_is_one_clear_line(tmp_path: Path, mode: str, cert: tuple[Path, Path]) -> None:
    prof = write_profile(tmp_path / "p.yaml")
    with FaultServer(["ok"], tls=cert) as srv:
        master, workers = start_run(
            mode, ["--profile", str(prof), "--host", srv.base_url], tmp_path / "o", tmp_path
        )
        try:
            code = master.wait(timeout=60)
        finally:
            _stop([master, *workers])
        assert srv.truth == {}  # not one request went to an endpoint whose certificate fails
    log = (tmp_path / "run.log").read_text()
    assert code == 1 and "Traceback" not in log
    err = [ln for ln in log.splitlines() if ln.startswith("loadtest: error:")]
    assert len(err) == 1 and "CERTIFICATE_VERIFY_FAILED" in err[0] and "--insecure" in err[0]
    _table.append(("tls_bad_certificate", mode, 0, {"refused_before_run": 1}, "exit 1", True))


def test_tls_insecure_is_explicit_and_recorded(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 2})
    out = tmp_path / "o"
    with FaultServer(["ok"], tls=cert) as srv:
        args = ["--profile", str(prof), "--host", srv.base_url, "--duration", "1.5", "--insecure"]
        master, workers = start_run("single", args, out, tmp_path)
        code, logs = finish_run(master, workers, tmp_path)
        n = len(srv.truth)
    assert code == 0, logs
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["tls_verify"] is False
    assert any("--insecure" in r for r in run["verdict"]["reasons"]) and run["verdict"]["status"] == "pass"
    assert run["metrics"]["requests"]["ok"] == n > 0
    got = {k: v for k, v in run["metrics"]["requests"]["by_outcome"].items() if v}
    _table.append(("tls_insecure", "single", n, got, "ok", got == {"ok": n}))


def test_no_hidden_retries_and_explicit_retries_are_linked(tmp_path: Path) -> None:
    """A 503 with retries off is one request at the server; with --retries 2 every attempt is a record."""
    prof = write_profile(
        tmp_path / "p.yaml", load={"concurrency": 1}, client={"retries": {"backoff_s": 0.05, "max": 0}}
    )
    for retries, attempts in ((None, 1), (2, 3)):
        out = tmp_path / f"o{retries}"
        with SimProcess(speedup=20, faults="http_503=#3") as sim:
            args = ["--profile", str(prof), "--host", sim.base_url, "--duration", "1.5"]
            args += ["--slo", "error_rate=50%"]  # 3 failures are over the default 1 % limit of a short run
            args += ["--retries", str(retries)] if retries else []
            res = subprocess.run(
                [*CLI, "run", *args, "--out", str(out)], capture_output=True, text=True, timeout=60
            )
            stats = sim.stats()
        assert res.returncode == 0, res.stderr
        records = read_lines([out / "records.jsonl"])
        assert stats["faults_injected"] == {"http_503": 3}
        assert len(records) == stats["requests_received"]  # the server saw exactly what was recorded
        first = sorted(records, key=lambda r: r["t"])[:attempts]
        if retries is None:
            assert (
                first[0]["outcome"] == "http_5xx"
                and first[0]["attempt"] == 0
                and first[0]["retry_of"] is None
            )
            assert all(r["attempt"] == 0 for r in records)
        else:
            # The first request failed, was retried twice (both 503), and its linked records say so.
            assert [r["attempt"] for r in first] == [0, 1, 2]
            assert [r["retry_of"] for r in first] == [None, first[0]["id"], first[0]["id"]]
            assert all(r["outcome"] == "http_5xx" for r in first)
            run = json.loads((out / "run.json").read_text())
            assert run["config"]["retries"]["max"] == 2
            assert any("retries on" in r for r in run["verdict"]["reasons"])


@pytest.mark.parametrize("mode", ["single", "processes2"])
def test_two_thousand_never_answered_streams_fail_as_timeouts(tmp_path: Path, mode: str) -> None:
    """2,000 streams sent to an endpoint that never answers (read timeout 300 s, longer than the drain):
    every one is the endpoint's timeout when the drain ends, none the generator's cancellation."""
    from loadtest.fd_limit import raise_open_file_limit

    assert raise_open_file_limit() > 4200, "the test needs 4,200 descriptors (2,000 each side)"
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 2000}, client={"drain_timeout_s": 3})
    out = tmp_path / "out"
    with SilentServer() as srv:
        args = ["--profile", str(prof), "--host", srv.base_url, "--duration", "4", "--endpoint-check", "none"]
        master, workers = start_run(mode, [*args, "--model", "m"], out, tmp_path)
        code, logs = finish_run(master, workers, tmp_path)
        received = list(srv.received)
    assert code == 12, logs[-3000:]
    assert "Traceback" not in logs
    records = read_lines(sorted(out.glob("records*.jsonl")))
    got = Counter(r["outcome"] for r in records)
    assert len(received) == 2000 and sorted(r["wire_id"] for r in records) == sorted(received)
    assert got == {"timeout": 2000}, got
    run = json.loads((out / "run.json").read_text())
    assert run["verdict"]["status"] != "pass" and "timeout" in run["verdict"]["reasons"][0]
    _table.append(
        ("never_answered_x2000", mode, len(received), dict(got), "timeout", got == {"timeout": 2000})
    )


@pytest.mark.parametrize("mode", MODES)
def test_tool_call_arguments_as_an_object_fail_the_run_without_a_traceback(tmp_path: Path, mode: str) -> None:
    """One answer in ten streams a tool call whose arguments are a JSON object: each is the endpoint's
    protocol_error (not cancelled, not a traceback), counted in the error rate that fails the run."""
    prof = write_profile(
        tmp_path / "p.yaml", load={"concurrency": 4}, output_tokens={"dist": "fixed", "value": 4}
    )
    out = tmp_path / "out"
    with FaultServer(["ok"] * 9 + ["object_arguments"]) as srv:
        args = ["--profile", str(prof), "--host", srv.base_url, "--duration", "3", "--slo", "error_rate=1%"]
        master, workers = start_run(mode, args, out, tmp_path)
        code, logs = finish_run(master, workers, tmp_path)
        label_of = dict(srv.truth)
    assert code == 12, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]
    records = read_lines(sorted(out.glob("records*.jsonl")))
    got = Counter(r["outcome"] for r in records)
    bad = [r for r in records if label_of[r["wire_id"]] == "object_arguments"]
    assert bad and all(
        r["outcome"] == "protocol_error" and "JSON object" in r["error"] and "Paris" in r["error"]
        for r in bad
    )
    assert got == {"ok": len(records) - len(bad), "protocol_error": len(bad)}, got
    run = json.loads((out / "run.json").read_text())
    assert run["verdict"]["status"] != "pass" and "protocol_error" in run["verdict"]["reasons"][0]
    truth = Counter(label_of[r["wire_id"]] for r in records)
    _table.append(
        (
            "object_arguments_10%",
            mode,
            len(records),
            dict(got),
            "ok + protocol_error",
            got["protocol_error"] == truth["object_arguments"],
        )
    )
