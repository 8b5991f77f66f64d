"""``loadtest report RUN_DIR``: rebuild a run's HTML report from run.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadtest.report import render_run_report


def report_command(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "run.json").is_file():
        print(
            f"loadtest: error: {run_dir}/run.json not found: give a run folder written by 'loadtest run'",
            file=sys.stderr,
        )
        return 2
    print(render_run_report(run_dir))
    return 0
