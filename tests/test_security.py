"""Secrets and untrusted input: a planted API key appears nowhere a run writes or serves; profiles are data."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from loadtest.client.secrets import REDACTED, install_redaction, redact_echoes, snippet
from tests.conftest import CLI, read_lines, run_cli, write_profile
from tests.fault_servers import FaultServer
from tests.test_webui import CHROMIUM, _dump_dom, _free_port, _get, _post, _wait_for

KEY = "sk-PLANTED-4c0ffee-9d1e-5ec2e7-do-not-leak"
SCHEDULE = ["ok", "ok", "auth_echo"]  # the 401 echoes the Authorization header back, key included


def _files_text(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file())


@pytest.mark.parametrize(("source", "processes"), [("file", 1), ("env", 2)])
def test_planted_key_never_leaks_from_a_run(tmp_path: Path, source: str, processes: int) -> None:
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 3}, duration_s=1.5)
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n")
    env = dict(os.environ, LT_PLANTED_KEY=KEY)
    env.pop("OPENAI_API_KEY", None)
    how = ["--api-key-file", str(key_file)] if source == "file" else ["--api-key-env", "LT_PLANTED_KEY"]
    out = tmp_path / "out"
    with FaultServer(SCHEDULE) as srv:
        res = subprocess.run(
            [*CLI, "run", "--profile", str(prof), "--host", srv.base_url, *how]
            + ["--processes", str(processes), "--out", str(out)]
            + ["--slo", "error_rate=50%"],  # one in three is the 401 echo, on purpose: over the default 1 %
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
        )
        seen = list(srv.authorization)
    assert res.returncode == 0, res.stderr
    assert seen and all(a == f"Bearer {KEY}" for a in seen)  # the key was used on every request
    echoed = [r for r in read_lines(sorted(out.glob("records*.jsonl"))) if r["status"] == 401]
    assert echoed and all(REDACTED in r["error"] for r in echoed)  # the server's echo, redacted
    for text, where in ((res.stdout + res.stderr, "console"), (_files_text(out), "run folder")):
        assert KEY not in text, where
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["api_key_file" if source == "file" else "api_key_env"]


def test_planted_key_never_leaks_from_the_web_ui(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "ui-chat.yaml", name="ui-chat", load={"concurrency": 2})
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "ui.log"
    reports = tmp_path / "reports"
    responses: list[str] = []
    with FaultServer(SCHEDULE) as srv, log.open("wb") as logf:
        proc = subprocess.Popen(
            [*CLI, "ui", "--profile", str(prof), "--host", srv.base_url, "--api-key-file", str(key_file)]
            + ["--web-port", str(port), "--reports-dir", str(reports)],
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_for("the UI", lambda: _get(base + "/")[0] == 200, 30, proc, log)
            assert _post(base + "/swarm", {"user_count": 2, "spawn_rate": 2, "host": ""})["success"]
            _wait_for("some requests", lambda: len(srv.truth) >= 6, 30, proc, log)
            for path in ("/", "/llm", "/llm/stats", "/stats/requests", "/stats/report"):
                with urllib.request.urlopen(base + path, timeout=10) as r:
                    responses.append(r.read().decode(errors="replace"))
            if CHROMIUM is not None:
                responses.append(_dump_dom(base + "/llm", tmp_path / "chromium"))
            assert _post(base + "/stop")["success"]
            _wait_for("the run's folder", lambda: list(reports.glob("*/run.json")), 60, proc, log)
            with urllib.request.urlopen(base + "/llm/report", timeout=10) as r:
                responses.append(r.read().decode(errors="replace"))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        assert any(a == f"Bearer {KEY}" for a in srv.authorization)
    assert any(b == "auth_echo" for b in srv.truth.values())
    assert all(KEY not in r for r in responses)
    assert KEY not in log.read_text(errors="replace")
    assert KEY not in _files_text(reports)


def test_redaction_covers_every_logger_and_exception(caplog: pytest.LogCaptureFixture) -> None:
    install_redaction("sk-unit-redaction-secret")
    with caplog.at_level(logging.WARNING):
        logging.getLogger("locust.runners").warning("header Bearer %s", "sk-unit-redaction-secret")
        try:
            raise ValueError("bad key sk-unit-redaction-secret")
        except ValueError:
            logging.getLogger("any.other").exception("failed")
    text = caplog.text
    assert "sk-unit-redaction-secret" not in text and text.count(REDACTED) >= 2


def test_web_ui_off_loopback_needs_a_login(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p.yaml")
    res = run_cli(["ui", "--profile", str(prof), "--web-host", "0.0.0.0", "--reports-dir", str(tmp_path)])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "--web-login" in res.stderr


def test_profiles_are_data_not_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.yaml"
    evil.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\nload: {{concurrency: 1}}\n")
    res = run_cli(["run", "--profile", str(evil), "--out", str(tmp_path / "o")])
    assert res.returncode == 2 and str(evil) in res.stderr and "Traceback" not in res.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("load.trace.path", {"load": {"trace": {"path": "../../../etc/passwd", "format": "azure"}}}),
        ("tokenizer", {"tokenizer": "../elsewhere/tokenizer.json"}),
    ],
)
def test_profile_paths_may_not_leave_the_profile_folder(tmp_path: Path, field: str, value: dict) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    prof = write_profile(folder / "p.yaml", **value)
    res = run_cli(["profiles", "validate", str(prof)])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    msg = res.stdout + res.stderr
    assert str(prof) in msg and field in msg and "leaves the profile's folder" in msg


def test_a_key_echoed_across_the_snippet_cut_or_an_unknown_token_never_leaks(tmp_path: Path) -> None:
    """The error snippet is redacted before it is cut; bearer-like tokens the server echoes go too."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 2}, duration_s=2)
    out = tmp_path / "out"
    with FaultServer(["ok", "auth_echo_cut"]) as srv:
        res = run_cli(
            ["run", "--profile", str(prof), "--host", srv.base_url, "--api-key-file", str(key_file)]
            + ["--out", str(out)]
        )
    errors = [r["error"] for r in read_lines([out / "records.jsonl"]) if r["outcome"] == "http_4xx"]
    assert errors and all(e.startswith("HTTP 401: xxx") for e in errors), errors[:2]
    text = _files_text(out) + res.stdout + res.stderr
    for part in (KEY[:10], KEY[-10:], "0therS3cret"):
        assert part not in text, part


