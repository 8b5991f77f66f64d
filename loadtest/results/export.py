"""Per-request records and per-second series as CSV and Parquet, streamed batch by batch from the record log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from loadtest.contracts.run_document import RunDocumentError, read_run_document
from loadtest.results.capture import capture_files, read_capture
from loadtest.results.columns import LogBatch, LogReader
from loadtest.results.log_stats import LogStats, LogSummary

FORMATS = ("csv", "parquet")
REQUESTS_NAME = "requests"
SERIES_NAME = "series"
SAMPLES_NAME = "samples"  # the captured requests (capture*.jsonl), when the run captured
_INT = pa.int64()
_FLOAT = pa.float64()
_STR = pa.string()
# (column, type, meaning) in file order; docs/reports.md lists the same.
REQUEST_COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("id", _STR, "request id (seed-index; session calls add their turn)"),
    ("scenario", _STR, "scenario name"),
    ("worker", _INT, "worker index"),
    ("outcome", _STR, "outcome class"),
    ("status", _INT, "HTTP status (0: none)"),
    ("start_epoch", _FLOAT, "scheduled time, epoch seconds"),
    ("schedule_lag_ms", _FLOAT, "send time − scheduled time"),
    ("ttft_ms", _FLOAT, "first token − scheduled time"),
    ("tpot_ms", _FLOAT, "(latency − TTFT) / (output tokens − 1)"),
    ("e2e_ms", _FLOAT, "last byte − scheduled time"),
    ("itl_mean_ms", _FLOAT, "mean gap between token-carrying chunks"),
    ("itl_max_ms", _FLOAT, "largest gap between token-carrying chunks"),
    ("chunks", _INT, "token-carrying chunks received"),
    ("input_tokens", _INT, "prompt tokens, client tokenizer"),
    ("output_tokens", _INT, "output tokens, client tokenizer"),
    ("reasoning_tokens", _INT, "reasoning tokens, client tokenizer"),
    ("requested_output_tokens", _INT, "max_tokens asked for"),
    ("usage_prompt_tokens", _INT, "server usage: prompt tokens"),
    ("usage_completion_tokens", _INT, "server usage: completion tokens"),
    ("usage_cached_tokens", _INT, "server usage: cached prompt tokens"),
    ("finish_reason", _STR, "finish_reason the server sent"),
    ("error", _STR, "error message (failed requests)"),
)
REQUEST_SCHEMA = pa.schema([(n, t) for n, t, _ in REQUEST_COLUMNS])
SAMPLE_COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("id", _STR, "request id (the record log's id)"),
    ("wire_id", _STR, "the X-Request-Id the request carried"),
    ("scenario", _STR, "scenario name"),
    ("api", _STR, "the request's API"),
    ("outcome", _STR, "outcome class"),
    ("status", _INT, "HTTP status (0: none)"),
    ("finish_reason", _STR, "finish_reason the server sent"),
    ("quality_failed", _STR, "the answer checks it failed, comma-separated"),
    ("request", _STR, "the body sent (JSON text, the API key redacted; cut when listed in cut)"),
    ("answer", _STR, "the answer text received"),
    ("tool_calls", _STR, "the tool-call arguments received"),
    ("reasoning", _STR, "the reasoning text received"),
    ("cut", _STR, "the texts cut at the capture's max_chars, comma-separated"),
)
SAMPLE_SCHEMA = pa.schema([(n, t) for n, t, _ in SAMPLE_COLUMNS])
SAMPLE_BATCH = 1000


class ExportError(Exception):
    """Nothing to export: one line for the user."""


def _ms(us: np.ndarray) -> pa.Array:
    return pa.array(np.round(us / 1000.0, 3), type=_FLOAT, from_pandas=True)


def _ints(v: np.ndarray) -> pa.Array:
    nan = np.isnan(v)
    return pa.array(np.where(nan, 0, v).astype(np.int64), type=_INT, mask=nan)


def request_table(b: LogBatch, reader: LogReader) -> pa.Table:
    """One batch of the per-request table."""
    f = b.f
    scen = np.array(reader.scenarios.names, dtype=object)
    outc = np.array(reader.outcomes.names, dtype=object)
    cols: dict[str, Any] = {
        "id": pa.array(b.ids, type=_STR),
        "scenario": pa.array(scen[b.scenario], type=_STR),
        "worker": pa.array(b.worker.astype(np.int64), type=_INT),
        "outcome": pa.array(outc[b.outcome], type=_STR),
        "status": pa.array(b.status.astype(np.int64), type=_INT),
        "start_epoch": pa.array(f["t"], type=_FLOAT),
        "schedule_lag_ms": _ms(f["sent_us"]),
        "ttft_ms": _ms(f["ttft_us"]),
        "tpot_ms": _ms(f["tpot_us"]),
        "e2e_ms": _ms(f["e2e_us"]),
        "itl_mean_ms": _ms(b.itl_mean_us),
        "itl_max_ms": _ms(b.itl_max_us),
        "chunks": pa.array(b.n_chunks, type=_INT),
        "input_tokens": _ints(f["prompt_tokens"]),
        "output_tokens": _ints(f["output_tokens"]),
        "reasoning_tokens": _ints(f["reasoning_tokens"]),
        "requested_output_tokens": _ints(f["requested_output_tokens"]),
        "usage_prompt_tokens": _ints(f["usage_prompt_tokens"]),
        "usage_completion_tokens": _ints(f["usage_completion_tokens"]),
        "usage_cached_tokens": _ints(f["usage_cached_tokens"]),
        "finish_reason": pa.array(b.finish_reasons, type=_STR),
        "error": pa.array(b.errors, type=_STR),
    }
    return pa.table(cols, schema=REQUEST_SCHEMA)


def series_table(log: LogSummary) -> pa.Table:
    """The per-second series: one row per second since the first scheduled request."""
    cols: dict[str, Any] = {
        "time_s": pa.array(log.series["t"], type=_FLOAT),
        "epoch": pa.array([log.t0 + t for t in log.series["t"]], type=_FLOAT),
    }
    for name, values in log.series.items():
        if name == "t":
            continue
        typ = _INT if name in ("completed", "ok", "errors") else _FLOAT
        cols[name] = pa.array(values, type=typ)
    for outcome, counts in sorted(log.errors_by_outcome.items()):
        cols[f"ended_{outcome}"] = pa.array(counts, type=_INT)
    return pa.table(cols)


class _Writers:
    def __init__(self, out: Path, name: str, formats: tuple[str, ...], schema: pa.Schema) -> None:
        self.paths = [out / f"{name}.{fmt}" for fmt in formats]
        self._w: list[Any] = []
        for fmt, path in zip(formats, self.paths, strict=True):
            if fmt == "csv":
                self._w.append(pacsv.CSVWriter(str(path), schema))
            else:
                self._w.append(pq.ParquetWriter(str(path), schema, compression="zstd"))

    def write(self, table: pa.Table) -> None:
        for w in self._w:
            w.write_table(table)

    def close(self) -> None:
        for w in self._w:
            w.close()


def _first_scheduled(run_dir: Path) -> float | None:
    """The run's first scheduled time (epoch s) from run.json; None without a readable one (the series
    then start at the first record)."""
    try:
        return read_run_document(run_dir).metrics.window.first_scheduled
    except RunDocumentError:
        return None


def _sample_table(rows: list[Any]) -> pa.Table:
    cols: dict[str, Any] = {n: [] for n, _, _ in SAMPLE_COLUMNS}
    for r in rows:
        for name in ("id", "wire_id", "scenario", "api", "outcome", "status", "finish_reason"):
            cols[name].append(getattr(r, name))
        for name in ("request", "answer", "tool_calls", "reasoning"):
            cols[name].append(getattr(r, name))
        cols["quality_failed"].append(",".join(r.quality_failed))
        cols["cut"].append(",".join(r.cut))
    return pa.table(cols, schema=SAMPLE_SCHEMA)


def export_samples(run_dir: Path, formats: tuple[str, ...], out: Path) -> list[Path]:
    """samples.<fmt>: the run's captured requests, when it captured (none: no file)."""
    paths = capture_files(run_dir)
    if not paths:
        return []
    writers = _Writers(out, SAMPLES_NAME, formats, SAMPLE_SCHEMA)
    try:
        rows: list[Any] = []
        for line in read_capture(paths):
            rows.append(line)
            if len(rows) >= SAMPLE_BATCH:
                writers.write(_sample_table(rows))
                rows = []
        writers.write(_sample_table(rows))
    finally:
        writers.close()
    return writers.paths


def export_run(run_dir: Path, paths: list[Path], formats: tuple[str, ...], out: Path) -> list[Path]:
    """Write requests.<fmt>, series.<fmt> and (a run that captured) samples.<fmt> for each format into
    ``out``; return the files written."""
    if not paths:
        raise ExportError(f"{run_dir} has no record log (records*.jsonl): nothing to export")
    out.mkdir(parents=True, exist_ok=True)
    reader = LogReader(paths)
    stats = LogStats(_first_scheduled(run_dir), 1.0)
    writers = _Writers(out, REQUESTS_NAME, formats, REQUEST_SCHEMA)
    try:
        for batch in reader.batches():
            writers.write(request_table(batch, reader))
            stats.add(batch, reader)
    finally:
        writers.close()
    table = series_table(stats.summary(reader.skipped_lines))
    series = _Writers(out, SERIES_NAME, formats, table.schema)
    try:
        series.write(table)
    finally:
        series.close()
    return writers.paths + series.paths + export_samples(run_dir, formats, out)
