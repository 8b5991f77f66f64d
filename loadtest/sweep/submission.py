"""An MLPerf Endpoints v1.0 submission tree (``results/<system>/<model>/r<N>/``) from a sweep's concurrency points."""

from __future__ import annotations

import json
import math
import platform
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec
import yaml

from loadtest.accuracy.results import bundle_entry
from loadtest.contracts.record_line import RecordLine
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
from loadtest.sweep.disclosure import POINT_FROM_SYSTEM, Declarations
from loadtest.sweep.disclosure import system_desc as declared_system
from loadtest.sweep.model import read_run_json, sweep_root
from loadtest.sweep.rules import BENCHMARKS, ULTRA_LOW_MAX, min_duration_s, regions
from loadtest.workload.seed_set import SEED_KEYS

FORMAT_VERSION = "1.0"
POINT_FILES = (
    "point.yaml",
    "config.yaml",
    "result_summary.json",
    "system_desc.json",
    "performance/result_summary.json",
)
ACCURACY_FILES = ("accuracy_results.json", "accuracy/accuracy_results.json")  # a point with an accuracy run
IMPLEMENTATION = "loadtest"  # src/<implementation>/
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


def endpoints_of(run: RunDocument, run_dir: Path, lines: list[RecordLine] | None = None) -> EndpointsFigures:
    """The point's ``endpoints`` figures from its record log: over the reporting window when it stands,
    else over the judged window when it had one."""
    standing = endpoints_window(run)
    judged = run.judged
    window: tuple[float, float] | None = None
    if standing is not None and standing.start is not None and standing.end is not None:
        window = (standing.start, math.nextafter(standing.end, math.inf))  # the window is [start, end]
    elif judged is not None:
        window = (judged.window.start, judged.window.end)
    return endpoints_figures(list(read_lines(record_files(run_dir))) if lines is None else lines, window)


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


def _steady_state(run: RunDocument) -> dict[str, Any] | None:
    """point.yaml ``steady_state`` (§4.4): the run's reporting window (metrics/window.py) in the rules'
    words; the trend of each gated metric as Plateau / Drifting Up / Drifting Down."""
    w = run.reporting_window
    if w is None:
        return None
    first = w.first_super_pass
    window: dict[str, Any] = {"super_pass_size": w.super_pass_size}
    if first is not None and w.passes:
        window.update(super_pass_start=first, super_pass_end=first + w.passes - 1)
    window.update(n_samples=w.requests, duration_s=w.duration_s)
    states = {"steady": "Plateau", "up": "Drifting Up", "down": "Drifting Down"}
    return {
        "status": w.status,
        "verdict": w.verdict,
        "window": window,
        "state": {m: states[t] for m, t in w.trend.items() if t in states},
        "reason": w.reason,
    }


def _warmup(run: RunDocument, lines: list[RecordLine], run_rel: str) -> dict[str, Any]:
    """point.yaml ``warmup`` (§6.3.3): the judged window's warm-up and the requests issued before it
    (loadtest keeps them in the record log: the logs are retained)."""
    judged = run.judged
    warm_s = judged.window.warmup_s if judged is not None else 0.0
    early = [x for x in lines if judged is not None and x.t < judged.window.start]
    on = bool(warm_s or early)
    return {
        "duration_s": round(warm_s, 3),
        "requests_issued": len(early),
        "requests_completed": sum(1 for x in early if x.outcome == "ok"),
        "data_source": "the run's own workload: its first requests, before the judged window",
        "concurrency": (run.config.load.concurrency or 0) if on else 0,
        "initialization_steps": [],
        "logs_retained": True,
        "link_logs": f"{run_rel}/ (the record log keeps every warm-up request)",
    }


def _runtime(run: RunDocument, offline: bool, min_queries: int | None) -> dict[str, Any]:
    """point.yaml ``runtime_settings``: load pattern, minimum duration and queries, the seeds the run used."""
    ss = run.config.seed_set
    seeds: dict[str, Any] = (
        {k: getattr(ss, k) for k in SEED_KEYS}
        if ss is not None
        else {
            "scheduler_rng_seed": run.config.seed,
            "sample_index_rng_seed": run.config.seed,
            "model_seed": None,
        }
    )
    concurrency = run.config.load.concurrency or 0
    return {
        "load_pattern": "offline" if offline else "concurrency",
        "min_duration_ms": 0 if offline else round(min_duration_s(concurrency) * 1000),
        "min_sample_count": min_queries,
        "stream_all_chunks": True,
        "runtime": seeds,
    }