def test_credentials_in_the_host_url_are_refused_and_never_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_cli(
        ["run", "--host", "http://user:hunter2pw@127.0.0.1:9", "--duration", "1", "--out", str(out)]
    )
    assert res.returncode == 2 and "credentials in the URL" in res.stderr
    assert "hunter2pw" not in res.stdout + res.stderr + (_files_text(out) if out.exists() else "")


def test_a_yaml_expansion_bomb_and_an_oversized_profile_are_refused_at_once(tmp_path: Path) -> None:
    levels = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):  # 9^9 values from 628 bytes
        prev, cur = chr(96 + i), chr(97 + i)
        levels.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\n")
    res = run_cli(["profiles", "validate", str(bomb)], timeout=60)
    assert res.returncode == 2 and "expansion bomb" in res.stdout + res.stderr
    big = tmp_path / "big.yaml"
    big.write_text("name: big\n# " + "x" * (5 * 2**20) + "\n")
    res = run_cli(["profiles", "validate", str(big)], timeout=60)
    assert res.returncode == 2 and "is not a profile" in res.stdout + res.stderr


@pytest.mark.parametrize("name", ["..", "sub-link"])
def test_a_bare_tokenizer_name_is_a_path_inside_the_profile_folder(tmp_path: Path, name: str) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "sub-link").symlink_to(outside, target_is_directory=True)
    prof = write_profile(folder / "p.yaml", tokenizer=name)
    res = run_cli(["profiles", "validate", str(prof)], timeout=60)
    assert res.returncode == 2 and "leaves the profile's folder" in res.stdout + res.stderr


