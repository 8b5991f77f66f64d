"""capture*.jsonl: a bounded sample of requests with the body sent and the answer received (secrets redacted)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec

from loadtest.client.record import RequestRecord
from loadtest.client.secrets import redact_echoes
from loadtest.contracts.capture_line import CAPTURE_DECODER, CAPTURE_ENCODER, CaptureLine
from loadtest.profile.quality import CaptureSpec
from loadtest.results.durable import AppendFile, FailureHandler

CAPTURE_FILE = "capture.jsonl"  # one process; worker i of a --processes run writes capture-w<i>.jsonl


def worker_capture_file(index: int) -> str:
    return f"capture-w{index}.jsonl"


def share(total: int, index: int, n_workers: int) -> int:
    """Worker ``index``'s part of ``total`` entries (the parts add up to ``total``)."""
    n = max(1, n_workers)
    return total // n + (1 if index < total % n else 0)


def _cut(text: str, limit: int, name: str, cut: list[str]) -> str:
    if len(text) <= limit:
        return text
    cut.append(name)
    return text[:limit]


def capture_line(rec: RequestRecord, max_chars: int, secrets: tuple[str, ...] = ()) -> CaptureLine:
    """The capture line of a finished record: every text redacted first, then cut to ``max_chars``."""
    cut: list[str] = []
    request = redact_echoes(rec.body_sent.decode("utf-8", "replace"), secrets)
    answer = redact_echoes(rec.answer_text, secrets)
    tools = redact_echoes(rec.tool_calls_text, secrets)
    return CaptureLine(
        id=rec.request_id,
        wire_id=rec.wire_id,
        scenario=rec.scenario,
        api=rec.api,
        outcome=rec.outcome,
        status=rec.http_status,
        finish_reason=rec.finish_reason,
        error=redact_echoes(rec.error, secrets) or None,
        quality_failed=list(rec.quality_failed or ()),
        request=_cut(request, max_chars, "request", cut),
        request_chars=len(request),
        answer=_cut(answer, max_chars, "answer", cut),
        answer_chars=len(answer),
        tool_calls=_cut(tools, max_chars, "tool_calls", cut),
        reasoning=_cut(redact_echoes(rec.reasoning_text, secrets), max_chars, "reasoning", cut),
        cut=cut,
    )


class CaptureLog:
    """This process's capture file: the first records it finishes (``first``), or a seeded sample of them
    (``sample``), up to its share of the run's limit; each line reaches the OS when its request ends."""

    def __init__(
        self,
        path: Path,
        spec: CaptureSpec,
        index: int,
        n_workers: int,
        seed: int,
        secrets: tuple[str, ...] = (),
        on_failure: FailureHandler | None = None,
    ) -> None:
        """``on_failure``: told once when a line cannot be written (a full disk); nothing more is written."""
        self.path, self.spec, self.seed, self.secrets = path, spec, seed, secrets
        self.left = share(spec.limit, index, n_workers)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = AppendFile(path, on_failure, truncate=True)

    def chosen(self, rec: RequestRecord) -> bool:
        """Whether ``rec`` is captured: the first ones, or those whose seeded hash falls in the sample."""
        if self.left <= 0:
            return False
        rate = self.spec.sample
        if rate is None:
            return True
        return zlib.crc32(f"{self.seed}:{rec.request_id}".encode()) < rate * 2**32

    def offer(self, rec: RequestRecord) -> None:
        if self._file.failure is not None or not self.chosen(rec):
            return
        line = capture_line(rec, self.spec.max_chars, self.secrets)
        if self._file.append(CAPTURE_ENCODER.encode(line) + b"\n"):
            self.left -= 1

    def close(self) -> None:
        self._file.close()


def capture_files(run_dir: Path) -> list[Path]:
    """The run folder's capture files (one, or one per worker)."""
    return sorted(run_dir.glob("capture*.jsonl"))


def read_capture(paths: list[Path]) -> Iterator[CaptureLine]:
    """Every complete capture line of the given files (a line cut by a crash is skipped)."""
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break
                try:
                    yield CAPTURE_DECODER.decode(line)
                except msgspec.DecodeError:
                    continue
