"""``loadtest ui``: Locust's web UI on a local runner, or a master over N workers (``--expect-workers``,
``--processes``), with a live LLM metrics tab and results per run."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from loadtest.cli.run_options import endpoint_options, fail, run_options
from loadtest.errors import LoadtestError, UsageError
from loadtest.locust.settings import RunSettings
from loadtest.log_setup import configure_logging
from loadtest.metrics.slo import merge_slos
from loadtest.profile.loader import ProfileError, load_profile
from loadtest.run import (
    EXIT_OK,
    EndpointFacts,
    EndpointOptions,
    FinishedRun,
    Prepared,
    RunOptions,
    connect,
    ensure_writable,
    finalize,
    open_endpoint,
    prepare,
)
from loadtest.run.inputs import with_judging

log = logging.getLogger("loadtest")


def _parse_auth(var: str | None) -> tuple[str, str] | None:
    """Web-login credentials from the environment variable named by --web-login (never the command line)."""
    if var is None:
        return None
    text = os.environ.get(var, "")
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise UsageError(f"--web-login {var}: set that environment variable to USER:PASSWORD")
    return user, password


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback interface (localhost, 127.0.0.0/8, ::1)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_port(host: str, port: int, options: str = "--web-host/--web-port") -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise UsageError(f"{options} {host}:{port}: {e.strerror or e}") from e


def _workers(args: argparse.Namespace) -> int:
    """How many workers run the users (0: the UI's own process): --expect-workers N or --processes N > 1."""
    if args.processes < 1:
        raise UsageError("--processes must be ≥ 1")
    if args.expect_workers is not None:
        if args.processes != 1:
            raise UsageError(
                "--expect-workers N and --processes N: give one (workers from anywhere, or local)"
            )
        if args.expect_workers < 1:
            raise UsageError("--expect-workers must be ≥ 1")
        return int(args.expect_workers)
    return int(args.processes) if args.processes > 1 else 0


def ui_command(args: argparse.Namespace) -> int:
    configure_logging()
    try:
        workers = _workers(args)
        options = run_options(args, processes=workers or 1)
        endpoints = endpoint_options(args)
        load_profile(args.profile)
        auth = _parse_auth(args.web_login)
        prepared = prepare(options, endpoints=endpoints, run_folder=False)
        if not _is_loopback(args.web_host) and auth is None:
            raise UsageError(
                f"--web-host {args.web_host} lets other machines reach the UI: add --web-login VAR "
                "(VAR holding USER:PASSWORD), or keep the default 127.0.0.1"
            )
        # informational: a UI run lasts until it is stopped
        prepared.settings.duration_s = prepared.profile.duration_s
        reports_root = ensure_writable(Path(args.reports_dir), "reports folder")
        _check_port(args.web_host, args.web_port)
        if args.expect_workers:
            _check_port(args.master_bind_host, args.master_port, "--master-bind-host/--master-port")
        with contextlib.ExitStack() as stack:
            ep = connect(
                stack, prepared, endpoints, connect_timeout=options.connect_timeout, check_context=False
            )
            # what each UI run records of the endpoint: its models and the embedded engine
            facts = EndpointFacts(ep.models, ep.engine_info)
            return _serve(args, options, prepared, facts, reports_root, auth, endpoints)
    except LoadtestError as e:
        return fail(e)


def _serve(
    args: argparse.Namespace,
    run_opts: RunOptions,
    prepared: Prepared,
    endpoint: EndpointFacts,
    reports_root: Path,
    auth: tuple[str, str] | None,
    endpoints: EndpointOptions,
) -> int:
    import gevent
    from gevent.event import Event
    from locust.argument_parser import get_parser
    from locust.env import Environment

    from loadtest.locust.runtime import user_class
    from loadtest.locust.ui_sources import LocalRuns, RunSource, WorkerRuns
    from loadtest.locust.webui import LlmWebUi

    settings, profile, api_key = prepared.settings, prepared.profile, prepared.api_key
    # Locust's web UI parses sys.argv for its own options on every page load: hide ours from it.
    sys.argv = sys.argv[:1]
    options = get_parser().parse_args([])
    closed = not profile.load.open_loop
    options.num_users = int(profile.load.concurrency or 1) if closed else settings.processes
    options.spawn_rate = max(1.0, float(options.num_users))
    env = Environment(user_classes=[user_class(profile)], host=settings.host, parsed_options=options)
    source: RunSource = LocalRuns()
    workers: WorkerRuns | None = None
    if settings.processes > 1 or args.expect_workers:
        workers = _master(env, args, settings, reports_root)
        source = workers
    runner = env.runner if workers is not None else env.create_local_runner()
    assert runner is not None

    polling: list[Any] = [None]  # this run's telemetry poller (docs/telemetry.md)

    def start_telemetry(st: RunSettings) -> None:
        from loadtest.client.apis import auth_headers
        from loadtest.telemetry import start_for_run

        if polling[0] is not None:
            polling[0].stop()
        polling[0] = None
        if not args.no_telemetry:
            embedded = endpoint.engine_info is not None and st.host == settings.host
            polling[0] = start_for_run(
                st.host,
                override=args.metrics_url,
                embedded=embedded,
                headers=auth_headers(api_key, profile),
                network=st.policy(),
            )

    # every endpoint a run may go to: the UI's own, and each host typed into the start form once checked
    facts_by_host: dict[str, EndpointFacts] = {settings.host: endpoint}

    def check_host(host: str) -> str | None:
        """A host typed into the start form, checked as `run` checks one: the model a run there asks for."""
        with contextlib.ExitStack() as stack:
            ep = open_endpoint(
                stack,
                dataclasses.replace(prepared, hosts=[host]),
                endpoints,
                connect_timeout=run_opts.connect_timeout,
            )
        facts_by_host[host] = ep.facts()
        return ep.model

    def finish(st: RunSettings, prof: Any, workload: Any, outcome: Any, out: Path, notes: list[str]) -> int:
        run_slos = merge_slos(prof.slos, args.slo)  # the profile chosen for this run may have its own
        prof = with_judging(prof, run_opts)  # --generator-health over the chosen profile's
        telemetry, polling[0] = polling[0], None
        results = finalize(
            FinishedRun(
                st,
                prof,
                workload,
                run_slos,
                outcome,
                out,
                facts_by_host.get(st.host, EndpointFacts(models=[])),
                telemetry=telemetry,
                early_notes=notes,
            )
        )
        for line in results.lines:
            print(line)
        return results.exit_code

    ui = LlmWebUi(
        env,
        settings,
        profile,
        profile.load.describe(),
        prepared.slos,
        reports_root,
        finish,
        args.drain_timeout,
        on_start=start_telemetry,
        profile_choices=_profile_choices(profile),
        source=source,
        check_host=check_host,
    )
    web_ui = env.create_web_ui(args.web_host, args.web_port, delayed_start=True, web_login=auth is not None)
    ui.install(auth)
    web_ui.start()

    stop = Event()
    reason: list[str] = []

    def on_signal(sig: int) -> None:
        if not reason:
            reason.append(signal.Signals(sig).name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, on_signal, sig)
    users = (
        "concurrent streams (closed loop; run.json records it as the run's load)"
        if closed
        else "ignored: the profile's schedule sets the load"
    )
    if workers is not None:
        where = (
            f"{settings.processes} local worker processes"
            if not args.expect_workers
            else f"{settings.processes} `loadtest worker --master-host <this host> --master-port "
            f"{args.master_port}` (listening on {args.master_bind_host}:{args.master_port})"
        )
        print(
            f"loadtest ui: every run's users on {where}; a start is refused until all are connected",
            flush=True,
        )
        if args.expect_workers and prepared.settings.embedded:
            print(
                f"loadtest ui: the embedded engine listens on {settings.host}: only workers on this host "
                "reach it (give --host an endpoint every worker can reach)",
                flush=True,
            )
    print(
        f"loadtest ui: http://{args.web_host}:{args.web_port}/  (live LLM dashboard: /llm)\n"
        f"profile {profile.name}: {profile.load.describe()}; the user count means {users}; "
        "another profile: the start form's Advanced options → Profile; "
        f"model {settings.model}; runs write {reports_root}/<timestamp>-{profile.name}/",
        flush=True,
    )
    stop.wait()
    print(f"{reason[0]} received: stopping", flush=True)
    started = time.monotonic()
    ui.interrupt(reason[0])
    runner.quit()  # a master: every worker is told to quit
    if workers is not None:
        workers.close()  # local worker processes ended by pid
    web_ui.stop()
    log.debug("ui stopped in %.1f s", time.monotonic() - started)
    return EXIT_OK


def _master(env: Any, args: argparse.Namespace, settings: RunSettings, reports_root: Path) -> Any:
    """A Locust master runner on ``env`` whose workers serve run after run (loadtest/locust/ui_sources.py):
    local processes (``--processes``, their logs ``ui-worker-<i>.log`` in the reports folder) or
    ``--expect-workers`` that join from anywhere."""
    from loadtest.locust.compat import check_locust_version
    from loadtest.locust.master import MasterSession, free_port, master_runner
    from loadtest.locust.ui_sources import WorkerRuns

    check_locust_version()  # the distributed mode uses Locust's dispatcher (locust/compat.py)
    local = not args.expect_workers
    bind, port = ("127.0.0.1", free_port()) if local else (args.master_bind_host, args.master_port)
    try:
        runner = master_runner(env, bind, port)
    except RuntimeError as e:
        raise LoadtestError(str(e)) from e
    session = MasterSession(settings, runner, env, settings.processes, serve_many=True)
    return WorkerRuns(session, bind, port, args.worker_timeout, local, reports_root, log_prefix="ui-")


def _profile_choices(profile: Any) -> list[str]:
    """The start form's "Profile" choices: the profile the UI started with, then the shipped profiles of
    the same load model (closed or open loop), since that fixes the Locust user class."""
    from loadtest.profile.loader import shipped_profiles

    open_loop = profile.load.open_loop
    choices = [profile.name]
    for name in shipped_profiles():
        try:
            if name != profile.name and load_profile(name)[0].load.open_loop == open_loop:
                choices.append(name)
        except ProfileError:
            continue
    return choices
