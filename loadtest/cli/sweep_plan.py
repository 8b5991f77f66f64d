"""`loadtest sweep --plan` and --mlperf-endpoints' inputs: the declarations from --endpoint-file and the v1.0 point plan."""

from __future__ import annotations

import argparse
import re

from loadtest.cli.run_options import fail
from loadtest.economics.spec import EndpointSpecError, load_endpoint_file
from loadtest.errors import UsageError
from loadtest.profile.loader import load_profile
from loadtest.profile.schema import Profile
from loadtest.run import EXIT_OK
from loadtest.sweep.disclosure import Declarations
from loadtest.sweep.rules import BENCHMARKS, Plan, plan_lines, plan_points

_WORD = re.compile(r"[^a-z0-9]")


def declarations(args: argparse.Namespace) -> Declarations:
    """--endpoint-file's ``system:``, ``system_power:`` and ``submission:`` (empty without a file)."""
    path = getattr(args, "endpoint_file", None)
    if not path:
        return Declarations()
    try:
        spec = load_endpoint_file(path)
    except EndpointSpecError as e:
        raise UsageError(str(e)) from e
    return Declarations(
        system=dict(spec.system or {}),
        system_power=dict(spec.system_power or {}),
        submission=dict(spec.submission or {}),
    )


def benchmark_of(decl: Declarations, profile: Profile) -> str | None:
    """The v1.0 benchmark model: the declared ``model_name``, else the one the profile's engine model
    spells (``llama-3.1-8b`` is ``llama3_1-8b``)."""
    if decl.model_name:
        return decl.model_name
    for name in (profile.model, profile.engine.model):
        spelled = _WORD.sub("", (name or "").lower().split("/")[-1])
        found = next((key for key in BENCHMARKS if _WORD.sub("", key) == spelled), None)
        if found:
            return found
    return None


def c_max_of(args: argparse.Namespace, decl: Declarations) -> int | None:
    """--c-max, else the declared ``system.max_supported_concurrency``."""
    return getattr(args, "c_max", None) or decl.c_max


def submission_plan(
    args: argparse.Namespace, profile: Profile, decl: Declarations, offline_concurrency: int | None
) -> Plan | None:
    """The v1.0 point plan for the declared C_max; None without one. UsageError for a C_max ≤ 32."""
    c_max = c_max_of(args, decl)
    if c_max is None:
        return None
    try:
        return plan_points(
            c_max, offline_concurrency=offline_concurrency, benchmark=benchmark_of(decl, profile)
        )
    except ValueError as e:
        raise UsageError(f"--c-max: {e}") from e


def print_plan(args: argparse.Namespace) -> int:
    """`loadtest sweep --plan`: the points, regions, durations and total time; nothing runs."""
    try:
        profile, _ = load_profile(args.profile)
        decl = declarations(args)
        plan = submission_plan(args, profile, decl, args.offline_concurrency)
        if plan is None:
            raise UsageError(
                "--plan needs the declared C_max; fix: --c-max N, or --endpoint-file with "
                "system.max_supported_concurrency"
            )
    except UsageError as e:
        return fail(e)
    for line in plan_lines(plan):
        print(line)
    return EXIT_OK
