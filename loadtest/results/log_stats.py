"""What the report needs from the record log: time series, error classes, lengths and token agreement."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.metrics.samples import LatencySamples
from loadtest.results.columns import LogBatch, LogReader

# ITL is per chunk (hundreds of millions in a big run): per-bucket percentiles come from log-spaced
# bins, 40 per decade (a value is known within ±3 %); per-request metrics are exact.
ITL_BINS_PER_DECADE = 40
ITL_BINS = 10 * ITL_BINS_PER_DECADE  # 1 µs .. 10^10 µs
SERIES_PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
MAX_ERROR_CLASSES = 500
MAX_SAMPLES = 3
MAX_MESSAGE = 300
TOKEN_DIFF_RANGE = 10  # server − client differences beyond ±10 are pooled in the end bins
# Long numbers, hex and uuid-like ids differ between otherwise identical messages.
_VOLATILE = re.compile(r"\b(?:[0-9a-f]{8,}(?:-[0-9a-f]{4,})*|0x[0-9a-f]+|\d{4,}(?:\.\d+)?)\b", re.IGNORECASE)


@dataclass
class ErrorClass:
    """Failures sharing an outcome, HTTP status and message (volatile numbers and ids blanked)."""

    outcome: str
    status: int
    message: str
    count: int = 0
    first_s: float = math.inf
    last_s: float = -math.inf
    samples: list[str] = field(default_factory=list)


@dataclass
class LogSummary:
    """The record log, reduced: every array small enough for a chart or a table."""

    records: int
    skipped_lines: int
    t0: float
    width_s: float
    series: dict[str, list[Any]]
    errors_by_outcome: dict[str, list[int]]
    error_classes: list[ErrorClass]
    scenarios: list[str]
    lengths: dict[str, dict[str, np.ndarray]]
    token_diff: dict[str, list[int]]
    token_diff_labels: list[str]
    # The exact TTFT, TPOT and E2E samples (LoadGen's percentiles: mlperf_log_summary.txt)
    samples: LatencySamples = field(default_factory=LatencySamples)


class LogStats:
    """Accumulates batches into time buckets of ``width_s`` seconds starting at epoch ``t0``."""

    def __init__(self, t0: float | None = None, width_s: float = 1.0) -> None:
        self.t0 = t0
        self.width = float(width_s)
        self._cols: dict[str, list[np.ndarray]] = {}
        self._out_tokens = np.zeros(0)
        self._itl = np.zeros((0, ITL_BINS), dtype=np.int64)
        self._classes: dict[tuple[str, int, str], ErrorClass] = {}
        self._templates: dict[str, str] = {}
        self._outcome_names: list[str] = []
        self._scenario_names: list[str] = []
        self.records = 0
        self.samples = LatencySamples()

    # ---- accumulation ----
    def _bucket(self, epoch: np.ndarray) -> np.ndarray:
        assert self.t0 is not None
        return np.maximum(((epoch - self.t0) // self.width), 0).astype(np.int64)

    def add(self, b: LogBatch, reader: LogReader) -> None:
        if self.t0 is None:
            self.t0 = float(math.floor(np.nanmin(b.f["t"])))
        self._outcome_names = reader.outcomes.names
        self._scenario_names = reader.scenarios.names
        self.records += b.n
        t = b.f["t"]
        keep = {
            "t": t,
            "sent_us": b.f["sent_us"],
            "ttft_us": b.f["ttft_us"],
            "end_us": b.end_us,
            "prompt": b.f["prompt_tokens"],
            "output": b.f["output_tokens"],
            "requested": b.f["requested_output_tokens"],
            "usage_prompt": b.f["usage_prompt_tokens"],
            "usage_output": b.f["usage_completion_tokens"],
            "outcome": b.outcome,
            "scenario": b.scenario,
        }
        for k, v in keep.items():
            self._cols.setdefault(k, []).append(v)
        ok = b.outcome == 0  # OUTCOMES[0] is "ok"
        self.samples.add_columns(t, ok, b.f["stream"] == 1.0, b.f["ttft_us"], b.f["tpot_us"], b.f["e2e_us"])
        # Output tokens by the bucket their chunks arrived in (non-streamed answers: at the end).
        rec = b.chunk_record
        chunk_b = self._bucket(t[rec] + b.chunk_us / 1e6)
        usage_out = b.f["usage_completion_tokens"]  # the counted tokens: usage, else the client count
        counted = np.where(np.isnan(usage_out), b.f["output_tokens"], usage_out)
        per_chunk = np.where(ok, counted, 0.0) / np.maximum(b.n_chunks, 1)
        self._out_tokens = _add(self._out_tokens, chunk_b, per_chunk[rec])
        no_chunks = ok & (b.n_chunks == 0)
        if no_chunks.any():
            idx = self._bucket(t[no_chunks] + b.end_us[no_chunks] / 1e6)
            self._out_tokens = _add(self._out_tokens, idx, counted[no_chunks])
        # ITL of successful requests, binned per bucket of arrival.
        g_ok = ok[rec[b.gap_chunk]]
        if g_ok.any():
            row = chunk_b[b.gap_chunk[g_ok]]
            col = _log_bin(b.gap_us[g_ok])
            rows = int(row.max()) + 1
            if rows > self._itl.shape[0]:
                grown = np.zeros((rows, ITL_BINS), dtype=np.int64)
                grown[: self._itl.shape[0]] = self._itl
                self._itl = grown
            self._itl += np.bincount(row * ITL_BINS + col, minlength=self._itl.size).reshape(self._itl.shape)
        self._add_errors(b, ok)

    def _add_errors(self, b: LogBatch, ok: np.ndarray) -> None:
        names = self._outcome_names
        t0 = self.t0 or 0.0
        for i in np.flatnonzero(~ok).tolist():
            raw = b.errors[i] or ""
            template = self._templates.get(raw)
            if template is None:
                template = _VOLATILE.sub("…", raw)[:MAX_MESSAGE] or "(no message)"
                if len(self._templates) < 100_000:
                    self._templates[raw] = template
            outcome, status = names[int(b.outcome[i])], int(b.status[i])
            key = (outcome, status, template)
            cls = self._classes.get(key)
            if cls is None:
                if len(self._classes) >= MAX_ERROR_CLASSES:
                    key = (outcome, status, "(other messages)")
                    cls = self._classes.get(key)
                if cls is None:
                    cls = self._classes[key] = ErrorClass(outcome, status, key[2])
            cls.count += 1
            at = float(b.f["t"][i]) - t0
            cls.first_s = min(cls.first_s, at)
            cls.last_s = max(cls.last_s, at)
            if raw and len(cls.samples) < MAX_SAMPLES and raw[:MAX_MESSAGE] not in cls.samples:
                cls.samples.append(raw[:MAX_MESSAGE])

    # ---- results ----
    def summary(self, skipped_lines: int = 0) -> LogSummary:
        c = {k: np.concatenate(v) for k, v in self._cols.items()}
        t0 = self.t0 if self.t0 is not None else 0.0
        if not c:
            return LogSummary(0, skipped_lines, t0, self.width, {"t": []}, {}, [], [], {}, {}, [])
        ok = c["outcome"] == 0
        cancelled_code = self._outcome_names.index("cancelled")
        end = c["t"] + c["end_us"] / 1e6
        done_b = self._bucket(end)
        ttft_b = self._bucket(c["t"] + np.nan_to_num(c["ttft_us"]) / 1e6)
        sched_b = self._bucket(c["t"])
        nb = max(int(done_b.max()) + 1, len(self._out_tokens), self._itl.shape[0])
        w = self.width
        # The last bucket ends with the run: its rates use the span it covers (at least a quarter bucket).
        widths = np.full(nb, w)
        widths[-1] = min(w, max(float(end.max()) - t0 - (nb - 1) * w, w / 4))
        series: dict[str, list[Any]] = {
            "t": [round(i * w, 3) for i in range(nb)],
            "bucket_s": _round(widths, 3),
        }
        completed = np.bincount(done_b, minlength=nb)
        oks = np.bincount(done_b[ok], minlength=nb)
        cancelled = np.bincount(done_b[c["outcome"] == cancelled_code], minlength=nb)
        series["completed"] = completed.tolist()
        series["ok"] = oks.tolist()
        series["errors"] = (completed - oks - cancelled).tolist()
        series["requests_per_s"] = _round(oks / widths, 3)
        out_tokens = np.zeros(nb)
        out_tokens[: len(self._out_tokens)] = self._out_tokens
        series["output_tokens_per_s"] = _round(out_tokens / widths, 1)
        series["input_tokens_per_s"] = _round(
            np.bincount(done_b[ok], c["prompt"][ok], minlength=nb) / widths, 1
        )
        series["in_flight"] = _round(_mean_in_flight(c, t0, w, nb) * w / widths, 2)
        for name, p in SERIES_PERCENTILES:
            series[f"ttft_{name}_ms"] = _round(_group_pct(ttft_b[ok], c["ttft_us"][ok], nb, p) / 1000, 3)
        itl = np.zeros((nb, ITL_BINS), dtype=np.int64)
        itl[: self._itl.shape[0]] = self._itl
        for name, p in SERIES_PERCENTILES:
            series[f"itl_{name}_ms"] = _round(_binned_pct(itl, p) / 1000, 3)
        lag = c["sent_us"]
        for name, p in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
            series[f"schedule_lag_{name}_ms"] = _round(_group_pct(sched_b, lag, nb, p) / 1000, 3)
        by_outcome: dict[str, list[int]] = {}
        for code, name in enumerate(self._outcome_names):
            if name == "ok":
                continue
            sel = c["outcome"] == code
            if sel.any():
                by_outcome[name] = np.bincount(done_b[sel], minlength=nb).tolist()
        classes = sorted(self._classes.values(), key=lambda e: (-e.count, e.outcome, e.message))
        return LogSummary(
            records=int(len(ok)),
            skipped_lines=skipped_lines,
            t0=t0,
            width_s=w,
            series=series,
            errors_by_outcome=by_outcome,
            error_classes=classes,
            scenarios=list(self._scenario_names),
            lengths=self._lengths(c, ok),
            token_diff=_token_diffs(c, ok),
            token_diff_labels=_diff_labels(),
            samples=self.samples,
        )

    def _lengths(self, c: dict[str, np.ndarray], ok: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
        """Per scenario: input tokens of every sent request, output and requested output of ok ones."""
        out = {}
        sent = ~np.isnan(c["sent_us"])
        for code, name in enumerate(self._scenario_names):
            sel = c["scenario"] == code
            out[name] = {
                "input": c["prompt"][sel & sent],
                "output": c["output"][sel & ok],
                "requested": c["requested"][sel & ok],
            }
        return out


def _add(acc: np.ndarray, idx: np.ndarray, weights: np.ndarray) -> np.ndarray:
    if idx.size == 0:
        return acc
    add = np.bincount(idx, weights, minlength=len(acc))
    if len(add) > len(acc):
        add[: len(acc)] += acc
        return add
    return acc + add


def _round(a: np.ndarray, digits: int) -> list[float | None]:
    """A list for JSON/plotly: rounded, NaN as None."""
    r = np.round(np.asarray(a, dtype=np.float64), digits)
    return [None if math.isnan(v) else v for v in r.tolist()]


def _log_bin(us: np.ndarray) -> np.ndarray:
    b = np.floor(np.log10(np.maximum(us, 1.0)) * ITL_BINS_PER_DECADE).astype(np.int64)
    return np.clip(b, 0, ITL_BINS - 1)


def _binned_pct(counts: np.ndarray, p: float) -> np.ndarray:
    """Per row: the geometric middle of the bin holding the p-quantile (NaN for empty rows)."""
    total = counts.sum(axis=1)
    cum = np.cumsum(counts, axis=1)
    target = np.minimum(np.floor(p * total) + 1, np.maximum(total, 1))  # LoadGen's rank
    idx = (cum < target[:, None]).sum(axis=1)
    val = 10 ** ((idx + 0.5) / ITL_BINS_PER_DECADE)
    return np.where(total > 0, val, np.nan)


def _group_pct(groups: np.ndarray, values: np.ndarray, nb: int, p: float) -> np.ndarray:
    """Per group 0..nb-1: the p-quantile of its non-NaN values at LoadGen's rank, the ⌊p · n⌋-th from 0
    (NaN when none)."""
    keep = ~np.isnan(values)
    g, v = groups[keep], values[keep]
    out = np.full(nb, np.nan)
    if not g.size:
        return out
    order = np.lexsort((v, g))
    v = v[order]
    counts = np.bincount(g, minlength=nb)[:nb]
    starts = np.cumsum(counts) - counts
    rank = np.minimum(np.floor(p * counts).astype(np.int64) + 1, counts)
    has = counts > 0
    out[has] = v[starts[has] + rank[has] - 1]
    return out


def _mean_in_flight(c: dict[str, np.ndarray], t0: float, w: float, nb: int) -> np.ndarray:
    """Time-averaged requests in flight (sent, not yet finished) over each bucket."""
    sent = ~np.isnan(c["sent_us"])
    s = np.sort(c["t"][sent] + c["sent_us"][sent] / 1e6 - t0)
    e = np.sort(c["t"][sent] + np.maximum(c["end_us"][sent], c["sent_us"][sent]) / 1e6 - t0)
    edges = np.arange(nb + 1) * w
    ps, pe = np.concatenate([[0.0], np.cumsum(s)]), np.concatenate([[0.0], np.cumsum(e)])

    def area(x: np.ndarray) -> np.ndarray:  # ∫_0^x in-flight(τ) dτ
        ks, ke = np.searchsorted(s, x, "right"), np.searchsorted(e, x, "right")
        return (ks * x - ps[ks]) - (ke * x - pe[ke])

    a = area(edges)
    return np.diff(a) / w


def _token_diffs(c: dict[str, np.ndarray], ok: np.ndarray) -> dict[str, list[int]]:
    """Counts of server − client token differences per request, clipped to ±TOKEN_DIFF_RANGE."""
    out = {}
    for key, server, client in (("output", "usage_output", "output"), ("input", "usage_prompt", "prompt")):
        sel = ok & ~np.isnan(c[server])
        d = np.clip(c[server][sel] - c[client][sel], -TOKEN_DIFF_RANGE - 1, TOKEN_DIFF_RANGE + 1)
        out[key] = np.bincount(
            (d + TOKEN_DIFF_RANGE + 1).astype(np.int64), minlength=2 * TOKEN_DIFF_RANGE + 3
        ).tolist()
    return out


def _diff_labels() -> list[str]:
    r = TOKEN_DIFF_RANGE
    return [f"< −{r}"] + [f"{d:+d}" if d else "0" for d in range(-r, r + 1)] + [f"> +{r}"]


def summarize_log(
    paths: list[Path], t0: float | None = None, width_s: float = 1.0, reader: LogReader | None = None
) -> LogSummary:
    """One pass over the record logs."""
    reader = reader or LogReader(paths)
    stats = LogStats(t0, width_s)
    for batch in reader.batches():
        stats.add(batch, reader)
    return stats.summary(reader.skipped_lines)
