"""The command line: help on every option, one vocabulary across run/ui/master/sweep, close-match
suggestions for typos, and the engine's own `serve sim` usage."""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.cli.main import build_parser
from loadtest.cli.serve_cmd import build_parser as serve_parser
from loadtest.serve import ENGINES
from loadtest.sim import SimProcess
from loadtest.sim.__main__ import build_parser as sim_parser
from tests.conftest import CLI, interrupt_when

# The options the commands that run load share, by command (cli/common_options.py).
SHARED = {
    "workload": ("--profile", "--model", "--api-key-env", "--api-key-file", "--tokenizer", "--seed",
                 "--slo", "--warmup", "--cooldown", "--generator-health", "--smoke"),
    "client": ("--connect-timeout", "--read-timeout", "--total-timeout", "--retries", "--insecure",
               "--ca-bundle"),
    "telemetry": ("--no-telemetry", "--metrics-url", "--metrics-api-key-env"),
    "engine": ("--engine-gpu", "--engine-model", "--engine-tp", "--engine-faults", "--engine-speedup",
               "--engine-max-num-seqs"),
}  # fmt: skip
LOAD_COMMANDS = {
    "run": ("workload", "client", "telemetry", "engine"),
    "ui": ("workload", "client", "telemetry", "engine"),
    "master": ("workload", "client", "telemetry"),
    "sweep": ("workload", "client", "telemetry", "engine"),
}


def _subparsers(
    parser: argparse.ArgumentParser, path: str = "loadtest"
) -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser by its command line, nested ones too (``loadtest profiles show``)."""
    out = {path: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out |= _subparsers(sub, f"{path} {name}")
    return out


def _all_parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = _subparsers(build_parser())
    parsers |= {f"loadtest serve {e}": serve_parser(e) for e in ENGINES}
    parsers["loadtest serve sim"] = sim_parser("loadtest serve sim")
    return parsers


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        s: a
        for a in parser._actions
        for s in a.option_strings
        if s.startswith("--") and a.help != argparse.SUPPRESS
    }


def test_every_option_and_argument_has_help_and_a_named_metavar() -> None:
    """Every option (and positional) of every command says what it is; a value's metavar is a word of
    its own (N, S, URL), never argparse's upper-cased option name (ENGINE_GPU)."""
    parsers = _all_parsers()
    assert {"loadtest run", "loadtest ui", "loadtest sweep", "loadtest profiles show",
            "loadtest serve vllm", "loadtest serve sim"} <= set(parsers)  # fmt: skip
    missing, derived = [], []
    for path, parser in parsers.items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
                continue
            name = (action.option_strings or [action.dest])[-1]
            if not (action.help or "").strip() or action.help.strip().startswith("(default"):
                missing.append(f"{path} {name}")
            takes_value = action.nargs != 0 and action.option_strings and not action.choices
            if takes_value and action.metavar is None:
                derived.append(f"{path} {name}")
    assert missing == [], missing
    assert derived == [], derived


def test_one_vocabulary_across_the_load_commands() -> None:
    """run, ui, master and sweep share each common option with the same help, metavar and type; every
    one of them writes to -o/--out; the commonest options have short forms."""
    parsers = _all_parsers()
    seen: dict[str, tuple[object, ...]] = {}
    for command, groups in LOAD_COMMANDS.items():
        opts = _options(parsers[f"loadtest {command}"])
        for group in groups:
            for flag in SHARED[group]:
                a = opts[flag]
                # the help names what is judged ("the run", "a point"): compare it without that
                text = (a.help or "").replace("a point", "X").replace("the run", "X").replace("a run", "X")
                same = (text, a.metavar, a.type, a.default, a.option_strings)
                assert seen.setdefault(flag, same) == same, (command, flag)
        assert "--out" in opts and "-o" in opts["--out"].option_strings, command
        assert "-p" in opts["--profile"].option_strings and "-H" in opts["--host"].option_strings
    for flag in ("--hosts-file", "--balance"):  # a fleet of replicas, in run and ui alike
        assert _options(parsers["loadtest run"])[flag].help == _options(parsers["loadtest ui"])[flag].help
    run = _options(parsers["loadtest run"])
    for short, flag in (("-d", "--duration"), ("-c", "--concurrency"), ("-r", "--rate"), ("-m", "--model")):
        assert short in run[flag].option_strings


@pytest.mark.parametrize(
    ("argv", "command", "hint"),
    [
        (["rn"], "loadtest", "did you mean run?"),
        (["run", "--duraton", "5"], "loadtest run", "--duraton: did you mean --duration?"),
        (["sweep", "--point-duraton", "5"], "loadtest sweep", "did you mean --point-duration?"),
        (["sweep", "--ladder", "rat"], "loadtest sweep", "did you mean rate?"),
        (["profiles", "lst"], "loadtest profiles", "did you mean list?"),
        (["ui", "--web-prot", "1"], "loadtest ui", "did you mean --web-port"),
    ],
)
def test_typos_get_the_closest_match_and_their_own_commands_usage(
    argv: list[str], command: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"{command}: error: ") and hint in last, err
    assert err.startswith(f"usage: {command} "), err  # the subcommand's usage, not the top level's


def test_a_mistyped_profile_name_is_answered_with_the_closest_shipped_one(tmp_path: object) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loadtest.cli.main", "run", "-p", "interactiv-chat", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "unknown profile 'interactiv-chat' (did you mean interactive-chat?)" in r.stderr, r.stderr


def test_serve_sim_help_names_its_own_command() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loadtest.cli.main", "serve", "sim", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.startswith("usage: loadtest serve sim "), r.stdout[:200]
    assert "python -m loadtest.sim" not in r.stdout


def test_ui_checks_every_replica_of_its_fleet(tmp_path: Path) -> None:
    """`loadtest ui` takes --host several times and --hosts-file like `run`: a replica that does not
    answer GET /v1/models stops it before the UI starts, with one line naming that replica."""
    sim = SimProcess(speedup=4.0, stderr_path=tmp_path / "engine.log")
    sim.start()
    try:
        fleet = tmp_path / "hosts.txt"
        fleet.write_text("# the second replica\nhttp://127.0.0.1:9\n")
        r = subprocess.run(
            [*CLI, "ui", "-H", sim.base_url, "--hosts-file", str(fleet), "--balance", "least-outstanding",
             "-o", str(tmp_path / "reports"), "--web-port", "0"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
    finally:
        sim.stop()
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("loadtest: error: replica http://127.0.0.1:9"), r.stderr


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "sigint-ignored-at-start"])
def test_ctrl_c_before_the_load_starts_is_one_line_and_exit_130(tmp_path: Path, background: bool) -> None:
    """A SIGINT while the endpoint check still waits for an answer: no traceback, nothing recorded; also
    when the command started with SIGINT ignored (a shell's background job), which Python leaves ignored."""
    server = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never answers
    accepted: list[socket.socket] = []
    try:
        port = server.getsockname()[1]
        server.settimeout(0.2)

        def connected() -> bool:
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                return False
            return True

        cmd = [
            *CLI,
            "run",
            "--host",
            f"http://127.0.0.1:{port}",
            "--duration",
            "2",
            "--out",
            str(tmp_path / "r"),
        ]
        code, out, err = interrupt_when(cmd, connected, signal.SIGINT, sigint_ignored=background)
    finally:
        for s in (*accepted, server):
            s.close()
    assert code == 130, (out, err)
    assert "Traceback" not in err and "interrupted (Ctrl-C) before any request was sent" in err, err
    assert not (tmp_path / "r" / "run.json").exists()
