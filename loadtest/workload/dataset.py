"""A scenario's dataset as requests: token filters, seeded sampling, output lengths, multi-turn sessions."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.profile.dataset import DatasetSpec, OutputFrom
from loadtest.profile.schema import Scenario
from loadtest.tokens.tokenizer import Tokenizer
from loadtest.workload.dataset_read import DatasetError, Source, Turn, read_source
from loadtest.workload.lengths import sample_length, sample_seconds
from loadtest.workload.sessions import SessionCall

__all__ = [
    "Dataset",
    "DatasetError",
    "DatasetRequest",
    "DatasetSession",
    "conversation_index",
    "load_dataset",
    "pass_units",
]


@dataclass(frozen=True, slots=True)
class DatasetRequest:
    """One request of a dataset: the messages sent (history, then the prompt) and its lengths."""

    messages: tuple[dict[str, str], ...]
    prompt: str
    prompt_tokens: int  # the tokenizer's count of what is sent (chat template included for chat)
    output_tokens: int
    reference: str | None


@dataclass(frozen=True, slots=True)
class Dataset:
    """The conversations a run draws from (each one or more requests) and the file's sha256."""

    conversations: list[list[DatasetRequest]]
    sha256: str
    rows: int  # conversations (rows) read, before the filters


_cache: dict[tuple[Any, ...], Dataset] = {}


def conversation_index(spec: DatasetSpec, seed: int, scenario: str, index: int, size: int) -> int:
    """The conversation unit ``index`` sends: in order, cycling, or (``sampling: with_replacement``) a
    draw with replacement seeded by the run's seed and the unit's index (docs/datasets.md)."""
    if spec.sampling == "with_replacement":
        return random.Random(f"{seed}:draw:{scenario}:{index}").randrange(size)
    return index % size


def pass_units(scenarios: list[Scenario], datasets: dict[str, Dataset]) -> int | None:
    """Units a run of whole dataset passes issues (``dataset.passes`` × the conversations), or None.
    Raises ValueError when passes is set on a profile with more than one scenario."""
    with_passes = [(i, s) for i, s in enumerate(scenarios) if s.dataset is not None and s.dataset.passes]
    if not with_passes:
        return None
    i, sc = with_passes[0]
    if len(scenarios) > 1:
        raise ValueError(
            f"scenarios[{i}].dataset.passes: whole dataset passes need a profile with one scenario; "
            "remove passes or the other scenarios"
        )
    assert sc.dataset is not None and sc.dataset.passes is not None
    return sc.dataset.passes * len(datasets[sc.name].conversations)


def load_dataset(sc: Scenario, index: int, tokenizer: Tokenizer, api: str, seed: int) -> Dataset:
    """Scenario ``index``'s dataset, read once per process (by file state, spec, tokenizer, api, seed)."""
    spec = sc.dataset
    assert spec is not None
    path = Path(spec.path)
    try:
        st = path.stat()
        state: tuple[Any, ...] = (st.st_mtime_ns, st.st_size)
    except OSError:
        state = ()
    key = (str(path), state, spec.model_dump_json(), sc.name, tokenizer.name, api, seed)
    if key not in _cache:
        _cache[key] = _build(spec, sc.name, f"scenarios[{index}].dataset", tokenizer, api, seed)
    return _cache[key]


def _build(spec: DatasetSpec, name: str, where: str, tok: Tokenizer, api: str, seed: int) -> Dataset:
    """The conversations in file order, or with ``sample`` a seeded draw among those the filters keep
    (counted in the draw's order until enough are kept: a large file is not tokenized in full)."""
    source = read_source(Path(spec.path), spec.format, dict(spec.columns), where)
    mode = _output_mode(spec, source, where)
    order = list(range(len(source.conversations)))
    if spec.sample is not None:
        random.Random(f"{seed}:dataset:{name}:sample").shuffle(order)
    convs: list[list[DatasetRequest]] = []
    for c in order:
        rng = random.Random(f"{seed}:dataset:{name}:{c}")
        reqs = _requests(source.conversations[c], spec, mode, tok, api, rng, where)
        if reqs:
            convs.append(reqs)
        if spec.sample is not None and len(convs) >= spec.sample:
            break
    if not convs:
        raise DatasetError(_empty_message(spec, len(source.conversations), mode, where))
    return Dataset(convs, source.sha256, len(source.conversations))


