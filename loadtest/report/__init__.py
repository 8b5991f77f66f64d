"""Reports: the self-contained HTML run report and the plain-text console summary."""

from loadtest.report.console import format_summary
from loadtest.report.run_report import render_run_report

__all__ = ["format_summary", "render_run_report"]
