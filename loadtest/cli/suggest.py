"""An argparse parser that answers a mistyped subcommand, option or choice with the closest matches."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import Any, NoReturn

_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)")
_UNRECOGNIZED = "unrecognized arguments: "
# Options share their "--" and many letters: a stricter ratio than for words keeps the guesses useful.
OPTION_CUTOFF = 0.75


def close_matches(word: str, candidates: Sequence[str], cutoff: float = 0.6) -> list[str]:
    """The (at most two) candidates closest to ``word`` (difflib ratio ≥ ``cutoff``), best first."""
    return difflib.get_close_matches(word, list(candidates), n=2, cutoff=cutoff)


def did_you_mean(word: str, candidates: Sequence[str], cutoff: float = 0.6) -> str:
    """``did you mean --duration?`` for the closest candidates, or nothing."""
    found = close_matches(word, candidates, cutoff)
    return f"did you mean {' or '.join(found)}?" if found else ""


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors suggest close matches; an option unknown to a subcommand is
    reported with that subcommand's usage, not the top level's."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._innermost(parsed).error(_UNRECOGNIZED + " ".join(extras))
        return parsed

    def _innermost(self, parsed: argparse.Namespace) -> SuggestingParser:
        """The subcommand's parser that parsed the last subcommand named in ``parsed``."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, SuggestingParser):
                    return chosen._innermost(parsed)
        return self

    def error(self, message: str) -> NoReturn:
        super().error(message + self._hint(message))

    def _hint(self, message: str) -> str:
        m = _CHOICE.search(message)
        if m:
            hint = did_you_mean(m.group("given"), re.findall(r"'([^']*)'", m.group("choices")))
            return f": {hint}" if hint else ""
        if message.startswith(_UNRECOGNIZED):
            options = [
                o
                for o, action in self._option_string_actions.items()
                if o.startswith("--") and action.help != argparse.SUPPRESS
            ]
            hints = []
            for word in message[len(_UNRECOGNIZED) :].split():
                name = word.split("=", 1)[0]
                if name.startswith("--") and (hint := did_you_mean(name, options, OPTION_CUTOFF)):
                    hints.append(f"{name}: {hint}")
            return f" ({'; '.join(hints)})" if hints else ""
        return ""