SPACED_KEY = "sk-PART-4c0ffee-9d1e 5ec2e7-do-not-leak-77"  # a key with a space: servers echo what follows it


def _fragments(key: str, n: int = 6) -> set[str]:
    return {key[i : i + n] for i in range(len(key) - n + 1)}


def test_redaction_covers_every_run_of_six_characters_of_the_key() -> None:
    key = SPACED_KEY
    text = f"part {key.split(' ')[1]!r}, fragment {key[3:16]}, tail {key[-6:]}, ok words stay"
    clean = redact_echoes(text, (key,))
    assert not [f for f in _fragments(key) if f in clean], clean
    assert "ok words stay" in clean and clean.count(REDACTED) == 3
    assert redact_echoes("sk-PAR", (key,)) == REDACTED and redact_echoes("sk-PA", (key,)) == "sk-PA"
    install_redaction(key)  # as every run process does: snippets of server bytes are redacted, then cut
    cut = snippet(b"x" * 150 + key[5:30].encode(), 160)
    assert not [f for f in _fragments(key) if f in cut], cut


def test_no_part_of_the_key_leaks_when_a_server_echoes_parts_of_it(tmp_path: Path) -> None:
    """A 401 echoing what follows the key's space and 13 of its characters, and an answer echoing the whole
    header: no 6 consecutive characters of the key in any file of the run folder, stdout or stderr."""
    key_file = tmp_path / "key"
    key_file.write_text(SPACED_KEY + "\n")
    prof = write_profile(tmp_path / "p.yaml", load={"concurrency": 2}, duration_s=2)
    out = tmp_path / "out"
    with FaultServer(["ok", "auth_echo_part", "key_in_answer"]) as srv:
        res = run_cli(
            ["run", "--profile", str(prof), "--host", srv.base_url, "--api-key-file", str(key_file)]
            + ["--out", str(out), "--capture", "50", "--slo", "error_rate=80%"]
        )
        seen = list(srv.authorization)
    assert seen and all(a == f"Bearer {SPACED_KEY}" for a in seen)
    records = read_lines([out / "records.jsonl"])
    echoed = [r for r in records if r["status"] == 401]
    assert echoed and all("token part" in r["error"] and REDACTED in r["error"] for r in echoed)
    assert (out / "capture.jsonl").exists()
    files = {p.name: p.read_text(errors="replace") for p in sorted(out.rglob("*")) if p.is_file()}
    files["stdout+stderr"] = res.stdout + res.stderr
    leaks = {(name, f) for name, text in files.items() for f in _fragments(SPACED_KEY) if f in text}
    assert not leaks, sorted(leaks)[:5]


@pytest.mark.parametrize(
    ("source", "key", "kind"),
    [("env", "sk-ключ-0123456789", "non-Latin-1"), ("file", "sk-abc\x07def-0123456789", "control")],
)
def test_a_key_that_cannot_be_sent_in_a_header_is_refused_at_start(
    tmp_path: Path, source: str, key: str, kind: str
) -> None:
    """Exit 2 with one line naming where the key came from and the fix, before any request (the preflight
    included), the key itself never printed."""
    key_file = tmp_path / "key"
    key_file.write_text(key)
    env = dict(os.environ, LT_BAD_KEY=key)
    how = ["--api-key-file", str(key_file)] if source == "file" else ["--api-key-env", "LT_BAD_KEY"]
    prof = write_profile(tmp_path / "p.yaml", duration_s=1)
    with FaultServer(["ok"]) as srv:
        res = subprocess.run(
            [*CLI, "run", "--profile", str(prof), "--host", srv.base_url, *how, "--out", str(tmp_path / "o")],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        connections = srv.connections
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and kind in lines[0] and "HTTP header" in lines[0], res.stderr
    assert (str(key_file) if source == "file" else "LT_BAD_KEY") in lines[0]
    assert not [f for f in _fragments(key) if f in res.stdout + res.stderr]
    assert connections == 0  # refused before the preflight: not one connection to the endpoint
