"""Per-process metric recorder: HDR histograms, outcome counters and per-second series, mergeable exactly."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from loadtest.client.record import RequestRecord, merged_flags, merged_gap_mask
from loadtest.metrics import hdr
from loadtest.metrics.conversations import LIVE_LATENCY, LiveConversations
from loadtest.metrics.delivery import MIN_EVENTS, mean_gap_us, merged_delivery, stream_bursts
from loadtest.metrics.tally import Tally

# Histogram names and what they hold (all integers; docs/metrics.md defines each).
LATENCY_METRICS: dict[str, str] = {
    "ttft": "time to first token from the scheduled time, µs",
    "ttft_send": "time to first token from the actual send, µs",
    "ttfa": "time to first answer (non-reasoning) token from the scheduled time, µs",
    "itl": "gap between consecutive token-carrying chunks, merged and burst gaps left out, µs",
    "tpot": "(latency − TTFT) / (output tokens − 1) per request, µs",
    "e2e": "end-to-end latency from the scheduled time, µs",
    "schedule_lag": "send time minus scheduled time (generator lag), µs",
}
RATE_METRICS: dict[str, str] = {
    "output_tps": "per-request output tokens/s (output tokens / end-to-end latency), milli-tokens/s",
}
# The generator's own CPU use, sampled once a second per process (permille of one core).
HEALTH_METRICS: dict[str, str] = {
    "generator_cpu": "generator process CPU, permille of one core",
    # A master's local worker processes and itself together, per core they may use: workers that share
    # cores are judged together (each alone can look idle on a saturated core).
    "generator_host_cpu": "the generator's processes on this host together, permille of each core they may use",
}
# How streams were delivered (metrics/delivery.py whole_bursts): each judged stream's mean gap between
# token events, and the same of the streams neither merged nor in bursts.
DELIVERY_METRICS: dict[str, str] = {
    "stream_gap": "a judged stream's mean gap between token events, µs",
    "stream_gap_unflagged": "the mean gap of a judged stream neither merged nor in bursts, µs",
}
# A conversation's latency, µs (metrics/conversations.py LiveConversations): up to a day.
CONVERSATION_METRICS: dict[str, str] = {
    LIVE_LATENCY: "a conversation's first send to its last call's end, µs"
}
HIST_HIGHEST = {
    **{n: hdr.HIGHEST_US for n in (*LATENCY_METRICS, *DELIVERY_METRICS)},
    LIVE_LATENCY: 86_400_000_000,
    "output_tps": 10**10,
    "generator_cpu": 100_000,
    "generator_host_cpu": 100_000,
}
# Per-second series columns, keyed by epoch second: requests by the second they completed in,
# output tokens by the second their chunks arrived in. Tokens are the counted ones (server usage
# when the server sent it, else the client tokenizer: RequestRecord.output_tokens / input_tokens).
SERIES_COLUMNS = ("completed", "ok", "errors", "output_tokens", "input_tokens")
MAX_ERROR_SAMPLES = 5
_FLUSH_AT = 65536
# The totals every ok request adds to, summed per track between flushes (a list index each, where two
# aggregates' dict updates cost a µs a request) in three groups, each written to the aggregates only
# when a request added to it: every ok request; a streamed one with chunks; one with a usage report.
_OK_SUMS = (
    "output_tokens",
    "input_tokens",
    "client_output_tokens",
    "client_input_tokens",
    "reasoning_tokens",
)
_STREAM_SUMS = ("stream_chunks", "stream_chunk_tokens")
_USAGE_SUMS = ("usage_reports", "usage_output_tokens", "usage_input_tokens", "usage_cached_tokens")
_SUM_KEYS = _OK_SUMS + _STREAM_SUMS + _USAGE_SUMS
_STREAM_AT, _USAGE_AT = len(_OK_SUMS), len(_OK_SUMS) + len(_STREAM_SUMS)
# (start, end) in _SUM_KEYS of each group; a group's first sum counts its requests (the ok group's
# are counted apart, in Track._ok_summed: its first sum may be zero)
_SUM_GROUPS = ((0, _STREAM_AT), (_STREAM_AT, _USAGE_AT), (_USAGE_AT, len(_SUM_KEYS)))
RECORDS_AT_ONCE = 64  # Recorder: records accounted together


class Aggregate:
    """Histograms, counters, series and the run window: the mergeable state of a recorder."""

    def __init__(self) -> None:
        self.hists: dict[str, HdrHistogram] = {n: hdr.new_histogram(h) for n, h in HIST_HIGHEST.items()}
        self.outcomes: Counter[str] = Tally()  # Tally: a Counter whose += costs what a dict's does
        self.totals: Counter[str] = Tally()
        self.series: defaultdict[int, list[int]] = defaultdict(lambda: [0] * len(SERIES_COLUMNS))
        self.error_samples: dict[str, list[str]] = {}
        self.first_scheduled: float | None = None
        self.last_done: float | None = None

    def extend_window(self, start: float | None, end: float | None) -> None:
        if start is not None and (self.first_scheduled is None or start < self.first_scheduled):
            self.first_scheduled = start
        if end is not None and (self.last_done is None or end > self.last_done):
            self.last_done = end

    def add_error_sample(self, outcome: str, message: str) -> None:
        samples = self.error_samples.setdefault(outcome, [])
        if message and len(samples) < MAX_ERROR_SAMPLES and message not in samples:
            samples.append(message)

    def to_wire(self) -> dict[str, Any]:
        """A msgpack/JSON-friendly form; histograms in HdrHistogram's compressed encoding."""
        return {
            "hists": {n: hdr.encode(h) for n, h in self.hists.items() if h.get_total_count()},
            "outcomes": dict(self.outcomes),
            "totals": dict(self.totals),
            "series": {str(k): v for k, v in self.series.items()},
            "error_samples": self.error_samples,
            "first_scheduled": self.first_scheduled,
            "last_done": self.last_done,
        }

    def merge_wire(self, wire: dict[str, Any]) -> None:
        """Add another aggregate's wire form into this one, exactly."""
        for name, enc in wire.get("hists", {}).items():
            hdr.add_encoded(self.hists[name], enc)
        self.outcomes.update(wire.get("outcomes", {}))
        self.totals.update(wire.get("totals", {}))
        for sec, vals in wire.get("series", {}).items():
            row = self.series[int(sec)]
            for i, v in enumerate(vals):
                row[i] += v
        for out, msgs in wire.get("error_samples", {}).items():
            for m in msgs:
                self.add_error_sample(out, m)
        self.extend_window(wire.get("first_scheduled"), wire.get("last_done"))

    @property
    def completed(self) -> int:
        return sum(self.outcomes.values())


