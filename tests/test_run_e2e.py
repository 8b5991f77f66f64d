"""End-to-end `loadtest run` against the real embedded engine over real sockets."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.sim import SimProcess
from tests.conftest import CLI, ended_lines, interrupt_when, read_lines, run_cli, write_profile


def _check_run_matches_engine(out: Path, stats: dict, record_glob: str) -> dict:
    run = json.loads((out / "run.json").read_text())
    records = read_lines(sorted(out.glob(record_glob)))
    req = run["metrics"]["requests"]
    assert run["status"] == "completed"
    assert req["ok"] > 0
    # Nothing lost, nothing double-counted: client records == engine ground truth.
    assert len(records) == req["completed"] == stats["requests_received"]
    assert req["ok"] == stats["requests_completed"] == sum(1 for r in records if r["outcome"] == "ok")
    assert len({r["id"] for r in records}) == len(records)
    # The merged histograms hold exactly one sample per ok request.
    assert run["metrics"]["latency_ms"]["e2e"]["count"] == req["ok"]
    assert run["metrics"]["latency_ms"]["ttft"]["count"] == req["ok"]
    # Token counts: the client tokenizer agrees with the engine's usage.
    assert run["metrics"]["tokens"]["output_total"] == stats["completion_tokens_total"]
    assert run["metrics"]["tokens"]["usage_output_total"] == stats["completion_tokens_total"]
    assert run["metrics"]["tokens"]["mismatched_requests"] == 0
    assert (out / "report.html").stat().st_size > 10_000
    return run


def test_run_single_process_counts_match_engine(tmp_path: Path, small_profile: Path) -> None:
    with SimProcess(speedup=4) as sim:
        res = run_cli(
            ["run", "--profile", str(small_profile), "--host", sim.base_url, "--out", str(tmp_path / "out")]
        )
        stats = sim.stats()
    assert res.returncode == 0, res.stderr
    run = _check_run_matches_engine(tmp_path / "out", stats, "records.jsonl")
    load = run["config"]["load"]
    assert (load["mode"], load["concurrency"], load["rate"]) == ("closed", 4, None)
    assert run["config"]["tokenizer"] == "llama3"
    assert "report:" in res.stdout and "TTFT" in res.stdout


def test_run_two_processes_merges_exactly(tmp_path: Path, small_profile: Path) -> None:
    with SimProcess(speedup=4) as sim:
        res = run_cli(
            [
                "run",
                "--profile",
                str(small_profile),
                "--host",
                sim.base_url,
                "--processes",
                "2",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        stats = sim.stats()
    assert res.returncode == 0, res.stderr
    out = tmp_path / "o"
    run = _check_run_matches_engine(out, stats, "records-w*.jsonl")
    per_worker = [len(read_lines([p])) for p in sorted(out.glob("records-w*.jsonl"))]
    assert len(per_worker) == 2 and all(n > 0 for n in per_worker)
    assert run["config"]["processes"] == 2


def test_open_loop_schedule_is_the_same_for_any_number_of_workers(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"rate": 8.0}, duration_s=2.5)
    ids = {}
    with SimProcess(speedup=4) as sim:
        for procs in (1, 2):
            out = tmp_path / f"r{procs}"
            res = run_cli(
                [
                    "run",
                    "--profile",
                    str(prof),
                    "--host",
                    sim.base_url,
                    "--processes",
                    str(procs),
                    "--out",
                    str(out),
                ]
            )
            assert res.returncode == 0, res.stderr
            recs = read_lines(sorted(out.glob("records*.jsonl")))
            ids[procs] = sorted(int(r["id"].split("-")[1]) for r in recs)
            assert all(r["outcome"] == "ok" for r in recs)
    # The same global arrivals were issued (request i is identical whoever sends it).
    n = min(len(ids[1]), len(ids[2]))
    assert n >= 12
    assert ids[1][:n] == ids[2][:n] == list(range(n))


@pytest.mark.parametrize(("sig", "procs", "code"), [(signal.SIGINT, 1, 130), (signal.SIGTERM, 2, 143)])
def test_signal_ends_run_cleanly_with_results(
    tmp_path: Path, sig: signal.Signals, procs: int, code: int
) -> None:
    # Mixed lengths keep the streams out of step, so some are always in flight when the signal lands
    # (equal lengths finish together, and could all end in the moment between the signal and the stop).
    prof = write_profile(
        tmp_path / "p.yaml", output_tokens={"dist": "uniform", "min": 100, "max": 800}, duration_s=60
    )
    out = tmp_path / "out"
    # Signal once some requests have finished, so there is something to keep.
    rc, stdout, stderr = interrupt_when(
        CLI + ["run", "--profile", str(prof), "--processes", str(procs), "--out", str(out)],
        lambda: sum(ended_lines(out, "records*.jsonl")) >= 4,
        sig,
        wait_s=60,
    )
    assert rc == code, stderr
    assert "Traceback" not in stderr
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted" and run["interrupted_reason"] == sig.name
    records = read_lines(sorted(out.glob("records*.jsonl")))
    req = run["metrics"]["requests"]
    assert len(records) == req["completed"] >= 4
    assert req["ok"] == sum(1 for r in records if r["outcome"] == "ok") >= 4
    assert req["cancelled"] >= 1  # streams in flight at the signal are accounted, not lost
    assert "INTERRUPTED" in (out / "report.html").read_text()
    assert "INTERRUPTED" in stdout
    assert (
        stdout.strip().splitlines()[-1].startswith("verdict:") and f"exit {code})" in stdout
    )  # the real one


def test_unreachable_host_is_one_clear_line(tmp_path: Path, small_profile: Path) -> None:
    res = run_cli(
        ["run", "--profile", str(small_profile), "--host", "http://127.0.0.1:9", "--out", str(tmp_path / "o")]
    )
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "cannot reach http://127.0.0.1:9" in res.stderr
    assert "Traceback" not in res.stderr


def test_non_openai_endpoint_is_one_clear_line(tmp_path: Path, small_profile: Path) -> None:
    (tmp_path / "index.html").write_text("<html>hello</html>")
    srv = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = srv.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ..."
        port = int(line.split(" port ")[1].split()[0])
        res = run_cli(
            [
                "run",
                "--profile",
                str(small_profile),
                "--host",
                f"http://127.0.0.1:{port}",
                "--out",
                str(tmp_path / "o"),
            ]
        )
    finally:
        srv.terminate()
        srv.wait(timeout=10)
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "OpenAI-compatible" in res.stderr, res.stderr


def test_bad_profile_path_and_bad_field(tmp_path: Path) -> None:
    res = run_cli(["run", "--profile", str(tmp_path / "missing.yaml")])
    assert res.returncode == 2 and "missing.yaml: no such profile file" in res.stderr
    bad = write_profile(tmp_path / "bad.yaml", input_tokens={"dist": "lognormal", "median": -3, "sigma": 0.5})
    res = run_cli(["run", "--profile", str(bad)])
    assert res.returncode == 2
    assert str(bad) in res.stderr and "input_tokens.median" in res.stderr and "Traceback" not in res.stderr


def test_api_key_never_written(tmp_path: Path, small_profile: Path) -> None:
    secret = "sk-test-DO-NOT-LEAK-1234567890"
    env_name = "LOADTEST_TEST_KEY"
    import os

    env = dict(os.environ, **{env_name: secret})
    with SimProcess(speedup=8) as sim:
        res = subprocess.run(
            CLI
            + [
                "run",
                "--profile",
                str(small_profile),
                "--host",
                sim.base_url,
                "--api-key-env",
                env_name,
                "--duration",
                "1",
                "--out",
                str(tmp_path / "o"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert res.returncode == 0, res.stderr
    assert secret not in res.stdout + res.stderr
    for f in (tmp_path / "o").iterdir():
        assert secret not in f.read_text(errors="replace"), f
    assert json.loads((tmp_path / "o" / "run.json").read_text())["config"]["api_key_env"] == env_name


def test_unknown_engine_preset_is_one_clear_line(tmp_path: Path, small_profile: Path) -> None:
    res = run_cli(
        ["run", "--profile", str(small_profile), "--engine-gpu", "X999", "--out", str(tmp_path / "o")]
    )
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "unknown GPU 'X999'" in res.stderr


def test_serve_sim_runs_standalone_for_any_client(tmp_path: Path) -> None:
    import urllib.request

    proc = subprocess.Popen(
        CLI + ["serve", "sim", "--port", "0", "--speedup", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("LOADTEST_SIM_LISTENING 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer = json.loads(resp.read())
        assert answer["usage"]["completion_tokens"] <= 5
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_engine_faults_are_each_classified_once(tmp_path: Path, small_profile: Path) -> None:
    spec = "http_503=#3,error_frame=#2,no_done=#1,http_429=#2,malformed_chunk=#1"
    with SimProcess(speedup=4, faults=spec) as sim:
        # 9 failures are over the default 1 % error-rate limit of so short a run: allow them explicitly
        res = run_cli(
            ["run", "--profile", str(small_profile), "--host", sim.base_url, "--out", str(tmp_path / "o")]
            + ["--slo", "error_rate=50%"]
        )
        stats = sim.stats()
        truth = sim.truth()
    assert res.returncode == 0, res.stderr
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    by = run["metrics"]["requests"]["by_outcome"]
    assert stats["faults_injected"] == {
        "http_503": 3,
        "error_frame": 2,
        "no_done": 1,
        "http_429": 2,
        "malformed_chunk": 1,
    }
    assert (by["http_5xx"], by["http_429"], by["stream_error"], by["truncated"]) == (3, 2, 3, 1)
    assert by["ok"] == sum(1 for t in truth if t["outcome"] == "ok") > 0
    assert sum(by.values()) == len(truth) == len(read_lines([tmp_path / "o" / "records.jsonl"]))


@pytest.mark.parametrize(
    ("slo", "faults", "code", "status"),
    [
        ("error_rate=50%", None, 0, "pass"),
        ("ttft_p99=1ms", None, 10, "slo_missed"),
        ("ttft_p99=60s", None, 11, "invalid"),  # met, but far too few requests to prove a p99
        ("error_rate=1%", "http_503=40%", 12, "error_rate"),
    ],
)
def test_verdict_exit_codes_and_junit(
    tmp_path: Path, small_profile: Path, slo: str, faults: str | None, code: int, status: str
) -> None:
    import xml.etree.ElementTree as ET

    junit = tmp_path / "junit.xml"
    with SimProcess(speedup=4, faults=faults) as sim:
        res = run_cli(
            [
                "run",
                "--profile",
                str(small_profile),
                "--host",
                sim.base_url,
                "--slo",
                slo,
                "--junit",
                str(junit),
                "--out",
                str(tmp_path / "o"),
            ]
        )
    assert res.returncode == code, res.stdout + res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("verdict: ") and f"exit {code}" in last
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["verdict"]["status"] == status and run["verdict"]["exit_code"] == code
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    failures = [c for c in cases if c.find("failure") is not None]
    errors = [c for c in cases if c.find("error") is not None]  # invalid: the run proves nothing
    assert int(suite.get("tests")) == len(cases) == len(run["verdict"]["checks"])
    assert int(suite.get("failures")) == len(failures) and int(suite.get("errors")) == len(errors)
    assert (code == 0) == (not failures and not errors)
    assert bool(errors) == (status == "invalid") and bool(failures) == (status not in ("pass", "invalid"))
    assert "Verdict:" in (tmp_path / "o" / "report.html").read_text()


def test_generator_health_fail_or_warn_from_the_profile_and_the_command_line(tmp_path: Path) -> None:
    """The profile's judging.generator_health, --generator-health over it: recorded in run.json; under
    fail the health checks block (exit 11 exactly when one fails), under warn they are reported but never
    block. (tests/test_slo_verdict.py forces the overload; here the plumbing, on whatever this machine does.)"""
    from loadtest.metrics.verdict import OVERLOADED

    prof = write_profile(tmp_path / "p.yaml", judging={"generator_health": "fail"})
    base = ["run", "--profile", str(prof)]
    with SimProcess(speedup=4) as sim:
        strict = run_cli([*base, "--host", sim.base_url, "--out", str(tmp_path / "f")], generator_health=None)
        lenient = run_cli(
            [*base, "--host", sim.base_url, "--generator-health", "warn", "--out", str(tmp_path / "w")]
        )
    runs = {}
    for key, res in (("fail", strict), ("warn", lenient)):
        run = json.loads((tmp_path / key[0] / "run.json").read_text())
        assert res.returncode == run["verdict"]["exit_code"], res.stdout + res.stderr
        assert run["config"]["judging"]["generator_health"] == key
        assert run["config"]["profile_resolved"]["judging"]["generator_health"] == key
        health = [c for c in run["verdict"]["checks"] if c["kind"] == "health"]
        assert "schedule_lag_p99" in {c["name"] for c in health}
        assert all(c["blocking"] is (key == "fail") for c in health)
        runs[key] = health
    unhealthy = [c for c in runs["fail"] if not c["passed"]]
    assert strict.returncode == (11 if unhealthy else 0), strict.stdout + strict.stderr
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    for c in runs["warn"]:  # a failed one is a warning line before the verdict line, which stays last
        assert (f"warning: {OVERLOADED} ({c['detail']})" in lenient.stdout) is not c["passed"]
    assert lenient.stdout.strip().splitlines()[-1].startswith("verdict: PASS")
    bad = run_cli([*base, "--generator-health", "maybe"])
    assert bad.returncode == 2 and "--generator-health" in bad.stderr
    typo = write_profile(tmp_path / "typo.yaml", judging={"generator_health": "ignore"})
    res = run_cli(["run", "--profile", str(typo)], generator_health=None)
    assert res.returncode == 2 and "judging.generator_health" in res.stderr, res.stderr


def test_bad_slo_is_a_usage_error(tmp_path: Path, small_profile: Path) -> None:
    res = run_cli(
        ["run", "--profile", str(small_profile), "--slo", "ttft_p99=fast", "--out", str(tmp_path / "o")]
    )
    assert res.returncode == 2 and "--slo" in res.stderr and "Traceback" not in res.stderr
