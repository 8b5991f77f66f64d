"""An MLPerf Endpoints v1.0 submission tree (``results/<system>/<model>/r<N>/``) from a sweep's concurrency points."""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from loadtest.contracts.run_document import ReportingWindow, RunDocument
from loadtest.contracts.sweep_document import SweepDocument
from loadtest.metrics.endpoints import (
    JUDGED_TTFT_PERCENTILE,
    EndpointsFigures,
    endpoints_figures,
    percentile_key,
    summary_metrics,
)
from loadtest.metrics.window import stands
from loadtest.results.record_log import read_lines, record_files
from loadtest.sweep.model import read_run_json, sweep_root

FORMAT_VERSION = "1.0"
POINT_FILES = ("point.yaml", "result_summary.json", "accuracy_results.json", "system_desc.json")
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


class SubmissionError(ValueError):
    """A submission tree that cannot be written; the message names the folder and the fix."""


@dataclass
class Written:
    """The tree written: its root, the curve folder, one ``r<N>`` per point, and the points left out."""

    root: Path
    curve: Path
    points: list[Path] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


def slug(text: str) -> str:
    """A path segment safe in a folder name and the visualizer's ids."""
    return _SLUG.sub("-", text).strip("-") or "unknown"


def endpoints_of(run: RunDocument, run_dir: Path) -> EndpointsFigures:
    """The point's ``endpoints`` figures from its record log: over the reporting window when it stands,
    else over the judged window when it had one."""
    standing = endpoints_window(run)
    judged = run.judged
    window: tuple[float, float] | None = None
    if standing is not None and standing.start is not None and standing.end is not None:
        window = (standing.start, math.nextafter(standing.end, math.inf))  # the window is [start, end]
    elif judged is not None:
        window = (judged.window.start, judged.window.end)
    return endpoints_figures(read_lines(record_files(run_dir)), window)


def endpoints_window(run: RunDocument) -> ReportingWindow | None:
    """The run's MLPerf Endpoints reporting window when its figures stand (status ``windowable``,
    verdict ``STEADY STATE``); None: the Endpoints figures are the whole run's (``total``)."""
    w = run.reporting_window
    if w is None or not stands(w.status, w.verdict) or w.start is None:
        return None
    return w


def _window_block(run: RunDocument, used: ReportingWindow | None) -> dict[str, Any]:
    """result_summary.json ``reporting_window``: which basis the figures use, the window's words and bounds."""
    w = run.reporting_window
    block: dict[str, Any] = {"basis": "window" if used is not None else "total"}
    if w is not None:
        block.update(
            status=w.status,
            verdict=w.verdict,
            start_issue_ns=None if w.start is None else round(w.start * 1e9),
            end_issue_ns=None if w.end is None else round(w.end * 1e9),
            super_pass_size=w.super_pass_size,
            passes=w.passes,
            system_tps=w.system_tps,
        )
    return block


def result_summary(run: RunDocument, run_rel: str, figures: EndpointsFigures) -> dict[str, Any]:
    """``result_summary.json`` in the reference client's ``Report`` schema, every figure in the
    ``endpoints`` convention (``metric_convention``; docs/metrics.md, "Conventions"), with the figures
    the visualizer reads (``system_tps``, ``tps_per_user``, ``qps``, the ttft block) and loadtest's notes;
    ``figures``: over the reporting window when it stands, else the judged window (``endpoints_of``), and
    ``system_tps`` / ``tps_per_user`` the window's own when it stands (``reporting_window.basis``)."""
    judging = run.config.profile_resolved.get("judging") or {}
    window = endpoints_window(run)
    out: dict[str, Any] = {
        "version": f"{run.tool.name} {run.tool.version}",
        "git_sha": _git_sha(),
        "test_started_at": _started_ns(run),
        "metric_convention": "endpoints",
        "state": "complete" if run.status == "completed" else run.status,
        "complete": run.status == "completed",
    }
    out.update(summary_metrics(figures))
    if window is not None and window.system_tps is not None:
        out["tps"] = out["system_tps"] = window.system_tps
        if window.tps_per_user is not None:
            out["tps_per_user"] = window.tps_per_user
    out["reporting_window"] = _window_block(run, window)
    out["legacy_loadgen_window_duration_ns"] = None
    out["judged_ttft_percentile"] = percentile_key(JUDGED_TTFT_PERCENTILE)
    out["run_config"] = {
        "type": "offline" if "offline" in run.config.profile else "concurrency",
        "concurrency": run.config.load.concurrency,
        "min_duration_ms": round(float(judging.get("min_duration_s") or 0) * 1000),
        "duration_ms": round(float(run.config.duration_s or 0) * 1000),
        "seed": run.config.seed,
    }
    out["loadtest"] = {
        "run": run_rel,
        "run_id": run.run_id,
        "verdict": run.verdict.status if run.verdict is not None else None,
        "smoke": bool(run.config.judging is not None and run.config.judging.smoke),
        "output_tokens_counted_by": (
            "endpoints"
            if figures.completed and figures.templated == figures.completed
            else "client tokenizer"
        ),
        "usage_disagreement": figures.usage.to_dict(),
        "notes": figures.notes(),
    }
    return out


