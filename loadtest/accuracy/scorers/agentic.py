"""The MLPerf Endpoints agentic inline accuracy check: each answer's bash commands or intent against the
recorded assistant turn that followed its client row (docs/sources.md §20)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.contracts.record_line import AgenticTurn

# A conversation whose id is sim_<n> is a workflow one (scored by intent code), any other a coding one.
_WORKFLOW_ID = re.compile(r"^sim_\d+$")
_INTENT = re.compile(r"\bintent:\s*(I\d{3})\b", re.IGNORECASE)
_BARE_INTENT = re.compile(r"\bI(\d{3})\b")
_SEPARATORS = re.compile(r"\|\||\||&&|;|\n")
_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PY_VERSION = re.compile(r"\.\d+(\.\d+)?$")
_WRAPPERS = frozenset({"env", "time", "nice", "sudo", "exec", "command"})
# The executables the reference scores, each under its family's name; any other command is not an action.
_FAMILIES: dict[str, tuple[str, ...]] = {
    "python": ("python", "python2", "python3", "py"),
    "pip": ("pip", "pip3"),
    "sphinx": ("sphinx-build", "sphinx-quickstart"),
    "cat": ("cat", "less", "more"),
    "grep": ("grep", "egrep", "fgrep", "rg", "ag"),
    "awk": ("awk", "gawk"),
    "find": ("find", "locate"),
    "source": ("source", "."),
    "curl": ("curl", "wget"),
    "apt": ("apt-get", "apt"),
}
_SAME = (
    "pytest pylint cython make conda head tail wc diff sed tr sort uniq cut ls xargs cp mv rm mkdir touch "
    "tee which alias unset export git true false timeout date yum"
)
ACTIONS: dict[str, str] = {
    **{name: name for name in _SAME.split()},
    **{alias: family for family, aliases in _FAMILIES.items() for alias in aliases},
}


def domain_of(conversation: str) -> str:
    """``workflow`` for a ``sim_<n>`` conversation, else ``coding``."""
    return "workflow" if _WORKFLOW_ID.match(conversation) else "coding"


def bash_actions(calls: Iterable[Sequence[str]]) -> list[str]:
    """The executables of the ``bash`` tool calls' commands (``command`` or ``cmd``), each stage of a
    pipeline or list on its own, after quoted text, environment assignments, wrappers (env, sudo, time
    ...) and paths are dropped, python3.11 counted as python, aliases as their family (rg as grep)."""
    actions: list[str] = []
    for name, arguments in calls:
        if name != "bash":
            continue
        try:
            args = json.loads(arguments)
        except ValueError:
            continue
        command = (args.get("command") or args.get("cmd")) if isinstance(args, dict) else None
        if not isinstance(command, str):
            continue
        for stage in _SEPARATORS.split(_QUOTED.sub(" ", command)):
            tokens = stage.split()
            while tokens and (_ASSIGNMENT.match(tokens[0]) or tokens[0] in _WRAPPERS):
                tokens = tokens[1:]
            if not tokens:
                continue
            exe = _PY_VERSION.sub("", tokens[0].rsplit("/", 1)[-1].lower())
            if exe in ACTIONS:
                actions.append(ACTIONS[exe])
    return actions


def answer_intent(reasoning: str, content: str) -> str | None:
    """The answer's intent code: the first ``intent: I123`` of its reasoning, else of its text; else the
    last bare ``I123`` of its reasoning, else of its text."""
    for text in (reasoning, content):
        m = _INTENT.search(text)
        if m is not None:
            return m.group(1).upper()
    for text in (reasoning, content):
        bare = _BARE_INTENT.findall(text)
        if bare:
            return f"I{bare[-1]}"
    return None


def turn_score(turn: AgenticTurn, answered: bool) -> float | None:
    """One issued call's score (None: its recorded answer holds nothing to score): a workflow call 1 when
    the answer's intent is one of the recorded codes; a coding call the multiset intersection over union
    of the answer's and the recorded answer's bash actions. A call without an ok answer scores 0."""
    if domain_of(turn.conversation) == "workflow":
        codes = {c.upper() for c in turn.expected_intents}
        if not codes:
            return None
        return float(answered and answer_intent(turn.reasoning, turn.content) in codes)
    want = Counter(bash_actions(turn.expected_calls))
    if not want:
        return None
    got = Counter(bash_actions(turn.calls)) if answered else Counter()
    return sum((want & got).values()) / sum((want | got).values())


@dataclass
class AgenticScore:
    """The running tally over a run's recorded agent calls: the reference's overall score is the mean of
    every scored call's, over both domains."""

    issued: int = 0  # calls with an expected answer
    answered: int = 0  # of those, with an ok answer
    excluded: int = 0  # their recorded answer holds nothing to score
    totals: dict[str, float] = field(default_factory=lambda: {"coding": 0.0, "workflow": 0.0})
    counts: dict[str, int] = field(default_factory=lambda: {"coding": 0, "workflow": 0})

    def add(self, turn: AgenticTurn, ok: bool) -> None:
        self.issued += 1
        self.answered += ok
        score = turn_score(turn, ok)
        if score is None:
            self.excluded += 1
            return
        domain = domain_of(turn.conversation)
        self.totals[domain] += score
        self.counts[domain] += 1

    @property
    def scored(self) -> int:
        return sum(self.counts.values())

    @property
    def score(self) -> float | None:
        n = self.scored
        return round(sum(self.totals.values()) / n, 4) if n else None

    def section(self) -> dict[str, Any]:
        """run.json ``agentic_accuracy`` (without the target)."""
        return {
            "scorer": "agentic_inference_inline",
            "score": self.score,
            "calls": {
                "issued": self.issued,
                "answered": self.answered,
                "scored": self.scored,
                "excluded": self.excluded,
            },
            "domains": {
                d: {"score": round(self.totals[d] / n, 4), "scored": n} for d, n in self.counts.items() if n
            },
        }


class AgenticInlineScorer:
    """The check as a registered scorer: each answer an assistant message's JSON (``content``,
    ``reasoning_content``, ``tool_calls``; empty: no answer), each reference the recorded assistant
    row's JSON (an MLPerf agentic row: ``conversation_id``, ``turn``, ``tool_calls``, ``intent_codes``)."""

    name = "agentic_inference_inline"

    def score(self, answers: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        tally = AgenticScore()
        for answer, reference in zip(answers, references, strict=True):
            row = json.loads(reference)
            turn = AgenticTurn.expecting(str(row.get("conversation_id", "")), int(row.get("turn") or 0), row)
            msg = json.loads(answer) if answer.strip() else None
            if isinstance(msg, dict):
                turn.calls = AgenticTurn.expecting("", 0, msg).expected_calls  # [name, arguments] each
                turn.reasoning = str(msg.get("reasoning_content") or "")
                turn.content = str(msg.get("content") or "")
            tally.add(turn, isinstance(msg, dict))
        out = {"scored": float(tally.scored), "excluded": float(tally.excluded)}
        if tally.score is not None:
            out["agentic_score"] = tally.score
        return out
