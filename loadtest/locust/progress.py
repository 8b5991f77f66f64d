"""Live progress on the console while the load runs: a line every few seconds, and the drain announced."""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Callable
from typing import TextIO

import gevent

from loadtest.fmt import fmt_ms, fmt_num
from loadtest.metrics import hdr
from loadtest.metrics.recorder import Aggregate

DEFAULT_PROGRESS_S = 5.0  # a 60 s run shows 11 lines
WIDTH = 80  # a terminal's columns


def progress_line(
    agg: Aggregate, elapsed_s: float, duration_s: float, in_flight: int | None, rate: tuple[float, float]
) -> str:
    """``progress 12 s / 30 s: 148 requests (146 ok, 2 failed), 12.1 req/s, 1,840 output tok/s, TTFT
    p50 210 ms p99 480 ms, 16 in flight``, wrapped to 80 columns (the rest indented two spaces);
    ``rate``: requests/s and output tokens/s since the last line."""
    ok = agg.outcomes.get("ok", 0)
    done = agg.completed - agg.outcomes.get("cancelled", 0)
    flight = f", {in_flight} in flight" if in_flight is not None else ""
    if not done:  # the figures count finished requests: long answers have none yet
        text = f"progress {elapsed_s:.0f} s / {duration_s:.0f} s: no request finished yet{flight}"
        return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_long_words=False))
    p50, p99 = hdr.fast_percentiles(agg.hists["ttft"], (50, 99))
    ttft = (
        f"TTFT p50 {fmt_ms(p50 / 1000)} ms p99 {fmt_ms(p99 / 1000)} ms"
        if p50 is not None and p99 is not None
        else "no first token yet"
    )
    text = (
        f"progress {elapsed_s:.0f} s / {duration_s:.0f} s: {done} requests ({ok} ok, {done - ok} failed), "
        f"{rate[0]:.1f} req/s, {fmt_num(rate[1], 0)} output tok/s, {ttft}{flight}"
    )
    return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_long_words=False))


class ProgressPrinter:
    """Prints ``progress_line`` every ``interval_s`` (0: never) from ``aggregate()`` (the run's merged
    figures so far) and ``in_flight()`` (None where unknown), until ``stop``."""

    def __init__(
        self,
        aggregate: Callable[[], Aggregate],
        in_flight: Callable[[], int | None],
        duration_s: float,
        interval_s: float,
        out: TextIO | None = None,
    ) -> None:
        self.aggregate, self.in_flight = aggregate, in_flight
        self.duration_s, self.interval_s = duration_s, interval_s
        self.out = out or sys.stderr
        self._t0 = time.monotonic()
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        self._t0 = time.monotonic()
        if self.interval_s > 0:
            self._greenlet = gevent.spawn(self._run)

    def _run(self) -> None:
        last_t, last_done, last_tokens = self._t0, 0, 0
        while True:
            gevent.sleep(self.interval_s)
            agg, now = self.aggregate(), time.monotonic()
            done, tokens = agg.completed, int(agg.totals.get("output_tokens", 0))
            span = max(now - last_t, 1e-9)
            rate = ((done - last_done) / span, (tokens - last_tokens) / span)
            self._print(progress_line(agg, now - self._t0, self.duration_s, self.in_flight(), rate))
            last_t, last_done, last_tokens = now, done, tokens

    def draining(self, in_flight: int | None, timeout_s: float) -> None:
        """The load stopped: say how many requests are still awaited, and for how long at most."""
        if self.interval_s <= 0:
            return
        self.stop()
        waiting = (
            f"{in_flight} request{'s' if in_flight != 1 else ''}" if in_flight is not None else "requests"
        )
        self._print(
            f"load stopped after {time.monotonic() - self._t0:.0f} s: waiting up to {timeout_s:g} s "
            f"for {waiting} in flight"
        )

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)