def _started_ns(run: RunDocument) -> int:
    """The run's start (epoch ns): run.json's ``created``."""
    try:
        return round(datetime.fromisoformat(run.created).timestamp() * 1e9)
    except ValueError:
        return 0


@lru_cache(maxsize=1)
def _git_sha() -> str | None:
    """The commit of the loadtest checkout this code runs from (None when it is not a git checkout of
    its own, e.g. an installed package inside some other repository)."""
    root = Path(__file__).resolve().parents[2]
    try:
        r = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout.split()
    if r.returncode != 0 or len(out) != 2 or Path(out[0]).resolve() != root:
        return None
    return out[1] if re.fullmatch(r"[0-9a-f]{40}", out[1]) else None


def point_yaml(
    run: RunDocument, label: str, offline: bool, figures: EndpointsFigures, stands: str = "none"
) -> dict[str, Any]:
    """``point.yaml``: the point's configuration and the model and dataset it ran (token averages in the
    ``endpoints`` convention); ``offline``: how this point stands as the Offline point (dedicated, elected
    or none); the offline point's reported concurrency is its dataset's size (docs/sources.md §2)."""
    ok = figures.completed
    datasets = run.workload.datasets or {}
    size = sum(d.conversations for d in datasets.values())
    return {
        "concurrency": size if offline and size else run.config.load.concurrency,
        "load_pattern": "max_throughput" if offline else "concurrency",
        "offline": stands,
        "model_name": run.config.model or "unknown",
        "dataset_name": run.config.profile,
        "input_token_average": round(sum(figures.isl) / ok, 3) if ok else None,
        "output_token_average": round(sum(figures.osl) / ok, 3) if ok else None,
        "run_date": run.created,
        "duration_s": run.config.duration_s,
        "seed": run.config.seed,
        "loadtest_point": label,
    }


def accuracy_results(run: RunDocument) -> dict[str, Any]:
    """``accuracy_results.json``: no accuracy run (an empty ``accuracy_scores``), and the quality
    gate's result when the run had one (docs/quality.md)."""
    out: dict[str, Any] = {
        "accuracy_scores": [],
        "note": "no accuracy run: loadtest measures performance; its quality gate checks answers' form, not accuracy",
    }
    q = run.quality
    if q is not None:
        out["quality_gate"] = {
            "checked": q.checked,
            "passed": q.passed,
            "pass_rate": q.pass_rate,
            "min": q.min,
            "gate": list(q.gate),
        }
    return out


def system_desc(
    run: RunDocument, system: Mapping[str, Any], system_name: str, embedded: bool = False
) -> dict[str, Any]:
    """``system_desc.json``: the endpoint description's ``system`` fields as given, over what run.json
    knows (name, endpoint URL, serving engine, accelerators); ``embedded``: the sweep's own engine."""
    ep = run.endpoint
    embedded = embedded or ep.embedded
    server = ep.server or {}
    framework = server.get("engine") or ("loadtest embedded engine (simulated)" if embedded else None)
    desc: dict[str, Any] = {"system_name": system_name, "endpoint_url": ep.url}
    if framework:
        desc["serving_framework"] = framework
    hw = ep.hardware
    if hw is not None and hw.gpu_kind != "unknown":
        desc["node_types"] = [
            {
                "node_count": 1,
                "accelerator_info": [
                    {"accelerator_model_name": hw.gpu_kind, "accelerators_per_node": hw.gpu_count or 1}
                ],
            }
        ]
        desc["system_size"] = hw.gpu_count or 1
    if embedded:
        desc["system_type_detail"] = "simulated engine, not hardware"
    desc.update(system)
    return desc


