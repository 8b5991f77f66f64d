"""Percentiles and early-stopping estimates from run.json's encoded HDR histograms (µs)."""

from __future__ import annotations

from typing import Any

from hdrh.histogram import HdrHistogram

from loadtest.contracts.run_document import RunDocument
from loadtest.metrics import early_stopping as es
from loadtest.metrics import hdr

HEADLINE_METRICS: tuple[tuple[str, str], ...] = (
    ("ttft", "TTFT"),
    ("tpot", "TPOT"),
    ("itl", "ITL"),
    ("e2e", "E2E"),
)
HEADLINE_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)


def decode(run: RunDocument, name: str) -> HdrHistogram | None:
    """The named histogram of a run.json, or None when absent, empty or unreadable."""
    enc = run.histograms.get(name)
    if not enc:
        return None
    try:
        h = HdrHistogram.decode(enc.encode("ascii"))
    except Exception:  # a damaged run.json field: the report shows "—" rather than failing
        return None
    return h if h.get_total_count() else None


def percentile_table(
    hist: HdrHistogram | None, pcts: tuple[float, ...] = HEADLINE_PERCENTILES
) -> list[dict[str, Any]]:
    """Per percentile: the measured value and the early-stopping estimate (99 % confidence), in µs.

    The estimate is an upper bound on the true percentile with that confidence (LoadGen's
    definition); it is None when there are too few samples for one, with ``needs`` saying how many.
    """
    out = []
    values = hdr.fast_percentiles(hist, pcts) if hist is not None else [None] * len(pcts)
    n = int(hist.get_total_count()) if hist is not None else 0
    for p, v in zip(pcts, values, strict=True):
        est = es.percentile_estimate_from_histogram(hist, p / 100.0) if hist is not None else None
        out.append(
            {
                "p": p,
                "value_us": v,
                "estimate_us": est,
                "needs": es.min_queries_for_percentile(p / 100.0) if est is None else None,
                "count": n,
            }
        )
    return out