class Track:
    """Turns finished records into metrics: the running total and, where reports take them
    (``deltas``: a worker's, a master's own), the delta since the last report."""

    def __init__(self, deltas: bool = True) -> None:
        self._total = Aggregate()
        self.delta: Aggregate | None = Aggregate() if deltas else None
        self._both = (self._total, self.delta) if self.delta is not None else (self._total,)
        # Values wait here and are recorded in bulk (HdrHistogram's record_value is pure Python).
        self._pending: dict[str, list[int]] = {name: [] for name in HIST_HIGHEST}
        self._itl_pending: list[np.ndarray] = []
        self._pending_n = 0
        self._sums = [0] * len(_SUM_KEYS)  # the ok requests' totals since the last flush (_SUM_KEYS)
        self._ok_summed = 0  # ok requests in _sums

    @property
    def total(self) -> Aggregate:
        """Everything recorded so far (pending values flushed first)."""
        self.flush()
        return self._total

    def add(self, rec: RequestRecord) -> None:
        """Account one finished request (called once per request, off the per-read path)."""
        scheduled_ns = rec.scheduled_ns
        start = rec.scheduled_epoch
        end = start + ((rec.done_ns or rec.sent_ns or scheduled_ns) - scheduled_ns) / 1e9
        pending = self._pending
        n_values = 0
        if rec.sent_ns:
            pending["schedule_lag"].append((rec.sent_ns - scheduled_ns) // 1000)
            n_values = 1
        second = int(end)
        if rec.outcome != "ok":
            for agg in self._both:
                agg.outcomes[rec.outcome] += 1
                agg.extend_window(start, end)
                row = agg.series[second]
                row[0] += 1
                row[2] += 1
                agg.add_error_sample(rec.outcome, rec.error)
            self._added(n_values)
            return
        n_out, n_in = rec.output_tokens, rec.input_tokens
        merged = burst = 0  # token gaps left out of ITL (merged_gap_mask; burst_gap_mask of a bursty stream)
        judged_delivery = merged_stream = False  # how the stream was delivered (metrics/delivery.py)
        e2e = (rec.done_ns - scheduled_ns) // 1000
        pending["e2e"].append(e2e)
        n_values += 1
        if e2e > 0:
            pending["output_tps"].append(n_out * 1_000_000_000 // e2e)
            n_values += 1
        chunks = rec.chunk_ns
        if rec.stream and rec.first_token_ns:
            pending["ttft"].append((rec.first_token_ns - scheduled_ns) // 1000)
            pending["ttft_send"].append((rec.first_token_ns - rec.sent_ns) // 1000)
            n_values += 2
            if rec.first_answer_ns:
                pending["ttfa"].append((rec.first_answer_ns - scheduled_ns) // 1000)
                n_values += 1
            tpot = rec.tpot_us()
            if tpot is not None:
                pending["tpot"].append(round(tpot))
                n_values += 1
            if 1 < len(chunks) < MIN_EVENTS:  # short: no delivery judgement, plain Python
                # indexed loops: compiled, C loops (pairwise and zip are iterator objects)
                short = [(chunks[i + 1] - chunks[i]) // 1000 for i in range(len(chunks) - 1)]
                if rec.merged_gaps:  # gaps the client could not time stay out of ITL, counted
                    flags = merged_flags(chunks)
                    merged = sum(flags)
                    short = [short[i] for i in range(len(short)) if not flags[i]]
                pending["itl"] += short
                n_values += len(short)
            elif len(chunks) > 1:
                times = rec.chunk_times()
                gaps = (times[1:] - times[:-1]) // 1000  # np.diff's work without its wrapper
                if rec.merged_gaps:  # gaps the client could not time stay out of ITL, counted
                    mask = merged_gap_mask(times)
                    merged = int(mask.sum())
                    gaps = gaps[~mask]
                judged_delivery = times.size >= MIN_EVENTS
                merged_stream = judged_delivery and bool(merged) and bool(merged_delivery(times))
                bursts = stream_bursts(times) if judged_delivery and not merged_stream else None
                if bursts is not None:  # re-sent close together: they time the proxy
                    burst = int(bursts.sum())
                    gaps = (times[1:] - times[:-1])[~(bursts | merged_gap_mask(times))] // 1000
                if judged_delivery:  # a stream re-sent whole is told by the run's other streams
                    mean_gap = mean_gap_us(times)
                    pending["stream_gap"].append(mean_gap)
                    n_values += 1
                    if not merged_stream and bursts is None:
                        pending["stream_gap_unflagged"].append(mean_gap)
                        n_values += 1
                self._itl_pending.append(gaps)
                n_values += gaps.size
        # output_tokens / input_tokens: the counted tokens every figure uses; client_*: the client
        # tokenizer's own counts, kept as the cross-check (docs/metrics.md).
        sums = self._sums
        self._ok_summed += 1
        sums[0] += n_out
        sums[1] += n_in
        sums[2] += rec.completion_tokens_client
        sums[3] += rec.prompt_tokens_client
        sums[4] += rec.reasoning_tokens_client
        if rec.stream and chunks:  # tokens a chunk (several with speculative decoding)
            sums[_STREAM_AT] += len(chunks)
            sums[_STREAM_AT + 1] += n_out
        inc: list[tuple[str, int]] = []  # the rarer totals, added at once
        if merged:
            inc.append(("itl_merged_gaps", merged))
        if judged_delivery:
            inc.append(("delivery_streams", 1))
        if merged_stream:
            inc.append(("delivery_merged_streams", 1))
        if burst:
            inc += (("itl_burst_gaps", burst), ("delivery_burst_streams", 1))
        server_out = rec.completion_tokens_server
        if server_out is not None:
            sums[_USAGE_AT] += 1
            sums[_USAGE_AT + 1] += server_out
            sums[_USAGE_AT + 2] += rec.prompt_tokens_server or 0
            sums[_USAGE_AT + 3] += rec.cached_tokens_server or 0
            if server_out != rec.completion_tokens_client:
                inc.append(("token_mismatch_requests", 1))
            if rec.prompt_tokens_server is not None and rec.prompt_tokens_server != rec.prompt_tokens_client:
                inc.append(("token_input_mismatch_requests", 1))
        token_seconds = self._output_tokens_by_second(rec, n_out, start)
        for agg in self._both:
            agg.outcomes["ok"] += 1
            agg.extend_window(start, end)
            row = agg.series[second]
            row[0] += 1
            row[1] += 1
            row[4] += n_in
            for sec, n in token_seconds:
                agg.series[sec][3] += n
            totals = agg.totals
            for key, n in inc:  # Counter.update's work without its Mapping check
                totals[key] += n
        self._added(n_values)

    def _added(self, n_values: int) -> None:
        """``n_values`` more values wait in ``_pending``: recorded in bulk once there are enough."""
        self._pending_n += n_values
        if self._pending_n >= _FLUSH_AT:
            self.flush()

    def note(self, counter: str, n: int = 1) -> None:
        for agg in self._both:
            agg.totals[counter] += n

    def sample(self, name: str, value: int) -> None:
        """Record a value that is not about a request (health samples)."""
        self._pending[name].append(value)
        self._pending_n += 1

    @staticmethod
    def _output_tokens_by_second(rec: RequestRecord, n_out: int, start: float) -> list[tuple[int, int]]:
        """Output tokens attributed to the seconds in which their chunks arrived (not the completion second)."""
        chunks = rec.chunk_ns
        if not chunks or not rec.stream:
            return [(int(start + (rec.done_ns - rec.scheduled_ns) / 1e9), n_out)]
        first = int(start + (chunks[0] - rec.scheduled_ns) / 1e9)
        if first == int(start + (chunks[-1] - rec.scheduled_ns) / 1e9):
            return [(first, n_out)]
        last = int(start + (chunks[-1] - rec.scheduled_ns) / 1e9)
        # Chunk times are sorted: find where each second starts (a request spans few seconds).
        out: list[tuple[int, int]] = []
        scale = n_out / len(chunks)  # chunks may carry several tokens; whole tokens add up to n_out
        done_chunks = done_tokens = 0
        for sec in range(first, last + 1):
            if sec < last:
                edge_ns = rec.scheduled_ns + round((sec + 1 - start) * 1e9)
                upto = bisect_left(chunks, edge_ns, done_chunks)
            else:
                upto = len(chunks)
            tokens = round(upto * scale) - done_tokens
            if upto > done_chunks:
                out.append((sec, tokens))
            done_chunks, done_tokens = upto, done_tokens + tokens
        return out

    def flush(self) -> None:
        """Record every pending value in bulk (vectorized), and add the summed totals, into the total
        and the delta."""
        if self._ok_summed:
            self._flush_sums()
        if not self._pending_n:
            return
        for name, values in self._pending.items():
            if values or (name == "itl" and self._itl_pending):
                arr = np.asarray(values, dtype=np.int64)
                if name == "itl" and self._itl_pending:  # the gaps arrive as one array per request
                    arr = np.concatenate([arr, *self._itl_pending])
                    self._itl_pending.clear()
                for agg in self._both:
                    hdr.record_many(agg.hists[name], arr)
                values.clear()
        self._pending_n = 0

    def _flush_sums(self) -> None:
        """``_sums`` into both aggregates' totals: each group whose count is not zero (a total an ok
        request added to is there, if zero), then zeroed."""
        sums = self._sums
        for agg in self._both:
            totals = agg.totals
            for start, end in _SUM_GROUPS:
                if start == 0 or sums[start]:
                    for i in range(start, end):
                        totals[_SUM_KEYS[i]] += sums[i]
        self._sums = [0] * len(_SUM_KEYS)
        self._ok_summed = 0

    def take_delta(self) -> dict[str, Any]:
        """Everything recorded since the last call, in wire form; starts a new delta."""
        if self.delta is None:
            raise RuntimeError("this recorder keeps no deltas (Recorder(deltas=True) for reports)")
        self.flush()
        wire = self.delta.to_wire()
        self.delta = Aggregate()
        self._both = (self._total, self.delta)
        return wire


CELL_SEP = "\t"  # a cell's wire key: scenario, tab, endpoint index


class RunAggregates:
    """The merged state of a run: all requests, each scenario apart when the profile mixes several, and
    each (scenario, endpoint index) cell when the run has several endpoints (the live metrics' split)."""

    def __init__(self) -> None:
        self.all = Aggregate()
        self.scenarios: dict[str, Aggregate] = {}
        self.cells: dict[tuple[str, int], Aggregate] = {}

    def merge_wire(self, wire: dict[str, Any]) -> None:
        self.all.merge_wire(wire["all"])
        for name, w in wire.get("scenarios", {}).items():
            self.scenarios.setdefault(name, Aggregate()).merge_wire(w)
        for key, w in wire.get("cells", {}).items():
            scenario, _, endpoint = key.rpartition(CELL_SEP)
            self.cells.setdefault((scenario, int(endpoint)), Aggregate()).merge_wire(w)


class Recorder:
    """Per-process recorder: one track for all requests, plus one per scenario when asked, and one per
    (scenario, endpoint) cell when the run has several endpoints (``per_endpoint``). ``deltas``: keep
    what ``take_delta`` ships (a process that reports to a master); without, each record is kept once.

    Records wait in a queue and are accounted ``RECORDS_AT_ONCE`` at a time, or when anything reads the
    recorder (``all``, ``scenarios``, ``cells``, ``total``, ``result``, ``take_delta``, ``flush``):
    accounted back to back, a record costs less CPU than between two requests (tests/bench/README.md),
    and no reader ever sees a record left out."""

    def __init__(self, per_scenario: bool = False, per_endpoint: bool = False, deltas: bool = True) -> None:
        self.deltas = deltas
        self._all = Track(deltas)
        self.per_scenario = per_scenario
        self.per_endpoint = per_endpoint
        self._scenarios: dict[str, Track] = {}
        self._cells: dict[tuple[str, int], Track] = {}
        self.conversations = LiveConversations()
        self._queue: list[tuple[Callable[[RequestRecord, bool], None], RequestRecord, bool]] = []

    @property
    def all(self) -> Track:
        """The track of every request."""
        self._drain()
        return self._all

    @property
    def scenarios(self) -> dict[str, Track]:
        """Each scenario's track (``per_scenario``)."""
        self._drain()
        return self._scenarios

    @property
    def cells(self) -> dict[tuple[str, int], Track]:
        """Each (scenario, endpoint index) cell's track (``per_endpoint``)."""
        self._drain()
        return self._cells

    def add(self, rec: RequestRecord) -> None:
        """Account one finished request (queued)."""
        self._queue.append((self._account, rec, False))
        if len(self._queue) >= RECORDS_AT_ONCE:
            self._drain()

    def judge_request(self, rec: RequestRecord, good: bool) -> None:
        """Count a judged request against the per-request SLO (live attainment and goodput; queued)."""
        self._queue.append((self._judge, rec, good))

    def converse(self, rec: RequestRecord, good: bool) -> None:
        """Account a conversation's call (``good``: it met the per-request SLOs) in the run's live
        conversation figures (the whole run's track; queued)."""
        self._queue.append((self._converse, rec, good))

    def _drain(self) -> None:
        """Account the queued records, in the order they came."""
        if self._queue:
            queue, self._queue = self._queue, []
            for op, rec, good in queue:
                op(rec, good)

    def _account(self, rec: RequestRecord, _: bool) -> None:
        self._all.add(rec)
        if self.per_scenario:
            track = self._scenarios.get(rec.scenario)
            if track is None:
                track = self._scenarios[rec.scenario] = Track(self.deltas)
            track.add(rec)
        if self.per_endpoint:
            key = (rec.scenario, rec.endpoint)
            cell = self._cells.get(key)
            if cell is None:
                cell = self._cells[key] = Track(self.deltas)
            cell.add(rec)

    def _judge(self, rec: RequestRecord, good: bool) -> None:
        tracks = [self._all]
        if self.per_scenario and rec.scenario in self._scenarios:
            tracks.append(self._scenarios[rec.scenario])
        if (rec.scenario, rec.endpoint) in self._cells:
            tracks.append(self._cells[(rec.scenario, rec.endpoint)])
        for t in tracks:
            t.note("slo_judged")
            if good:
                t.note("slo_good")
                t.note("slo_good_output_tokens", rec.output_tokens)

    def _converse(self, rec: RequestRecord, good: bool) -> None:
        self.conversations.add(rec, good, self._all)

    @property
    def total(self) -> Aggregate:
        return self.all.total

    def note(self, counter: str, n: int = 1) -> None:
        """Count an event that is not a request (e.g. a skipped arrival) in the run totals."""
        self._all.note(counter, n)

    def sample_cpu(self, percent: float) -> None:
        """One sample of this process's CPU use (percent of one core)."""
        self._all.sample("generator_cpu", round(percent * 10))

    def flush(self) -> None:
        for t in (self.all, *self._scenarios.values(), *self._cells.values()):
            t.flush()

    def take_delta(self) -> dict[str, Any]:
        """Wire form of everything since the last call (all requests, per scenario, per cell)."""
        wire: dict[str, Any] = {
            "all": self.all.take_delta(),
            "scenarios": {n: t.take_delta() for n, t in self._scenarios.items()},
        }
        if self._cells:
            wire["cells"] = {f"{s}{CELL_SEP}{e}": t.take_delta() for (s, e), t in self._cells.items()}
        return wire

    def result(self) -> RunAggregates:
        """This process's totals in the shape a master's merge produces."""
        out = RunAggregates()
        out.all = self.all.total
        out.scenarios = {n: t.total for n, t in self._scenarios.items()}
        out.cells = {k: t.total for k, t in self._cells.items()}
        return out