def write_submission(
    sweep_dir: Path, doc: SweepDocument, out: Path, system: Mapping[str, Any] | None = None
) -> Written:
    """Write ``out/results/<system>/<model>/r<N>/`` for every completed concurrency point of the sweep
    (the offline point too, at its concurrency, unless a ladder point has it), and ``out/src/loadtest/README.md``.

    ``system``: the endpoint description's ``system`` mapping (--endpoint-file), written into each
    point's system_desc.json. Raises SubmissionError when no point can be written.
    """
    system = dict(system or {})
    root = sweep_root(sweep_dir)
    entries: list[tuple[int, str, bool, RunDocument, str, int]] = []
    left_out: list[str] = []
    for p in doc.points:
        if p.concurrency is None:
            left_out.append(f"{p.label}: an open-loop point (a submission is a curve over concurrency)")
            continue
        run = read_run_json(root / p.dir) if p.status == "completed" else None
        if run is None:
            left_out.append(
                f"{p.label}: {p.status}{f' ({p.reason})' if p.reason else ''}, no run.json to report"
            )
            continue
        entries.append((p.concurrency, p.label, p.offline, run, p.dir, p.index))
    by_n: dict[int, tuple[int, str, bool, RunDocument, str, int]] = {}
    for e in sorted(entries, key=lambda e: e[2]):  # ladder points first: they keep their r<N>
        if e[0] in by_n:
            left_out.append(f"{e[1]}: concurrency {e[0]} is already {by_n[e[0]][1]}")
            continue
        by_n[e[0]] = e
    if not by_n:
        raise SubmissionError(
            f"{sweep_dir}: no completed concurrency point to write (--mlperf-endpoints needs a "
            "--ladder concurrency sweep, or its offline point)"
        )
    first = next(iter(by_n.values()))[3]
    system_name = str(system.get("system_name") or first.endpoint.name or _default_system(doc))
    model = first.config.model or (first.endpoint.models[0] if first.endpoint.models else "unknown-model")
    curve = out / "results" / slug(system_name) / slug(model)
    written = Written(root=out, curve=curve, left_out=left_out)
    for n in sorted(by_n):
        _, label, offline, run, rel, index = by_n[n]
        folder = curve / f"r{n}"
        folder.mkdir(parents=True, exist_ok=True)
        run_rel = str((root / rel).resolve())
        stands = (
            doc.offline if doc.offline and doc.offline != "none" and index == doc.offline_point else "none"
        )
        figures = endpoints_of(run, root / rel)
        point = point_yaml(run, label, offline, figures, stands)
        if offline and stands == "none" and doc.offline_reason:
            point["offline_note"] = doc.offline_reason
        (folder / "point.yaml").write_text(yaml.safe_dump(point, sort_keys=False))
        write_json(folder / "result_summary.json", result_summary(run, run_rel, figures))
        write_json(folder / "accuracy_results.json", accuracy_results(run))
        write_json(folder / "system_desc.json", system_desc(run, system, system_name, doc.endpoint.embedded))
        written.points.append(folder)
    readme = out / "src" / "loadtest" / "README.md"
    readme.parent.mkdir(parents=True, exist_ok=True)
    readme.write_text(
        f"# {doc.profile} sweep\n\nMeasured by {doc.tool.get('name', 'loadtest')} {doc.tool.get('version', '')} "
        f"(`loadtest sweep --mlperf-endpoints`), from the sweep folder {root.resolve()} "
        f"(sweep.json, one run folder per point).\n",
        encoding="utf-8",
    )
    return written


def _default_system(doc: SweepDocument) -> str:
    """The sweep's engine (``loadtest-sim-H100``) or its endpoint's host:port."""
    ep = doc.endpoint
    if ep.embedded:
        engine = ep.engine or {}
        gpu = engine.get("gpu")
        gpu_name = gpu.get("name") if isinstance(gpu, dict) else gpu
        return f"loadtest-sim-{gpu_name or 'gpu'}"
    return ep.url.split("//", 1)[-1].split("/", 1)[0] or "endpoint"


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
