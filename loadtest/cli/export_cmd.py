"""``loadtest export RUN_DIR``: per-request records and per-second series as CSV and/or Parquet."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadtest.results.record_log import record_files

FORMATS = ("csv", "parquet")  # loadtest.results.export writes these (pyarrow is imported only to export)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``export`` subcommand."""
    exp = sub.add_parser(
        "export", help="write a run's per-request records and per-second series as CSV and/or Parquet"
    )
    exp.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by 'loadtest run'")
    exp.add_argument("--format", choices=[*FORMATS, "all"], default="all", help="file format (default: all)")
    exp.add_argument("-o", "--out", metavar="DIR", help="folder for the files (default: RUN_DIR)")


def export_command(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(
            f"loadtest: error: {run_dir} is not a folder: give a run folder written by 'loadtest run'",
            file=sys.stderr,
        )
        return 2
    from loadtest.results.export import ExportError, export_run

    formats = FORMATS if args.format == "all" else (args.format,)
    out = Path(args.out) if args.out else run_dir
    try:
        written = export_run(run_dir, record_files(run_dir), formats, out)
    except ExportError as e:
        print(f"loadtest: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"loadtest: error: cannot write to {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0
