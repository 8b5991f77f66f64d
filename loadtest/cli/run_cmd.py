"""``loadtest run``: the command line read into loadtest/run's options, then prepare, connect (the given
host or the embedded engine), execute and finalize; one error line and its exit code on failure."""

from __future__ import annotations

import argparse
import contextlib
import textwrap

from loadtest.cli.run_options import endpoint_options, fail, run_options, telemetry_options
from loadtest.errors import LoadtestError
from loadtest.locust.ramp import plan_for
from loadtest.log_setup import configure_logging
from loadtest.metrics.judged import describe_warmup, judged_warmup_s
from loadtest.metrics.verdict import describe_judging
from loadtest.run import FinishedRun, connect, execute, finalize, prepare


def run_command(args: argparse.Namespace) -> int:
    configure_logging()
    options, endpoints = run_options(args), endpoint_options(args)
    try:
        prepared = prepare(options, endpoints=endpoints)
        settings, out = prepared.settings, prepared.out
        assert out is not None
        with contextlib.ExitStack() as stack:
            ep = connect(
                stack,
                prepared,
                endpoints,
                connect_timeout=options.connect_timeout,
                engine_log=out / "engine.log",
            )
            profile, duration = prepared.profile, settings.duration_s
            head = (
                f"running {profile.name} for {duration:g}s"
                + (f" or {settings.max_requests} requests" if settings.max_requests else "")
                + f": {profile.load.describe()}, "
                f"{settings.processes} process(es), model {ep.model}"
            )
            print("\n  ".join(textwrap.wrap(head, 78)))
            print(f"  writing {out}/")
            judged_s = max(0.0, duration - judged_warmup_s(profile.judging.warmup_s, duration))
            ramp = plan_for(profile.load, duration, settings.processes)
            for line in [
                *([ramp.describe()] if ramp is not None and ramp.seconds > 0 else []),
                describe_warmup(profile.judging.warmup_s, duration),
                *describe_judging(prepared.slos, profile.load.rate, judged_s),
            ]:
                print("\n".join(textwrap.wrap(line, 80, initial_indent="  ", subsequent_indent="    ")))
            executed = execute(prepared, ep, telemetry_options(args))
            results = finalize(
                FinishedRun(
                    settings,
                    profile,
                    prepared.workload,
                    prepared.slos,
                    executed.outcome,
                    out,
                    ep.facts(),
                    telemetry=executed.telemetry,
                    early_notes=[*ep.notes, *executed.notes],
                    junit=args.junit,
                )
            )
            for line in results.lines:
                print(line)
            return results.exit_code
    except LoadtestError as e:
        return fail(e)
