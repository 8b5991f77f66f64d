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
    convention = getattr(args, "convention", None)
    if convention in ("endpoints", "loadgen"):
        return _convention(run_dir, convention)
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


def _convention(run_dir: Path, convention: str) -> int:
    """One convention's file of a run folder, recomputed from run.json and the record log; the exit code."""
    from loadtest.contracts.run_document import RunDocumentError, read_run_document
    from loadtest.results.mlperf_detail import write_loadgen_logs
    from loadtest.sweep.submission import endpoints_of, result_summary, write_json

    try:
        run = read_run_document(run_dir)
    except RunDocumentError as e:
        print(f"loadtest: error: {e}", file=sys.stderr)
        return 2
    try:
        if convention == "loadgen":
            print("\n".join(str(path) for path in write_loadgen_logs(run_dir, run)))
            return 0
        figures = endpoints_of(run, run_dir)
        summary = result_summary(run, str(run_dir.resolve()), figures)
        path = run_dir / "result_summary.json"
        write_json(path, summary)
    except OSError as e:
        print(f"loadtest: error: cannot write into {run_dir}: {e.strerror or e}", file=sys.stderr)
        return 1
    ttft = figures.percentile_ms(figures.ttft_ns, 90.0)
    tpot = figures.percentile_ms(figures.tpot_ns, 90.0)
    print(
        f"endpoints: {figures.completed} of {figures.issued} issued completed; TTFT P90 {_ms(ttft)}, "
        f"TPOT P90 {_ms(tpot)}, tps_per_user {_num(figures.tps_per_user)}, system_tps {_num(figures.tps)}"
    )
    for note in figures.notes():
        print(f"  note: {note}")
    print(path)
    return 0


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f} ms"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _submission(sweep_dir: Path, tree: Path, endpoint_file: str | None) -> int:
    """The sweep's MLPerf Endpoints submission tree (docs/sweep.md); the exit code."""
    from loadtest.cli.sweep_plan import declarations
    from loadtest.errors import UsageError
    from loadtest.sweep import SweepFormatError, load_sweep
    from loadtest.sweep.disclosure import missing, missing_text
    from loadtest.sweep.model import read_run_json, sweep_root
    from loadtest.sweep.submission import SubmissionError, write_submission

    if (tree / "results").exists():
        print(
            f"loadtest: error: --mlperf-endpoints {tree} already holds results/: give a new folder",
            file=sys.stderr,
        )
        return 2
    try:
        decl = declarations(argparse.Namespace(endpoint_file=endpoint_file))
        doc = load_sweep(sweep_dir)
        runs = (read_run_json(sweep_root(sweep_dir) / p.dir) for p in doc.points if p.status == "completed")
        seed_set = next((r.config.seed_set.set for r in runs if r is not None and r.config.seed_set), None)
        gaps = missing(decl, seed_set)
        if gaps:
            raise UsageError(missing_text(f"--endpoint-file {endpoint_file or '(not given)'}", gaps))
        written = write_submission(sweep_dir, doc, tree, decl)
    except (UsageError, SweepFormatError, SubmissionError) as e:
        print(f"loadtest: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"loadtest: error: cannot write {tree}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"{written.curve} ({len(written.points)} points)")
    for why in written.left_out:
        print(f"  left out {why}")
    return 0