def point_yaml(
    run: RunDocument,
    ctx: PointContext,
    figures: EndpointsFigures,
    lines: list[RecordLine],
) -> dict[str, Any]:
    """``point.yaml`` (§8.3, every v1.0 field): concurrency and region (§5.5, from the declared C_max),
    the declarations, runtime settings, warm-up and steady-state blocks, the Offline standing and the
    seed set; the offline point's concurrency is its dataset's size (docs/sources.md §2)."""
    ok = figures.completed
    decl = ctx.decl
    concurrency = run.config.load.concurrency or 0
    c_max = decl.c_max
    region = None
    if c_max is not None and c_max > ULTRA_LOW_MAX and not ctx.offline:
        region = regions(c_max, ctx.c_min).of(concurrency)
    bench = BENCHMARKS.get(decl.model_name or "")
    ss = run.config.seed_set
    point: dict[str, Any] = {
        "produced_by": f"{run.tool.name} {run.tool.version} (loadtest sweep --mlperf-endpoints), "
        "not the MLCommons reference client",
        "concurrency": concurrency,
        "region": region,
        "offline": ctx.stands,
        "model_name": decl.model_name,
        "dataset": decl.dataset,
    }
    point.update({k: decl.system.get(k) for k in POINT_FROM_SYSTEM if decl.system.get(k) is not None})
    point.update(
        runtime_settings=_runtime(run, ctx.offline, bench.min_queries if bench else None),
        warmup=_warmup(run, lines, ctx.run_rel),
        steady_state=_steady_state(run),
        seed_set=decl.submission.get("seed_set") or (ss.set if ss is not None else None),
        target_cohort=decl.submission.get("target_cohort"),
        shared_src=f"src/{IMPLEMENTATION}",
        shared_docs="docs",
        input_token_average=round(sum(figures.isl) / ok, 3) if ok else None,
        output_token_average=round(sum(figures.osl) / ok, 3) if ok else None,
        run_date=run.created,
        duration_s=run.config.duration_s,
        loadtest_point=ctx.label,
        loadtest_profile=run.config.profile,
    )
    extra = {k: v for k, v in decl.submission.items() if k not in point and k not in ("dataset", "seed_set")}
    point.update(extra)  # the submitter's own point fields (nodes_used, speculative_decoding ...)
    return {k: v for k, v in point.items() if v is not None}


