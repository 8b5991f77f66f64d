"""The judged window: warm-up and cool-down cut off, metrics rebuilt from the record log, the
generator's steady-state health, and goodput."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from loadtest.client.record import RequestRecord, line_output_tokens
from loadtest.contracts.record_line import LineLike, RecordLine, as_line
from loadtest.metrics import hdr
from loadtest.metrics.recorder import HIST_HIGHEST, Recorder, RunAggregates
from loadtest.metrics.slo import AnySlo, RequestSlo, goodput

_BASE_NS = 10**12  # records keep µs offsets from their scheduled time; rebuild on a non-zero base

# The default warm-up (when neither the profile's judging.warmup_s nor --warmup says): requests
# scheduled in the first 10 % of the schedule, at most 30 s, are left out of the judged window. Every
# stream starting at once, connections being set up and caches filling are the start-up, not the
# endpoint's steady state. ``--warmup 0`` judges from the first request.
DEFAULT_WARMUP_SHARE = 0.1
DEFAULT_WARMUP_MAX_S = 30.0

# Lines as the caller holds them: RecordLines, or their dict form (read_records); judge_lines hands
# back the caller's own objects.
LineT = TypeVar("LineT", RecordLine, Mapping[str, Any])


def default_warmup_s(span_s: float) -> float:
    """The default warm-up of a schedule ``span_s`` seconds long: 10 % of it, at most 30 s."""
    return round(min(DEFAULT_WARMUP_MAX_S, max(0.0, span_s) * DEFAULT_WARMUP_SHARE), 3)


def describe_warmup(warmup: float | str | None, duration_s: float) -> str:
    """For the start-up line: ``judged after a 3 s warm-up (the default: 10 % of the run, at most 30 s;
    --warmup 0 judges from the start)``."""
    if warmup is None:
        return (
            f"judged after a {default_warmup_s(duration_s):g} s warm-up (the default: "
            f"{DEFAULT_WARMUP_SHARE:.0%} of the run, at most {DEFAULT_WARMUP_MAX_S:g} s; --warmup 0 judges from the start)"
        )
    if warmup == "auto":
        return "judged from the detected steady state (warm-up auto)"
    return (
        f"judged after a {float(warmup):g} s warm-up"
        if warmup
        else "judged from the first request (no warm-up)"
    )


@dataclass(frozen=True)
class Window:
    """Requests scheduled in [start, end) (epoch seconds) are judged."""

    start: float
    end: float
    warmup_s: float
    cooldown_s: float
    automatic: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "duration_s": round(self.end - self.start, 3),
            "warmup_s": round(self.warmup_s, 3),
            "cooldown_s": round(self.cooldown_s, 3),
            "automatic": self.automatic,
        }


def record_from_line(line: LineLike) -> RequestRecord:
    """A record-log line back into a RequestRecord (µs resolution), so metrics are computed one way only."""
    return RequestRecord.from_log(as_line(line), _BASE_NS)


def aggregate_lines(lines: Iterable[LineLike], per_scenario: bool) -> RunAggregates:
    """Metrics of the given record-log lines, through the same recorder a live run uses."""
    rec = Recorder(per_scenario=per_scenario)
    for line in lines:
        rec.add(record_from_line(line))
    return rec.result()


def _completion_rates(lines: Sequence[RecordLine], t0: float) -> list[float]:
    """Output tokens of ok requests per second of completion, from the run's start."""
    per_sec: dict[int, float] = defaultdict(float)
    for r in lines:
        if r.outcome == "ok" and r.e2e_us is not None:
            per_sec[int(r.t + r.e2e_us / 1e6 - t0)] += line_output_tokens(r)
    n = max(per_sec) + 1 if per_sec else 0
    return [per_sec.get(i, 0.0) for i in range(n)]


