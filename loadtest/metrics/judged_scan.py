"""The judged window, the generator's steady-state health and goodput from a record log read batch by
batch: their one implementation (``metrics/judged.py`` holds the default warm-up, ``Window`` and
``steady_state`` it uses).

Pass one (``JudgingScan.add``) keeps a few compact columns per request, never a line. ``window()``
then chooses the judged window; pass two feeds the lines inside it (``JudgedWindow.contains``) to a
``LineAggregator``, the same recorder a live run uses."""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from loadtest.client.record import line_output_tokens
from loadtest.contracts.record_line import RecordLine
from loadtest.metrics import hdr
from loadtest.metrics.judged import Window, default_warmup_s, record_from_line, steady_state
from loadtest.metrics.recorder import HIST_HIGHEST, Recorder, RunAggregates
from loadtest.metrics.slo import AnySlo, RequestSlo

_NOT_CANCELLED, _GOOD, _OK_DONE = 1, 2, 4  # flag bits per request
_NO_SEND = -1  # schedule lag column: the request was never sent
MIN_IN_FLIGHT_SPAN_S = 2.0  # the steady span the streams held are averaged over, at least


class LineAggregator:
    """Record-log lines into run aggregates, batch by batch, through the recorder a live run uses."""

    def __init__(self, per_scenario: bool) -> None:
        self._recorder = Recorder(per_scenario=per_scenario)

    def add(self, lines: Iterable[RecordLine]) -> None:
        rec = self._recorder
        for line in lines:
            rec.add(record_from_line(line))

    def result(self) -> RunAggregates:
        return self._recorder.result()


@dataclass(frozen=True)
class JudgedWindow:
    """The judged window (None: the whole run is judged), the generator's steady-state health, the
    judging settings used (run.json ``config.judging``) and a note when the asked-for window could not
    be used."""

    window: Window | None
    health: dict[str, Any]
    config: dict[str, Any]
    note: str | None = None

    def contains(self, line: RecordLine) -> bool:
        """Whether ``line`` is judged: scheduled inside the window (every line without one)."""
        w = self.window
        return w is None or w.start <= line.t < w.end