def accuracy_results(run: RunDocument, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """``accuracy_results.json`` of a point with an accuracy run: its entries in the checker's form, and
    the quality gate's result when the run had one (docs/quality.md)."""
    out: dict[str, Any] = {"produced_by": f"{run.tool.name} {run.tool.version}", "accuracy_scores": entries}
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


def _accuracy_entries(points: list[tuple[int, Path]]) -> dict[int, list[dict[str, Any]]]:
    """Each point's accuracy_results.json entry (``accuracy.results.bundle_entry`` of its run folder: the
    accuracy run made after it), by concurrency; a point without one is absent."""
    out: dict[int, list[dict[str, Any]]] = {}
    for concurrency, run_dir in points:
        entry = bundle_entry(run_dir)
        if entry is not None:
            out[concurrency] = [entry]
    return out


def system_desc(run: RunDocument, decl: Declarations, system_name: str, embedded: bool) -> dict[str, Any]:
    """``system_desc.json`` (§8.2): the declared fields as given, the endpoint URL and, for the sweep's
    own engine, that it is simulated."""
    desc: dict[str, Any] = {"endpoint_url": run.endpoint.url}
    if embedded or run.endpoint.embedded:
        desc["system_type_detail"] = "loadtest's simulated engine, not hardware"
    desc.update(declared_system(decl, system_name))
    desc["produced_by"] = f"{run.tool.name} {run.tool.version}"
    return desc


@dataclass
class PointContext:
    """A point as the bundle sees it: its label, run folder, Offline standing and the declarations."""

    label: str
    run_rel: str
    offline: bool
    stands: str
    decl: Declarations
    c_min: int = 1  # the curve's lowest fixed-concurrency point, at most 32 (§5.4)


def write_submission(
    sweep_dir: Path, doc: SweepDocument, out: Path, decl: Declarations | None = None
) -> Written:
    """Write the v1.0 bundle (docs/sweep.md): ``cli_metadata.json``, ``src/loadtest/README.md``,
    ``docs/``, ``results/<system>/system_power.json`` and one ``results/<system>/<model>/r<N>/`` per
    completed concurrency point (point.yaml, config.yaml, result_summary.json, accuracy_results.json,
    system_desc.json; the run-folder copies performance/result_summary.json and
    accuracy/accuracy_results.json). The offline point is written only as a dedicated Offline run.

    Raises SubmissionError when no point can be written.
    """
    decl = decl or Declarations()
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
        if p.offline and not (doc.offline == "dedicated" and p.index == doc.offline_point):
            why = doc.offline_reason or "it does not stand as the Offline point"
            left_out.append(f"{p.label}: not a dedicated Offline run ({why})")
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
    system_name = str(decl.system.get("system_name") or first.endpoint.name or _default_system(doc))
    model = (
        decl.model_name
        or first.config.model
        or (first.endpoint.models[0] if first.endpoint.models else "unknown-model")
    )
    system_dir = out / "results" / slug(system_name)
    curve = system_dir / slug(model)
    written = Written(root=out, curve=curve, left_out=left_out)
    tool = f"{first.tool.name} {first.tool.version}"
    _write_shared(out, doc, root, tool)
    if decl.system_power:
        system_dir.mkdir(parents=True, exist_ok=True)
        write_json(system_dir / "system_power.json", {**decl.system_power, "notes": _power_note(decl, tool)})
    fixed = [n for n, e in by_n.items() if not e[2]]
    c_min = max(1, min(min(fixed, default=1), ULTRA_LOW_MAX))
    accuracy = _accuracy_entries([(n, (root / e[4]).resolve()) for n, e in by_n.items()])
    for n in sorted(by_n):
        _, label, offline, run, rel, index = by_n[n]
        folder = curve / f"r{n}"
        folder.mkdir(parents=True, exist_ok=True)
        run_rel = str((root / rel).resolve())
        stands = (
            "dedicated"
            if offline
            else (doc.offline if doc.offline == "elected" and index == doc.offline_point else "none")
        )
        ctx = PointContext(label, run_rel, offline, stands, decl, c_min)
        lines = list(read_lines(record_files(root / rel)))
        figures = endpoints_of(run, root / rel, lines)
        point = point_yaml(run, ctx, figures, lines)
        header = f"# point.yaml written by {tool} (loadtest sweep --mlperf-endpoints), not by the reference client\n"
        (folder / "point.yaml").write_text(header + yaml.safe_dump(point, sort_keys=False), encoding="utf-8")
        config = {"produced_by": tool, **msgspec.to_builtins(run.config)}
        (folder / "config.yaml").write_text(
            f"# the configuration {tool} ran for this point (run.json config)\n"
            + yaml.safe_dump(config, sort_keys=False),
            encoding="utf-8",
        )
        summary = result_summary(run, run_rel, figures)
        files: list[tuple[Path, Mapping[str, Any]]] = [
            (folder / "result_summary.json", summary),
            (folder / "performance" / "result_summary.json", summary),
            (folder / "system_desc.json", system_desc(run, decl, system_name, doc.endpoint.embedded)),
        ]
        if accuracy.get(
            n
        ):  # a point without an accuracy run has no accuracy file (the checker refuses an empty one)
            acc = accuracy_results(run, accuracy[n])
            files += [
                (folder / "accuracy_results.json", acc),
                (folder / "accuracy" / "accuracy_results.json", acc),
            ]
        for path, data in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, data)
        written.points.append(folder)
    return written


def _power_note(decl: Declarations, tool: str) -> str:
    note = decl.system_power.get("notes")
    return f"{note + '; ' if note else ''}as declared in --endpoint-file, written by {tool}"


def _write_shared(out: Path, doc: SweepDocument, root: Path, tool: str) -> None:
    """The bundle's shared files: cli_metadata.json, src/loadtest/README.md and docs/ (the software
    disclosure), each saying that loadtest wrote it."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(
        out / "cli_metadata.json",
        {
            "command": "loadtest sweep --mlperf-endpoints",
            "produced_by": tool,
            "cli_version": None,
            "note": "written by loadtest, not by endpoints-submission-cli or the MLCommons reference client",
            "created_at": doc.created,
        },
    )
    readme = out / "src" / IMPLEMENTATION / "README.md"
    readme.parent.mkdir(parents=True, exist_ok=True)
    readme.write_text(
        f"# {doc.profile} sweep\n\nMeasured by {tool} (`loadtest sweep --mlperf-endpoints`), not by the "
        f"MLCommons reference client, from the sweep folder {root.resolve()} (sweep.json, one run folder "
        "per point). The load generator is loadtest (Locust workers, one closed loop per point).\n",
        encoding="utf-8",
    )
    docs = out / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    ep = doc.endpoint
    engine = "loadtest's simulated engine (not hardware)" if ep.embedded else ep.url
    (docs / "software.md").write_text(
        f"# Software disclosure\n\n- Load generator: {tool} (`loadtest sweep`), "
        f"not the MLCommons reference client.\n- Python {platform.python_version()}\n"
        f"- Endpoint: {engine}\n- Profile: {doc.profile} ({doc.profile_path})\n"
        f"- Sweep: {doc.created}, {len(doc.points)} points, {doc.point_duration_s:g} s per point\n",
        encoding="utf-8",
    )


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