def _output_mode(spec: DatasetSpec, source: Source, where: str) -> Any:
    """``dataset``, ``reference`` or a length spec: what sets each request's max_tokens."""
    rule = spec.output_tokens
    mode: Any = rule.dist if isinstance(rule, OutputFrom) else rule
    if mode is None:
        mode = "dataset" if source.has_output_column else "reference"
    if mode == "dataset" and not source.has_output_column:
        raise DatasetError(
            f"{where}.output_tokens: {spec.path} has no output_tokens column: map one with columns, or "
            "give output_tokens: reference or a length, e.g. {dist: fixed, value: 256}"
        )
    return mode


def _requests(
    turns: list[Turn], spec: DatasetSpec, mode: Any, tok: Tokenizer, api: str, rng: random.Random, where: str
) -> list[DatasetRequest]:
    """A conversation's requests: turns without an output length dropped; kept when its first request
    is within the token filters, cut before the first later one above ``max_input_tokens``."""
    out: list[DatasetRequest] = []
    for t in turns:
        n_out = _output_tokens(t, mode, tok, rng, spec, where)
        if n_out is None:
            continue
        if api != "chat" and t.history:
            raise DatasetError(
                f"{where}.path: {spec.path}: row {t.row} is a conversation with history: the completions "
                "api sends one prompt (use api: chat)"
            )
        messages = (*t.history, {"role": "user", "content": t.prompt})
        n_in = tok.count_chat(messages) if api == "chat" else tok.count(t.prompt)
        lo, hi = spec.min_input_tokens or 0, spec.max_input_tokens
        if (not out and n_in < lo) or (hi is not None and n_in > hi):
            break
        out.append(DatasetRequest(messages, t.prompt, n_in, n_out, t.reference))
    return out


def _output_tokens(
    t: Turn, mode: Any, tok: Tokenizer, rng: random.Random, spec: DatasetSpec, where: str
) -> int | None:
    if mode == "dataset":
        if t.output_tokens is None:
            raise DatasetError(
                f"{where}.columns: {spec.path}: row {t.row} has no output_tokens value: give every row one, "
                "or set output_tokens: reference or a length"
            )
        return t.output_tokens
    if mode == "reference":
        return max(1, tok.count(t.reference)) if t.reference else None
    return max(1, sample_length(mode, rng))


def _empty_message(spec: DatasetSpec, rows: int, mode: Any, where: str) -> str:
    if spec.min_input_tokens is not None or spec.max_input_tokens is not None:
        return (
            f"{where}.max_input_tokens: {spec.path}: none of its {rows} conversations is within "
            f"min_input_tokens {spec.min_input_tokens} / max_input_tokens {spec.max_input_tokens}: widen them"
        )
    if mode == "reference":
        return (
            f"{where}.output_tokens: {spec.path}: no prompt has a reference answer to take the output "
            "length from: give output_tokens a length, e.g. {dist: fixed, value: 256}"
        )
    return f"{where}.path: {spec.path}: the dataset has no prompts"


class DatasetSession:
    """A multi-turn conversation replayed as a session: each user turn carries the dataset's earlier turns.

    The history is the dataset's (its answers, not the server's), so every request's text is the
    dataset's own; a failed call ends the session, as in a synthetic multi-turn chat.
    """

    def __init__(
        self, requests: list[DatasetRequest], spec: DatasetSpec, seed: int, key: str, reasoning: bool
    ) -> None:
        self._requests = requests
        rng = random.Random(f"{seed}:dataset-think:{key}")
        think = spec.think_time_s
        self._think = [0.0] + [sample_seconds(think, rng) if think is not None else 0.0 for _ in requests[1:]]
        self._reasoning = reasoning
        self.turn = 0
        self.done = False
        self._awaiting = False

    def next_request(self) -> SessionCall | None:
        """The next turn's call, or None when the conversation is over."""
        if self.done or self.turn >= len(self._requests):
            return None
        if self._awaiting:
            raise RuntimeError("record_answer() the previous call first")
        r = self._requests[self.turn]
        self._awaiting = True
        return SessionCall(
            [dict(m) for m in r.messages],
            None,
            r.output_tokens,
            self._reasoning,
            self._think[self.turn],
            r.prompt_tokens,
            self.turn,
            0,
            reference=r.reference,
            last=self.turn == len(self._requests) - 1,
        )

    def record_answer(self, text: str | None) -> None:
        """The server's answer (not carried: the history is the dataset's); None ends the session."""
        if not self._awaiting:
            raise RuntimeError("no call is waiting for an answer")
        self._awaiting = False
        self.turn += 1
        self.done = text is None or self.turn >= len(self._requests)
