"""Per-request samples from a run's record logs, as numpy arrays (subsampled above a documented cap)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from loadtest.client.record import merged_gap_mask
from loadtest.contracts.record_line import LINE_DECODER, RecordLine
from loadtest.metrics.slo import RequestSlo

# Percentile bootstraps use at most this many ok requests per run (a seeded uniform subsample);
# throughput, goodput and attainment always count every request.
MAX_REQUESTS = 50_000
# Inter-token gaps come from at most this many requests (the first of the subsample above).
MAX_ITL_REQUESTS = 10_000
SAMPLE_SEED = 20240613


@dataclass
class RunSamples:
    """What the statistics need from one run's record logs."""

    n_ok: int
    n_sampled: int
    ttft_ms: np.ndarray  # per sampled ok request; NaN where undefined
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    itl_ms: np.ndarray  # every inter-token gap of the ITL requests
    itl_req: np.ndarray  # the request (0..n_itl_requests-1) each gap belongs to
    n_itl_requests: int
    start: float  # epoch s: first scheduled request
    end: float  # epoch s: last request done
    done: np.ndarray  # completion epoch of every ok request
    tokens: np.ndarray  # output tokens of every ok request (client count, server usage as fallback)
    usage_tokens: np.ndarray  # server-reported output tokens of every ok request (NaN when absent)
    judged_done: np.ndarray  # completion epoch of every judged (not cancelled) request
    judged_good: np.ndarray | None  # whether each judged request met the per-request SLO

    @property
    def duration_s(self) -> float:
        return max(self.end - self.start, 1e-9)


def _lines(paths: list[Path], window: tuple[float, float] | None) -> Iterator[RecordLine]:
    for path in paths:
        with open(path, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    break  # a line cut by a crash: everything before it is intact
                try:
                    line = LINE_DECODER.decode(raw)
                except msgspec.DecodeError:  # also msgspec.ValidationError
                    continue
                if window is None or window[0] <= line.t < window[1]:
                    yield line


def _ms(v: float | None) -> float:
    return float("nan") if v is None else v / 1000.0


def _done(ln: RecordLine) -> float:
    last = next((v for v in (ln.e2e_us, ln.headers_us, ln.sent_us) if v is not None), 0)
    return ln.t + last / 1e6


def _itl(sample: list[RecordLine]) -> tuple[np.ndarray, np.ndarray]:
    gaps: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    for i, ln in enumerate(sample[:MAX_ITL_REQUESTS]):
        if len(ln.chunks_us) > 1:
            times = np.asarray(ln.chunks_us, dtype=np.int64)
            g = np.diff(times) / 1000.0
            if ln.n_merged_gaps:  # as the ITL histogram: merged gaps are not timed (docs/metrics.md)
                g = g[~merged_gap_mask(times)]
            gaps.append(g)
            owners.append(np.full(g.size, i, dtype=np.int64))
    if not gaps:
        return np.empty(0), np.empty(0, dtype=np.int64)
    return np.concatenate(gaps), np.concatenate(owners)


def read_samples(
    paths: list[Path], rule: RequestSlo | None = None, window: tuple[float, float] | None = None
) -> RunSamples:
    """Arrays for one run, in one pass over its logs; ``window`` keeps requests scheduled in [start, end).

    The ok requests for the percentile bootstraps are a seeded reservoir sample of ``MAX_REQUESTS``.
    """
    rng = random.Random(SAMPLE_SEED)
    sample: list[RecordLine] = []
    done: list[float] = []
    tokens: list[int] = []
    usage: list[float] = []
    judged_done: list[float] = []
    good: list[bool] = []
    start, end = float("inf"), float("-inf")
    for ln in _lines(paths, window):
        d = _done(ln)
        start, end = min(start, ln.t), max(end, d)
        if ln.outcome != "cancelled":
            judged_done.append(d)
            if rule is not None:
                good.append(rule.is_good(ln))
        if ln.outcome != "ok":
            continue
        n = len(done)
        done.append(d)
        tokens.append(ln.output_tokens or ln.usage_completion_tokens or 0)
        usage.append(float("nan") if ln.usage_completion_tokens is None else ln.usage_completion_tokens)
        if n < MAX_REQUESTS:
            sample.append(ln)
        else:
            j = rng.randrange(n + 1)
            if j < MAX_REQUESTS:
                sample[j] = ln
    itl, owners = _itl(sample)
    return RunSamples(
        n_ok=len(done),
        n_sampled=len(sample),
        ttft_ms=np.array([_ms(ln.ttft_us) for ln in sample], dtype=float),
        tpot_ms=np.array([_ms(ln.tpot_us) for ln in sample], dtype=float),
        e2e_ms=np.array([_ms(ln.e2e_us) for ln in sample], dtype=float),
        itl_ms=itl,
        itl_req=owners,
        n_itl_requests=min(len(sample), MAX_ITL_REQUESTS),
        start=start if done or judged_done else 0.0,
        end=end if done or judged_done else 0.0,
        done=np.array(done, dtype=float),
        tokens=np.array(tokens, dtype=float),
        usage_tokens=np.array(usage, dtype=float),
        judged_done=np.array(judged_done, dtype=float),
        judged_good=np.array(good, dtype=bool) if rule is not None else None,
    )
