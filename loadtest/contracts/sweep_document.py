"""sweep.json as typed structures: the sweep, its points and the rate search; read and write.

Described field by field in docs/sweep.md. Unknown fields are refused, like run.json's
(contracts/run_document.py); ``endpoint.engine`` (the embedded engine's settings) stays a JSON object.
The sweep's writer (cli/sweep_run.py) builds a SweepDocument and every reader gets one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal, get_args

import msgspec

SCHEMA_VERSION = 1
SWEEP_FILE = "sweep.json"
Mode = Literal["concurrency", "rate", "search"]
MODES: tuple[str, ...] = get_args(Mode)
# Every point carries these figures (None where the run has no value, or the point did not run).
FIGURE_KEYS = (
    "output_tps",
    "requests_per_s",
    "tps_per_user",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p90_ms",
    "e2e_p90_ms",
    "goodput_rps",
    "slo_attainment",
    "error_rate",
    "prefix_cache_hit_rate",
)


class SweepFormatError(ValueError):
    """A sweep folder or sweep.json that cannot be read; the message names the file and the fix."""


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A sweep.json section: fields in the order they are written, unknown fields refused."""


class PointFigures(_Section):
    """A point's figures from its run.json, over the judged window when there is one (docs/sweep.md).
    ``warm_cache``: its server's prefix cache answered most prompt tokens of a profile that asks for
    no shared prefixes (run.json ``prefix_cache.warm``, docs/telemetry.md)."""

    output_tps: float | None = None
    requests_per_s: float | None = None
    tps_per_user: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p90_ms: float | None = None
    e2e_p90_ms: float | None = None
    goodput_rps: float | None = None
    slo_attainment: float | None = None
    error_rate: float | None = None
    prefix_cache_hit_rate: float | None = None
    warm_cache: bool = False
    # its run's MLPerf Endpoints reporting window (run.json reporting_window): status, verdict, system_tps
    window_status: str | None = None
    window_verdict: str | None = None
    window_output_tps: float | None = None


class _PointPlace(_Section, kw_only=True):
    """Where a point ran and how it ended: the fields a point writes before its figures."""

    index: int
    label: str
    concurrency: int | None
    rate: float | None
    offline: bool = False
    dir: str = ""
    status: str
    exit_code: int | None = None
    verdict: str | None = None
    reason: str | None = None
    # An invalid point that lacked only samples (early-stopping evidence, minimum queries or duration):
    # the duration (s) that would have them (loadtest/sweep/evidence.py); a search reruns it that long.
    needs_duration_s: float | None = None
    duration_s: float | None = None  # the point's own duration when it differs from the sweep's


class SweepPoint(_PointPlace, kw_only=True):
    """One point of the ladder or the search: where it ran, how it ended, then PointFigures' fields
    (repeated here, so that a point encodes as docs/sweep.md shows it: index, label, ... figures)."""

    output_tps: float | None = None
    requests_per_s: float | None = None
    tps_per_user: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p90_ms: float | None = None
    e2e_p90_ms: float | None = None
    goodput_rps: float | None = None
    slo_attainment: float | None = None
    error_rate: float | None = None
    prefix_cache_hit_rate: float | None = None
    warm_cache: bool = False
    # its run's MLPerf Endpoints reporting window (run.json reporting_window): status, verdict, system_tps
    window_status: str | None = None
    window_verdict: str | None = None
    window_output_tps: float | None = None

    def figure(self, key: str) -> float | None:
        """One of FIGURE_KEYS by name."""
        value: float | None = getattr(self, key)
        return value


class SearchSummary(_Section):
    min: float
    max: float
    tolerance: float
    max_iterations: int
    highest_passing_rate: float | None
    lowest_failing_rate: float | None
    runs: int
    lengthened_runs: int = 0  # reruns of a rate whose point lacked samples, each longer (docs/sweep.md)


