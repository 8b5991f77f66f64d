"""run.json's first draft: the sections known when the load ends, before the record log is read
(the typed document and its reader and writer: loadtest/contracts/run_document.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from loadtest import __version__
from loadtest.contracts.run_document import SCHEMA_VERSION
from loadtest.metrics import hdr
from loadtest.metrics.recorder import RunAggregates
from loadtest.metrics.summary import build_metrics


def build_run_document(
    *,
    run_id: str,
    status: str,
    interrupted_reason: str | None,
    config: dict[str, Any],
    endpoint: dict[str, Any],
    fingerprint: str,
    aggregates: RunAggregates,
    record_files: list[str],
    notes: list[str] | None = None,
    datasets: dict[str, Any] | None = None,
) -> dict[str, Any]:
    workload: dict[str, Any] = {"fingerprint": fingerprint}
    if datasets:
        workload["datasets"] = datasets
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "loadtest", "version": __version__},
        "run_id": run_id,
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "status": status,
        "interrupted_reason": interrupted_reason,
        "config": config,
        "endpoint": endpoint,
        "workload": workload,
        "metrics": build_metrics(aggregates.all),
        "scenarios": {name: build_metrics(agg) for name, agg in sorted(aggregates.scenarios.items())},
        "histograms": {n: hdr.encode(h) for n, h in aggregates.all.hists.items() if h.get_total_count()},
        "files": {"records": record_files, "report": "report.html"},
        "notes": notes or [],
        "metric_convention": "loadtest",
    }
