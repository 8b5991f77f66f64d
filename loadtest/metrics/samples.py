"""Exact latency samples from the record log: LoadGen's percentiles, early-stopping estimates and over-limit counts."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

import numpy as np

from loadtest.contracts.record_line import RecordLine
from loadtest.metrics import early_stopping as es
from loadtest.metrics import hdr

# The per-request metrics the record log holds exactly (µs); ITL stays in its histogram (one value
# per token: hundreds of millions in a long run).
EXACT_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")


class LatencySamples:
    """Every ok request's TTFT, TPOT and E2E (µs, as the record log has them), fed in batches of lines.

    The same requests the recorder's histograms hold (an ok answer; TTFT and TPOT of a streamed one).
    Percentiles follow LoadGen's rule, ``sorted[⌊n · p⌋]`` (``hdr.loadgen_index``), on the exact values,
    where a histogram knows only the bucket of that sample.
    """

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {m: [] for m in EXACT_METRICS}
        self._sorted: dict[str, np.ndarray] = {}
        self.issued = 0  # every line, whatever its outcome (LoadGen's sample count)
        self.first_scheduled: float | None = None  # epoch s of the first and the last scheduled request
        self.last_scheduled: float | None = None

    def add(self, lines: Iterable[RecordLine]) -> None:
        """Take the values of a batch of record-log lines."""
        rows = [(ln.t, ln.outcome == "ok", ln.stream, ln.ttft_us, ln.tpot_us, ln.e2e_us) for ln in lines]
        if not rows:
            return
        t, ok, stream, ttft, tpot, e2e = (np.array(col, dtype=np.float64) for col in zip(*rows, strict=True))
        self.add_columns(t, ok.astype(bool), stream.astype(bool), ttft, tpot, e2e)

    def add_columns(
        self,
        t: np.ndarray,
        ok: np.ndarray,
        stream: np.ndarray,
        ttft_us: np.ndarray,
        tpot_us: np.ndarray,
        e2e_us: np.ndarray,
    ) -> None:
        """Take a batch as columns (NaN where a line has null): scheduled epochs, ok and streamed masks,
        TTFT, TPOT and E2E in µs (the record log's columnar reader, results/columns.py)."""
        if not len(t):
            return
        self.issued += len(t)
        lo, hi = float(np.min(t)), float(np.max(t))
        self.first_scheduled = lo if self.first_scheduled is None else min(self.first_scheduled, lo)
        self.last_scheduled = hi if self.last_scheduled is None else max(self.last_scheduled, hi)
        done = ok & ~np.isnan(e2e_us)
        first = done & stream & ~np.isnan(ttft_us)
        self._parts["e2e"].append(e2e_us[done])
        self._parts["ttft"].append(ttft_us[first])
        self._parts["tpot"].append(tpot_us[first & ~np.isnan(tpot_us)])
        self._sorted.clear()

    def values(self, metric: str) -> np.ndarray:
        """The metric's values, ascending (empty for a metric without samples or not kept exactly)."""
        arr = self._sorted.get(metric)
        if arr is None:
            parts = self._parts.get(metric, [])
            arr = np.sort(np.concatenate(parts)) if parts else np.zeros(0)
            self._parts[metric] = [arr] if parts else []
            self._sorted[metric] = arr
        return arr

    def count(self, metric: str) -> int:
        """The metric's sample count."""
        return int(sum(len(p) for p in self._parts.get(metric, [])))

    def percentile(self, metric: str, p: float) -> float | None:
        """LoadGen's p-th percentile (p in percent), µs; None without samples."""
        v = self.values(metric)
        return float(v[hdr.loadgen_index(len(v), p)]) if len(v) else None

    def estimate(self, metric: str, p: float, confidence: float = es.DEFAULT_CONFIDENCE) -> float | None:
        """The early-stopping estimate of the p-th percentile (p a fraction), µs; None with too few samples."""
        v = self.values(metric)
        t = es.estimate_t(len(v), p, confidence)
        return None if t is None else float(v[es.estimate_index(len(v), t)])

    def count_above(self, metric: str, limit_us: float) -> int:
        """Samples strictly over ``limit_us``."""
        v = self.values(metric)
        return int(len(v) - np.searchsorted(v, limit_us, side="right"))

    def apply(self, latency_ms: MutableMapping[str, Any], pcts: Iterable[float] = hdr.PERCENTILES) -> None:
        """Replace the histogram figures of run.json ``latency_ms`` (min, max, mean, stddev, percentiles)
        with the exact ones, for each metric kept here that has samples."""
        pcts = list(pcts)
        for metric in EXACT_METRICS:
            v = self.values(metric)
            entry = latency_ms.get(metric)
            if not len(v) or entry is None:
                continue
            entry.update(
                count=int(len(v)),
                min=_ms(v[0]),
                max=_ms(v[-1]),
                mean=_ms(float(v.mean())),
                stddev=_ms(float(v.std())),
            )
            for p in pcts:
                entry[hdr.percentile_key(p)] = _ms(float(v[hdr.loadgen_index(len(v), p)]))


def _ms(us: float) -> float:
    return round(float(us) / 1000.0, 3)