class SweepEndpoint(_Section, omit_defaults=True):
    """``engine``: the embedded engine's configuration (null for --host); ``models``: what --host
    serves (``GET /v1/models``), absent for the embedded engine."""

    url: str
    embedded: bool
    engine: dict[str, Any] | None
    models: list[str] | None = None


class SweepDocument(_Section, omit_defaults=True):
    schema_version: int
    kind: Literal["sweep"]
    mode: Mode
    status: str
    interrupted_reason: str | None
    created: str
    tool: dict[str, str]
    profile: str
    profile_path: str
    seed: int
    fingerprint: str
    endpoint: SweepEndpoint
    slo: dict[str, float | None]
    point_duration_s: float | None
    offline_concurrency: int | None
    stop_at_saturation: bool
    points: list[SweepPoint]
    knee: int | None
    best_under_slo: int | None
    stopped_because: str | None
    search: SearchSummary | None = None
    # the Offline point (docs/sweep.md): dedicated | elected | none, the point standing as it, and why
    offline: str | None = None
    offline_point: int | None = None
    offline_reason: str | None = None

    def point(self, index: int | None) -> SweepPoint | None:
        """The point whose ``index`` is ``index`` (``knee``, ``best_under_slo``); None for None."""
        return next((p for p in self.points if p.index == index), None) if index is not None else None


_ENCODER = msgspec.json.Encoder()


def _refuse(where: Path | str, what: str) -> SweepFormatError:
    return SweepFormatError(f"{where}: {what}; give a folder written by 'loadtest sweep'")


def _check_head(data: dict[str, Any], where: Path | str) -> None:
    """What the document is, checked before its fields: kind, version and mode, each in its own words."""
    version = data.get("schema_version")
    for ok, what in (
        (data.get("kind") == "sweep", "'kind' is not 'sweep'"),
        (version == SCHEMA_VERSION, f"schema_version {version!r} is not {SCHEMA_VERSION}"),
        (data.get("mode") in MODES, f"'mode' must be one of {', '.join(MODES)}"),
    ):
        if not ok:
            raise _refuse(where, what)


def sweep_from_data(data: Any, where: Path | str = SWEEP_FILE) -> SweepDocument:
    """Decoded sweep.json as a SweepDocument, checked; SweepFormatError names the field and the fix."""
    if not isinstance(data, dict):
        raise _refuse(where, "not a JSON object")
    _check_head(data, where)
    try:
        doc = msgspec.convert(data, SweepDocument)
    except msgspec.ValidationError as e:
        raise _refuse(where, str(e)) from e
    n = len(doc.points)
    for key, v in (("knee", doc.knee), ("best_under_slo", doc.best_under_slo)):
        if v is not None and not 0 <= v < n:
            raise _refuse(where, f"'{key}' is not a point index")
    return doc


def read_sweep_document(path: str | Path) -> SweepDocument:
    """A sweep folder (or its sweep.json) as a SweepDocument."""
    p = Path(path)
    file = p if p.is_file() else p / SWEEP_FILE
    try:
        data = msgspec.json.decode(file.read_bytes())
    except FileNotFoundError as e:
        raise SweepFormatError(f"{file} not found; give a folder written by 'loadtest sweep'") from e
    except OSError as e:
        raise SweepFormatError(f"{file}: cannot be read ({e.strerror or e})") from e
    except msgspec.DecodeError as e:
        raise SweepFormatError(f"{file}: not readable JSON ({e})") from e
    return sweep_from_data(data, file)


def write_sweep_document(sweep_dir: Path, doc: SweepDocument) -> Path:
    """Write ``sweep_dir/sweep.json`` atomically (temporary file, then rename)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    target = sweep_dir / SWEEP_FILE
    fd, tmp = tempfile.mkstemp(prefix=".sweep-", suffix=".json", dir=sweep_dir)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(msgspec.json.format(_ENCODER.encode(doc), indent=2) + b"\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
