"""The run report's answer-quality section: the quality gate's pass rates and a few captured samples."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from loadtest.contracts.capture_line import CaptureLine
from loadtest.contracts.run_document import Quality, RunDocument
from loadtest.fmt import fmt_pct
from loadtest.results.capture import capture_files, read_capture

SAMPLES = 5  # captured requests the report shows (those that failed a check first)
EXCERPT = 240  # characters of a request or answer the report shows


def pick_samples(lines: Iterable[CaptureLine], n: int = SAMPLES) -> list[CaptureLine]:
    """Up to ``n`` captured requests: those that failed an answer check or the request first."""
    bad: list[CaptureLine] = []
    good: list[CaptureLine] = []
    for line in islice(lines, 10_000):
        (bad if line.quality_failed or line.outcome != "ok" else good).append(line)
        if len(bad) >= n:
            break
    return (bad + good)[:n]


def load_samples(run_dir: Path, n: int = SAMPLES) -> list[CaptureLine]:
    """The samples of the run folder's capture files (none without capture)."""
    return pick_samples(read_capture(capture_files(run_dir)), n)


def excerpt(text: str, n: int = EXCERPT) -> str:
    return text if len(text) <= n else text[:n] + "…"


def _gate_table(q: Quality) -> str:
    rows = [
        f"<tr><td>{escape(name)}</td><td>{c.failed:,}</td><td>{escape(fmt_pct(c.pass_rate, '-'))}</td>"
        f"<td>{'gate' if name in q.gate else 'reported'}</td><td>{escape(c.first_failed or '-')}</td></tr>"
        for name, c in q.checks.items()
    ]
    head = "<tr><th>check</th><th>failed</th><th>pass rate</th><th>counts in</th><th>first failed</th></tr>"
    return f'<table class="quality"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _samples_table(samples: Sequence[CaptureLine]) -> str:
    rows = []
    for s in samples:
        outcome = s.outcome + (f" · failed {', '.join(s.quality_failed)}" if s.quality_failed else "")
        answer = s.answer or s.tool_calls or s.error or ""
        rows.append(
            f"<tr><td>{escape(s.id)}</td><td><code>{escape(excerpt(s.request))}</code></td>"
            f"<td><code>{escape(excerpt(answer))}</code></td><td>{escape(outcome)}</td></tr>"
        )
    head = "<tr><th>request</th><th>body sent</th><th>answer</th><th>outcome</th></tr>"
    return f'<table class="samples"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def quality_sections(run: RunDocument, samples: Sequence[CaptureLine]) -> list[dict[str, Any]]:
    """The ``{id, title, html}`` sections: the quality gate (with a quality section) and the samples."""
    out: list[dict[str, Any]] = []
    q = run.quality
    if q is not None:
        rate = fmt_pct(q.pass_rate, "-")
        source = "the quality_min SLO" if q.min_source == "slo" else "the default floor"
        text = (
            f"<p>{escape(rate)} of {q.checked:,} ok answers passed every gate check "
            f"({escape(', '.join(q.gate))}); the gate needs ≥ {q.min * 100:g} % ({source}).</p>"
        )
        out.append({"id": "quality", "title": "Answer quality", "html": Markup(text + _gate_table(q))})
    if samples:
        note = (
            f'<p class="note">{len(samples)} of the captured requests (capture*.jsonl in the run folder).</p>'
        )
        out.append(
            {"id": "samples", "title": "Captured samples", "html": Markup(note + _samples_table(samples))}
        )
    return out
