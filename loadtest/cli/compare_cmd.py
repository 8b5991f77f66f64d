"""`loadtest compare`: one side-by-side report (compare.html + compare.json) for runs and sweeps."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_DIFFERENT_WORKLOADS = 3
ALLOW_FLAG = "--allow-different-workloads"


def add_parser(sub: Any) -> None:
    cmp = sub.add_parser(
        "compare",
        help="compare runs or sweeps side by side: deltas with confidence intervals, overlaid charts",
    )
    cmp.add_argument(
        "paths", nargs="+", metavar="PATH", help="run folders (run.json) or sweep folders (sweep.json)"
    )
    cmp.add_argument(
        "--names", metavar="A,B,...", help="one label per PATH (default: run ids / folder names)"
    )
    cmp.add_argument(
        "-o",
        "--out",
        metavar="DIR|FILE.html",
        help="output folder (compare.html + compare.json) or an .html file (default: reports/compare-<time>/)",
    )
    cmp.add_argument(
        ALLOW_FLAG,
        action="store_true",
        help="compare even when the inputs sent different requests (the report says so loudly); "
        "the same profile and seed at another load level is compared without it, with a note",
    )
    cmp.add_argument(
        "--baseline",
        default="1",
        metavar="N|NAME",
        help="the input the others are compared with (default: 1)",
    )


def _fail(msg: str, code: int = EXIT_BAD_INPUT) -> int:
    print(f"loadtest compare: error: {msg}", file=sys.stderr)
    return code


def _outputs(out: str | None) -> tuple[Path, Path]:
    if out is None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        folder = Path("reports") / f"compare-{stamp}"
        return folder / "compare.html", folder / "compare.json"
    p = Path(out)
    if p.suffix.lower() in (".html", ".htm"):
        return p, p.with_suffix(".json")
    return p / "compare.html", p / "compare.json"


def _baseline(text: str, names: list[str]) -> int:
    if text in names:
        return names.index(text)
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"--baseline {text!r}: give a position 1..{len(names)} or one of {names}") from None
    if not 1 <= n <= len(names):
        raise ValueError(f"--baseline {n}: give a position 1..{len(names)}")
    return n - 1


def compare_command(args: argparse.Namespace) -> int:
    from loadtest.compare import CompareError, build_comparison, load_side
    from loadtest.compare.inputs import unique_names
    from loadtest.compare.workload import check_workloads

    paths = [Path(p) for p in args.paths]
    if len(paths) < 2:
        return _fail("give at least two run or sweep folders to compare")
    given = [n.strip() for n in args.names.split(",")] if args.names else [None] * len(paths)
    if len(given) != len(paths):
        return _fail(f"--names has {len(given)} names for {len(paths)} paths; give one name per path")
    try:
        sides = [load_side(p, n) for p, n in zip(paths, given, strict=True)]
        for side, name in zip(sides, unique_names([s.name for s in sides]), strict=True):
            side.name = name
        baseline = _baseline(str(args.baseline), [s.name for s in sides])
    except (CompareError, ValueError) as e:
        return _fail(str(e))
    check = check_workloads(sides, baseline)
    if not check.same:
        if not args.allow_different_workloads:
            return _fail(check.refusal(ALLOW_FLAG), EXIT_DIFFERENT_WORKLOADS)
        for d in check.differences:
            print(f"loadtest compare: WARNING: different workloads: {d}", file=sys.stderr)
    for d in check.load_differences:
        print(f"loadtest compare: note: {d}", file=sys.stderr)
    from loadtest.report.compare_report import write_compare_html

    html_path, json_path = _outputs(args.out)
    try:
        doc = build_comparison(sides, baseline, check, allowed=args.allow_different_workloads)
        write_compare_html(doc, sides, html_path)
        json_path.write_text(json.dumps(doc, indent=2, default=str), encoding="utf-8")
    except OSError as e:
        return _fail(f"cannot write {html_path.parent}: {e.strerror or e}")
    from loadtest.compare.headline import headlines

    for line in headlines(doc):
        print(line)
    print("(better / worse: the 95 % confidence interval excludes 0, in the metric's better direction)")
    print(f"compare.json: {json_path}")
    print(f"report:       {html_path}")
    return EXIT_OK
