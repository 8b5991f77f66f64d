"""`loadtest profiles list | show NAME|FILE | validate FILE...`: browse and check traffic profiles."""

from __future__ import annotations

import argparse
import sys
import textwrap

import yaml

from loadtest.errors import UsageError
from loadtest.profile.loader import ProfileError, load_profile, shipped_profiles
from loadtest.profile.schema import Profile

EXIT_OK, EXIT_INVALID = 0, 2


def describe_scenarios(profile: Profile) -> str:
    """Scenario names with their kind and share of the traffic."""
    shares = profile.scenario_weights()
    return ", ".join(
        f"{s.name} ({'dataset' if s.dataset is not None else s.kind}, {shares[s.name]:.0%})"
        for s in profile.scenarios
    )


LIST_WIDTH = 80  # a terminal's columns


def _list() -> int:
    """Each shipped profile in 80 columns: its name and load, then its description (and its scenarios,
    when it mixes several or reads a dataset) wrapped under it."""
    rows, rc = [], EXIT_OK
    for name in shipped_profiles():
        try:
            p, _ = load_profile(name)
            mixed = len(p.scenarios) > 1 or any(s.dataset is not None for s in p.scenarios)
            rows.append((name, p.load.describe(), describe_scenarios(p) if mixed else "", p.description))
        except ProfileError as e:
            rows.append((name, "INVALID", "", str(e).splitlines()[0]))
            rc = EXIT_INVALID
    if not rows:
        print("no shipped profiles (traffic_profiles/ is empty)")
        return rc
    width = max(len(r[0]) for r in rows) + 2
    print(f"{'NAME':<{width}}LOAD, then the description")
    for name, load, scenarios, description in rows:
        print("\n".join(textwrap.wrap(f"{name:<{width}}{load}", LIST_WIDTH, subsequent_indent=" " * width)))
        for text in (f"scenarios: {scenarios}" if scenarios else "", description):
            if text:
                print(
                    "\n".join(
                        textwrap.wrap(text, LIST_WIDTH, initial_indent="    ", subsequent_indent="    ")
                    )
                )
    return rc


def _show(name: str) -> int:
    try:
        profile, path = load_profile(name)
    except ProfileError as e:
        print(e, file=sys.stderr)
        return EXIT_INVALID
    print(f"# {path} (resolved: every default filled in)")
    print(yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False, allow_unicode=True), end="")
    return EXIT_OK


def _validate(files: list[str]) -> int:
    """Every check `run` makes before it connects, by the code `run` uses (run/inputs.prepare: the schema
    with its bounds and SLO units, the load options, judging, tokenizer, traces and datasets read, the
    first unit built), so that a profile `validate` passes is one `run` starts."""
    from loadtest.run import RunOptions, prepare

    rc = EXIT_OK
    for f in files:
        try:
            prepare(RunOptions(profile=f), run_folder=False)
            print(f"OK {f}")
        except UsageError as e:
            print(e, file=sys.stderr)
            rc = EXIT_INVALID
    return rc


def profiles_command(args: argparse.Namespace) -> int:
    """Dispatch `loadtest profiles ...`."""
    if args.profiles_command == "list":
        return _list()
    if args.profiles_command == "show":
        return _show(args.profile)
    return _validate(args.files)