def steady_state(rates: Sequence[float], span: int = 3, level: float = 0.9) -> tuple[int, int]:
    """(first, last) second of steady state: where the rolling ``span``-second mean of throughput first
    reaches, and last holds, ``level`` × the median of the run's middle half."""
    n = len(rates)
    if n < 4 * span:
        return 0, n
    middle = sorted(rates[n // 4 : n - n // 4])
    ref = statistics.median(middle) * level
    rolling = [sum(rates[i : i + span]) / span for i in range(n - span + 1)]
    first = next((i for i, v in enumerate(rolling) if v >= ref), 0)
    last = next((i + span for i in range(len(rolling) - 1, -1, -1) if rolling[i] >= ref), n)
    return first, max(last, first + 1)


def choose_window(lines: Sequence[LineLike], warmup: float | str, cooldown: float | str) -> Window:
    """The judged window from fixed warm-up/cool-down seconds, or ``"auto"`` (steady-state detection)."""
    recs = [as_line(r) for r in lines]
    t0 = min(r.t for r in recs)
    t_last = max(r.t for r in recs)
    automatic = warmup == "auto" or cooldown == "auto"
    rates = _completion_rates(recs, t0) if automatic else []
    first, last = steady_state(rates) if automatic else (0, 0)
    w = float(first) if warmup == "auto" else float(warmup)
    c = max(0.0, t_last - (t0 + last)) if cooldown == "auto" else float(cooldown)
    start, end = t0 + w, t_last - c + 1e-6
    if end <= start:
        raise ValueError(
            f"warm-up {w:g} s and cool-down {c:g} s leave nothing of a {t_last - t0:.1f} s schedule to judge"
        )
    return Window(start, end, w, c, automatic)


def in_window(lines: Iterable[LineT], window: Window) -> list[LineT]:
    return [r for r in lines if window.start <= as_line(r).t < window.end]


def schedule_span_s(lines: Sequence[LineLike]) -> float:
    """Seconds from the first to the last scheduled request of the record-log lines (0 without lines)."""
    if not lines:
        return 0.0
    ts = [as_line(r).t for r in lines]
    return max(ts) - min(ts)


def steady_health(lines: Sequence[LineLike], startup_s: float) -> dict[str, Any]:
    """The generator's schedule lag over its steady state: requests scheduled ``startup_s`` or more
    after the first one (the first requests of every connection pay its set-up; a run's start is not
    what the generator sustains). Falls back to every request when none is left after the start-up.

    Returns ``startup_s`` (the seconds left out), ``requests`` (lag samples judged),
    ``schedule_lag_p99_ms`` (HDR p99, like run.json's percentiles; None without samples) and
    ``whole_run_schedule_lag_p99_ms``.
    """

    def p99(values: list[int]) -> float | None:
        if not values:
            return None
        h = hdr.new_histogram(HIST_HIGHEST["schedule_lag"])
        hdr.record_many(h, values)
        return round(h.get_value_at_percentile(99) / 1000.0, 3)

    recs = [as_line(r) for r in lines]
    t0 = min((r.t for r in recs), default=0.0)
    every = [max(0, r.sent_us) for r in recs if r.sent_us is not None]
    steady = [max(0, r.sent_us) for r in recs if r.sent_us is not None and r.t >= t0 + startup_s]
    used = steady if steady else every
    return {
        "startup_s": round(startup_s, 3) if steady else 0.0,
        "requests": len(used),
        "schedule_lag_p99_ms": p99(used),
        "whole_run_schedule_lag_p99_ms": p99(every),
    }


def goodput_summary(
    lines: Sequence[LineLike], slos: Sequence[AnySlo], per_scenario: bool
) -> dict[str, Any] | None:
    """SLO attainment and goodput (good requests/s, good output tokens/s), overall and per scenario.

    A request is good when it is ok and meets the per-request TTFT and TPOT limits taken from the
    SLOs (the highest percentile's limit for each). None without a TTFT or TPOT SLO."""
    rule = RequestSlo.from_slos(slos)
    if rule.ttft_ms is None and rule.tpot_ms is None:
        return None
    done = [r for r in map(as_line, lines) if r.outcome != "cancelled"]
    if not done:
        return None
    start = min(r.t for r in done)
    end = max(r.t + (r.e2e_us or 0) / 1e6 for r in done) + 1e-6

    def one(rs: Sequence[RecordLine]) -> dict[str, Any]:
        g = goodput(rs, rule, (start, end))
        return {
            "judged": g.judged,
            "good": g.good,
            "attainment": None if g.attainment is None else round(g.attainment, 6),
            "good_requests_per_s": round(g.requests_per_s, 4),
            "good_output_tokens_per_s": round(g.output_tokens_per_s, 3),
        }

    out: dict[str, Any] = {"rule": {"ttft_ms": rule.ttft_ms, "tpot_ms": rule.tpot_ms}, **one(done)}
    per_second: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in done:
        sec = int(r.t + (r.e2e_us or 0) / 1e6 - start)
        per_second[sec][0] += 1
        per_second[sec][1] += rule.is_good(r)
    secs = sorted(per_second)
    out["series"] = {
        "t": secs,
        "judged": [per_second[s][0] for s in secs],
        "good": [per_second[s][1] for s in secs],
    }
    if per_scenario:
        by: dict[str, list[RecordLine]] = defaultdict(list)
        for r in done:
            by[r.scenario].append(r)
        out["scenarios"] = {name: one(rs) for name, rs in sorted(by.items())}
    return out


@dataclass
class JudgedRun(Generic[LineT]):
    """What the verdict judges: the window (None: the whole run), its lines (the caller's own objects)
    and metrics, the generator's steady-state health, the judging settings used (run.json
    ``config.judging``) and a note when the asked-for window could not be used."""

    window: Window | None
    lines: list[LineT]
    aggregates: RunAggregates | None
    health: dict[str, Any]
    config: dict[str, Any]
    note: str | None = None


def judge_lines(
    lines: Sequence[LineT],
    warmup: float | str | None,
    cooldown: float | str,
    per_scenario: bool,
) -> JudgedRun[LineT]:
    """The judged window from the profile's (or --warmup's) warm-up, ``None`` for the default
    (default_warmup_s of the schedule), and the cool-down; metrics rebuilt from the lines inside it.

    The generator's health is judged over its steady state whatever the warm-up: requests scheduled
    in the default warm-up (or the window's, when longer) are left out of the schedule-lag p99.
    """
    recs = [as_line(r) for r in lines]
    span = schedule_span_s(recs)
    default = warmup is None
    w: float | str = default_warmup_s(span) if warmup is None else warmup
    config: dict[str, Any] = {
        "warmup_s": w,
        "warmup_source": "default" if default else "set",
        "cooldown_s": cooldown,
    }
    window: Window | None = None
    note: str | None = None
    inside: list[LineT] = list(lines)
    judged = recs
    if recs and (w or cooldown):
        try:
            window = choose_window(recs, w, cooldown)
        except ValueError as e:
            note = f"judged window: {e}; the whole run is judged"
        else:
            keep = [i for i, r in enumerate(recs) if window.start <= r.t < window.end]
            if not keep:
                note = f"judged window: no request was scheduled in [{window.start:.3f}, {window.end:.3f}); the whole run is judged"
                window = None
            else:
                inside, judged = [lines[i] for i in keep], [recs[i] for i in keep]
    startup = max(default_warmup_s(span), window.warmup_s if window is not None else 0.0)
    health = steady_health(recs, startup)
    config["generator_health_startup_s"] = health["startup_s"]
    aggregates = aggregate_lines(judged, per_scenario) if window is not None else None
    return JudgedRun(window, inside, aggregates, health, config, note)
