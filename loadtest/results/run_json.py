"""run.json: the self-describing result of a run (schema in docs/run-json.md)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest import __version__
from loadtest.metrics import hdr
from loadtest.metrics.recorder import RunAggregates
from loadtest.metrics.summary import build_metrics

SCHEMA_VERSION = 1


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
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "loadtest", "version": __version__},
        "run_id": run_id,
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "status": status,
        "interrupted_reason": interrupted_reason,
        "config": config,
        "endpoint": endpoint,
        "workload": {"fingerprint": fingerprint},
        "metrics": build_metrics(aggregates.all),
        "scenarios": {name: build_metrics(agg) for name, agg in sorted(aggregates.scenarios.items())},
        "histograms": {n: hdr.encode(h) for n, h in aggregates.all.hists.items() if h.get_total_count()},
        "files": {"records": record_files, "report": "report.html"},
        "notes": notes or [],
    }


def write_run_json(run_dir: Path, doc: dict[str, Any]) -> Path:
    """Write atomically: a reader never sees half a file."""
    path = run_dir / "run.json"
    tmp = run_dir / ".run.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, path)
    return path


def read_run_json(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())
