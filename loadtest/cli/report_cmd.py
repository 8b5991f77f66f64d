"""``loadtest report DIR``: rebuild a run's report.html from run.json, or a sweep's sweep.html from sweep.json."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loadtest.report import render_run_report
from loadtest.results.mlperf_summary import SUMMARY_NAME


def report_command(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    tree = getattr(args, "mlperf_endpoints", None)
    if (run_dir / "sweep.json").is_file():
        from loadtest.report.sweep_report import render_sweep_report
        from loadtest.sweep import SweepFormatError

        try:
            print(render_sweep_report(run_dir))
        except SweepFormatError as e:
            print(f"loadtest: error: {e}", file=sys.stderr)
            return 2
        return _submission(run_dir, Path(tree), getattr(args, "endpoint_file", None)) if tree else 0
    if tree:
        print(
            f"loadtest: error: --mlperf-endpoints needs a sweep folder, and {run_dir} has no sweep.json",
            file=sys.stderr,
        )
        return 2
    if not (run_dir / "run.json").is_file():
        print(
            f"loadtest: error: {run_dir}/run.json not found: give a run folder written by 'loadtest run'",
            file=sys.stderr,
        )
        return 2
    try:
        report = render_run_report(run_dir)
    except json.JSONDecodeError as e:
        print(
            f"loadtest: error: {run_dir}/run.json is not valid JSON ({e}): rerun the test or restore the file",
            file=sys.stderr,
        )
        return 2
    except OSError as e:
        print(f"loadtest: error: cannot write the report into {run_dir}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(report)
    print(run_dir / SUMMARY_NAME)
    return 0


def _submission(sweep_dir: Path, tree: Path, endpoint_file: str | None) -> int:
    """The sweep's MLPerf Endpoints submission tree (docs/sweep.md); the exit code."""
    from loadtest.economics.spec import EndpointSpecError, load_endpoint_file
    from loadtest.sweep import SweepFormatError, load_sweep
    from loadtest.sweep.submission import SubmissionError, write_submission

    if (tree / "results").exists():
        print(
            f"loadtest: error: --mlperf-endpoints {tree} already holds results/: give a new folder",
            file=sys.stderr,
        )
        return 2
    try:
        system = (load_endpoint_file(endpoint_file).system or {}) if endpoint_file else {}
        written = write_submission(sweep_dir, load_sweep(sweep_dir), tree, system)
    except (EndpointSpecError, SweepFormatError, SubmissionError) as e:
        print(f"loadtest: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"loadtest: error: cannot write {tree}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"{written.curve} ({len(written.points)} points)")
    for why in written.left_out:
        print(f"  left out {why}")
    return 0