class JudgingScan:
    """Pass one over the record log: per request its scheduled time, send lag, completion time, output
    tokens and whether it meets the per-request SLO (goodput), in typed arrays.

    ``warmup``: the profile's (or --warmup's) seconds, ``"auto"``, or None for the default
    (``default_warmup_s`` of the schedule); ``cooldown`` the same without a default. ``ramp_end``: the
    epoch by which a closed loop's streams had all started (locust/ramp.py): whatever the warm-up, the
    window and the generator's steady state begin no earlier."""

    def __init__(
        self,
        warmup: float | str | None,
        cooldown: float | str,
        slos: Sequence[AnySlo],
        per_scenario: bool,
        ramp_end: float | None = None,
    ) -> None:
        self.warmup, self.cooldown, self.ramp_end = warmup, cooldown, ramp_end
        rule = RequestSlo.from_slos(slos)
        self.rule = rule if rule.ttft_ms is not None or rule.tpot_ms is not None else None
        self.per_scenario = per_scenario
        self._t = array("d")  # scheduled epoch
        self._lag = array("q")  # max(0, sent_us), _NO_SEND without a send
        self._done = array("d")  # completion epoch: t + e2e (t without one)
        self._tokens = array("q")  # counted output tokens (server usage, else the client's)
        self._flags = array("b")
        self._scenario = array("i")  # index into _scenarios (goodput per scenario)
        self._scenarios: dict[str, int] = {}

    @property
    def count(self) -> int:
        return len(self._t)

    def add(self, lines: Iterable[RecordLine]) -> None:
        rule, names = self.rule, self._scenarios
        for r in lines:
            t, e2e = r.t, r.e2e_us
            self._t.append(t)
            self._lag.append(_NO_SEND if r.sent_us is None else max(0, r.sent_us))
            self._done.append(t + (e2e or 0) / 1e6)
            self._tokens.append(line_output_tokens(r))
            flags = 0
            if r.outcome != "cancelled":
                flags |= _NOT_CANCELLED
                if rule is not None and rule.is_good(r):
                    flags |= _GOOD
            if r.outcome == "ok" and e2e is not None:
                flags |= _OK_DONE
            self._flags.append(flags)
            self._scenario.append(names.setdefault(r.scenario, len(names)))

    # ---- the window ---------------------------------------------------------------------------
    def window(self) -> JudgedWindow:
        """The judged window and the generator's steady-state health.

        The window comes from the warm-up (``default_warmup_s`` of the schedule when None) and the
        cool-down; when they leave nothing, or no request was scheduled inside it, the whole run is
        judged and ``note`` says why. The generator's health is judged over its steady state whatever
        the warm-up: requests scheduled in the default warm-up (or the window's, when longer) are left
        out of the schedule-lag p99."""
        ts = self._t
        span = max(ts) - min(ts) if ts else 0.0
        ramp_s = max(0.0, self.ramp_end - min(ts)) if ts and self.ramp_end is not None else 0.0
        default = self.warmup is None
        w: float | str = default_warmup_s(span) if self.warmup is None else self.warmup
        cooldown = self.cooldown
        config: dict[str, Any] = {
            "warmup_s": w,
            "warmup_source": "default" if default else "set",
            "cooldown_s": cooldown,
        }
        window: Window | None = None
        note: str | None = None
        if ts and (w or cooldown or ramp_s):
            try:
                window = self._choose(w, cooldown, ramp_s)
            except ValueError as e:
                note = f"judged window: {e}; the whole run is judged"
            else:
                if not any(window.start <= t < window.end for t in ts):
                    note = f"judged window: no request was scheduled in [{window.start:.3f}, {window.end:.3f}); the whole run is judged"
                    window = None
        startup = max(default_warmup_s(span), window.warmup_s if window is not None else 0.0, ramp_s)
        health = self._health(startup)
        config["generator_health_startup_s"] = health["startup_s"]
        return JudgedWindow(window, health, config, note)

    def _choose(self, warmup: float | str, cooldown: float | str, ramp_s: float) -> Window:
        """The window from fixed warm-up/cool-down seconds, or ``"auto"`` (steady-state detection), never
        beginning before ``ramp_s`` (the start ramp); ValueError when they leave nothing of the schedule."""
        t0, t_last = min(self._t), max(self._t)
        automatic = warmup == "auto" or cooldown == "auto"
        first, last = steady_state(self._completion_rates(t0)) if automatic else (0, 0)
        w = max(float(first) if warmup == "auto" else float(warmup), ramp_s)
        c = max(0.0, t_last - (t0 + last)) if cooldown == "auto" else float(cooldown)
        start, end = t0 + w, t_last - c + 1e-6
        if end <= start:
            raise ValueError(
                f"warm-up {w:g} s and cool-down {c:g} s leave nothing of a {t_last - t0:.1f} s schedule to judge"
            )
        return Window(start, end, w, c, automatic)

    def _completion_rates(self, t0: float) -> list[float]:
        """Output tokens of ok requests per second of completion, from the run's start."""
        per_sec: dict[int, float] = defaultdict(float)
        for done, n, flags in zip(self._done, self._tokens, self._flags, strict=True):
            if flags & _OK_DONE:
                per_sec[int(done - t0)] += n
        n_secs = max(per_sec) + 1 if per_sec else 0
        return [per_sec.get(i, 0.0) for i in range(n_secs)]

    def _health(self, startup_s: float) -> dict[str, Any]:
        """The generator's schedule lag over its steady state: requests scheduled ``startup_s`` or more
        after the first one (the first requests of every connection pay its set-up; a run's start is not
        what the generator sustains). Falls back to every request when none is left after the start-up.

        Returns ``startup_s`` (the seconds left out), ``requests`` (lag samples judged),
        ``schedule_lag_p99_ms`` (HDR p99, like run.json's percentiles; None without samples) and
        ``whole_run_schedule_lag_p99_ms``."""

        def p99(values: list[int]) -> float | None:
            if not values:
                return None
            h = hdr.new_histogram(HIST_HIGHEST["schedule_lag"])
            hdr.record_many(h, values)
            return round((hdr.value_at(h, 99) or 0) / 1000.0, 3)

        t0 = min(self._t, default=0.0)
        every = [lag for lag in self._lag if lag != _NO_SEND]
        steady = [
            lag for t, lag in zip(self._t, self._lag, strict=True) if lag != _NO_SEND and t >= t0 + startup_s
        ]
        used = steady if steady else every
        return {
            "startup_s": round(startup_s, 3) if steady else 0.0,
            "requests": len(used),
            "schedule_lag_p99_ms": p99(used),
            "whole_run_schedule_lag_p99_ms": p99(every),
            **self._in_flight(t0 + startup_s),
        }

    def _in_flight(self, start: float) -> dict[str, Any]:
        """Requests in flight, time-averaged from ``start`` to the last scheduled request (``mean_in_flight``;
        the streams a closed loop actually held), and the share of the requests sent in that span that
        ended ok (``in_flight_ok_share``: fast failures back a stream off, which is the endpoint's doing).
        Empty when that span is shorter than MIN_IN_FLIGHT_SPAN_S."""
        end = max(self._t, default=start)
        if end - start < MIN_IN_FLIGHT_SPAN_S:
            return {}
        busy = 0.0
        sent_n = ok_n = 0
        for t, lag, done, flags in zip(self._t, self._lag, self._done, self._flags, strict=True):
            if lag == _NO_SEND:
                continue
            sent = t + lag / 1e6
            busy += max(0.0, min(max(done, sent), end) - max(sent, start))
            if start <= sent < end:
                sent_n += 1
                ok_n += bool(flags & _OK_DONE)
        return {
            "mean_in_flight": round(busy / (end - start), 1),
            "in_flight_ok_share": round(ok_n / sent_n, 4) if sent_n else None,
        }

    # ---- goodput ------------------------------------------------------------------------------
    def goodput(self, judged: JudgedWindow) -> dict[str, Any] | None:
        """SLO attainment and goodput (good requests/s, good output tokens/s) of the judged requests,
        overall, per second and per scenario. A request is good when it is ok and meets the per-request
        TTFT and TPOT limits taken from the SLOs (the highest percentile's limit for each); cancelled
        requests are not judged. None without a TTFT or TPOT SLO, or without a judged request."""
        rule = self.rule
        if rule is None:
            return None
        w = judged.window
        t, done, flags = self._t, self._done, self._flags
        sel = [
            i for i in range(len(t)) if flags[i] & _NOT_CANCELLED and (w is None or w.start <= t[i] < w.end)
        ]
        if not sel:
            return None
        start = min(t[i] for i in sel)
        end = max(done[i] for i in sel) + 1e-6

        def one(rows: list[int]) -> dict[str, Any]:
            if not end > start:
                raise ValueError(f"the window must have end > start (got {(start, end)})")
            n_judged = good = tokens = 0
            for i in rows:
                if not start <= done[i] < end:
                    continue
                n_judged += 1
                if flags[i] & _GOOD:
                    good += 1
                    tokens += self._tokens[i]
            d = end - start
            return {
                "judged": n_judged,
                "good": good,
                "attainment": None if not n_judged else round(good / n_judged, 6),
                "good_requests_per_s": round(good / d, 4),
                "good_output_tokens_per_s": round(tokens / d, 3),
            }

        out: dict[str, Any] = {"rule": {"ttft_ms": rule.ttft_ms, "tpot_ms": rule.tpot_ms}, **one(sel)}
        per_second: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for i in sel:
            sec = int(done[i] - start)
            per_second[sec][0] += 1
            per_second[sec][1] += bool(flags[i] & _GOOD)
        secs = sorted(per_second)
        out["series"] = {
            "t": secs,
            "judged": [per_second[s][0] for s in secs],
            "good": [per_second[s][1] for s in secs],
        }
        if self.per_scenario:
            names = {code: name for name, code in self._scenarios.items()}
            by: dict[str, list[int]] = defaultdict(list)
            for i in sel:
                by[names[self._scenario[i]]].append(i)
            out["scenarios"] = {name: one(rows) for name, rows in sorted(by.items())}
        return out
