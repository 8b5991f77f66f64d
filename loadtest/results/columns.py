"""Columnar record-log reading: msgspec-decoded batches of numpy arrays, in bounded memory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from pathlib import Path

import msgspec
import numpy as np

from loadtest.client.record import OUTCOMES
from loadtest.contracts.record_line import RecordLine

READ_BYTES = 8 << 20  # one batch is about this much log text (a few tens of MB decoded)


class _Line(RecordLine):
    """A record-log line with its chunk times left as JSON text, parsed in bulk per batch (_chunk_arrays)."""

    chunks_us: msgspec.Raw = msgspec.Raw(b"[]")  # type: ignore[assignment]


_batch_dec = msgspec.json.Decoder(list[_Line])
_line_dec = msgspec.json.Decoder(_Line)
_ints_dec = msgspec.json.Decoder(list[int])
_FLOAT_FIELDS = (
    "t",
    "sent_us",
    "headers_us",
    "ttft_us",
    "e2e_us",
    "tpot_us",
    "requested_output_tokens",
    "prompt_tokens",
    "output_tokens",
    "reasoning_tokens",
    "usage_prompt_tokens",
    "usage_completion_tokens",
    "usage_cached_tokens",
    "stream",  # 1.0 for a streamed request
)


class Codes:
    """Small integer codes for repeated strings (outcomes, scenarios), stable across batches."""

    def __init__(self, known: tuple[str, ...] = ()) -> None:
        self.names: list[str] = list(known)
        self._index = {n: i for i, n in enumerate(self.names)}

    def encode(self, values: list[str]) -> np.ndarray:
        index = self._index
        for v in set(values) - index.keys():
            index[v] = len(self.names)
            self.names.append(v)
        return np.fromiter(map(index.__getitem__, values), np.int32, len(values))


@dataclass
class LogBatch:
    """One batch of records as columns. Float columns hold NaN where the log has null.

    Times are µs after each record's scheduled epoch ``t``; ``end_us`` is the last moment the
    request was seen (its end, else its last chunk, headers or send time); ``itl_*`` summarize the
    gaps between its token-carrying chunks; ``chunk_*`` are per chunk (flattened, record order);
    ``gap_us[j]`` is the gap that ends at chunk ``gap_chunk[j]`` (gaps within one record only; merged
    gaps left out: client/record.py ``merged_gap_mask``).
    """

    n: int
    ids: list[str]
    errors: list[str | None]
    finish_reasons: list[str | None]
    scenario: np.ndarray
    outcome: np.ndarray
    worker: np.ndarray
    status: np.ndarray
    f: dict[str, np.ndarray]
    end_us: np.ndarray
    n_chunks: np.ndarray
    itl_mean_us: np.ndarray
    itl_max_us: np.ndarray
    chunk_record: np.ndarray
    chunk_us: np.ndarray
    gap_us: np.ndarray
    gap_chunk: np.ndarray


class LogReader:
    """Reads record logs batch by batch; string columns share one code table across batches."""

    def __init__(self, paths: list[Path], read_bytes: int = READ_BYTES) -> None:
        self.paths = paths
        self.read_bytes = read_bytes
        self.outcomes = Codes(OUTCOMES)
        self.scenarios = Codes()
        self.skipped_lines = 0

    def batches(self) -> Iterator[LogBatch]:
        for lines in self._line_groups():
            recs = self._decode(lines)
            if recs:
                yield self._columns(recs)

    def _line_groups(self) -> Iterator[list[bytes]]:
        """Complete lines in groups of about ``read_bytes``; a last line cut mid-way is skipped."""
        for path in self.paths:
            rest = b""
            with open(path, "rb") as f:
                while block := f.read(self.read_bytes):
                    lines = (rest + block).split(b"\n")
                    rest = lines.pop()
                    lines = [ln for ln in lines if ln.strip()]
                    if lines:
                        yield lines
            if rest.strip():
                self.skipped_lines += 1  # cut by a crash: everything before it is intact

    def _decode(self, lines: list[bytes]) -> list[_Line]:
        try:
            return _batch_dec.decode(b"[" + b",".join(lines) + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError):
            out = []
            for line in lines:
                try:
                    out.append(_line_dec.decode(line))
                except (msgspec.DecodeError, msgspec.ValidationError):
                    self.skipped_lines += 1
            return out

    def _columns(self, recs: list[_Line]) -> LogBatch:
        n = len(recs)
        f = {k: np.array(list(map(attrgetter(k), recs)), dtype=np.float64) for k in _FLOAT_FIELDS}
        lens, flat = _chunk_arrays([bytes(r.chunks_us) for r in recs])
        total = int(flat.size)
        ends = np.cumsum(lens)
        starts = ends - lens
        chunk_record = np.repeat(np.arange(n, dtype=np.int64), lens)
        has = lens > 0
        first = np.full(n, np.nan)
        last = np.full(n, np.nan)
        first[has] = flat[starts[has]]
        last[has] = flat[ends[has] - 1]
        # Gaps between consecutive chunks of the same record (cross-record gaps dropped).
        gaps = np.diff(flat).astype(np.float64)
        within = np.ones(max(total - 1, 0), dtype=bool)
        cut = ends[(ends > 0) & (ends < total)] - 1
        within[cut] = False
        masked = np.where(within, gaps, -1.0)
        # A gap whose later chunk shared its read with another is not timed (client/record.py
        # merged_gap_mask): the ITL heat map leaves it out, as the ITL histogram does.
        same = within & (gaps == 0)
        merged = same.copy()
        merged[:-1] |= same[1:]
        timed = within & ~merged
        multi = lens >= 2
        itl_max = np.full(n, np.nan)
        if multi.any():
            itl_max[multi] = np.maximum.reduceat(masked, starts[multi])
        itl_mean = np.full(n, np.nan)
        itl_mean[multi] = (last[multi] - first[multi]) / (lens[multi] - 1)
        end = np.fmax.reduce([f["e2e_us"], last, f["headers_us"], f["sent_us"]])
        end = np.where(np.isnan(end), 0.0, end)
        return LogBatch(
            n=n,
            ids=list(map(attrgetter("id"), recs)),
            errors=list(map(attrgetter("error"), recs)),
            finish_reasons=list(map(attrgetter("finish_reason"), recs)),
            scenario=self.scenarios.encode(list(map(attrgetter("scenario"), recs))),
            outcome=self.outcomes.encode(list(map(attrgetter("outcome"), recs))),
            worker=np.fromiter(map(attrgetter("worker"), recs), np.int32, n),
            status=np.array([r.status or 0 for r in recs], dtype=np.int32),
            f=f,
            end_us=end,
            n_chunks=lens,
            itl_mean_us=itl_mean,
            itl_max_us=itl_max,
            chunk_record=chunk_record,
            chunk_us=flat,
            gap_us=gaps[timed],
            gap_chunk=np.flatnonzero(timed) + 1,
        )


def _chunk_arrays(raws: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Per record its chunk count, and all chunk times flattened: one text parse for the whole batch."""
    lens = np.fromiter((r.count(b",") + 1 if len(r) > 2 else 0 for r in raws), np.int64, len(raws))
    body = b",".join([r[1:-1] for r in raws if len(r) > 2])
    try:
        flat = np.fromstring(body, dtype=np.int64, sep=",") if body else np.zeros(0, np.int64)
    except ValueError:
        flat = None
    if flat is None or flat.size != int(lens.sum()):  # not plain integer lists: decode each one
        lists = []
        for r in raws:
            try:
                lists.append(_ints_dec.decode(r))
            except (msgspec.DecodeError, msgspec.ValidationError):
                lists.append([])
        lens = np.fromiter(map(len, lists), np.int64, len(lists))
        flat = np.fromiter(chain.from_iterable(lists), np.int64, int(lens.sum()))
    return lens, flat


def iter_batches(paths: list[Path]) -> Iterator[LogBatch]:
    """Batches of every given log, in file order (see ``LogReader``)."""
    return LogReader(paths).batches()
