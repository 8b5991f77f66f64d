"""Whether the compared inputs sent the same requests: workload fingerprints and resolved profiles."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadtest.compare.inputs import Side

# Resolved-profile keys that do not change which requests are sent: labels, how long the run lasted,
# the embedded engine's preset (the server under test, which the fingerprint also hashes), and how the
# run was judged (compare takes each input's judged window and one SLO yardstick for all).
IGNORED_KEYS = ("name", "description", "source", "duration_s", "engine", "judging", "slos")


@dataclass
class WorkloadCheck:
    """The verdict on workload identity, with the differences in words."""

    same: bool = True
    tokenizers_differ: bool = False
    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mismatched: list[int] = field(default_factory=list)  # indices of the sides that differ from the baseline
    load_differences: list[str] = field(default_factory=list)  # same requests, another load level

    def to_dict(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "tokenizers_differ": self.tokenizers_differ,
            "differences": self.differences,
            "notes": self.notes,
            "load_differences": self.load_differences,
        }

    def refusal(self, flag: str) -> str:
        """The one sentence that refuses a comparison of different workloads: who differs, in what, and
        what to do."""
        first = self.differences[0]
        more = len(self.differences) - 1
        others = f" (and {more} other input{'s' if more > 1 else ''})" if more else ""
        return (
            f"{first}{others}: they did not send the same requests, so their figures would mix the "
            f"endpoints with the traffic; compare runs of the same profile and seed, or pass {flag}"
        )


def fingerprint(side: Side) -> str | None:
    """The sweep's fingerprint for a sweep (when it has one), else the run's."""
    if side.sweep is not None and side.sweep.doc.fingerprint:
        return side.sweep.doc.fingerprint
    return side.run.workload.fingerprint


def tokenizer(side: Side) -> str:
    return side.run.config.tokenizer or "unknown"


def _comparable(side: Side, drop: tuple[str, ...]) -> dict[str, Any]:
    """The resolved profile (a JSON object in run.json) without ``drop``, with the run's seed."""
    cfg = side.run.config
    out = {k: v for k, v in cfg.profile_resolved.items() if k not in drop}
    out["seed"] = cfg.seed
    return out


MAX_SHOWN_TEXT = 40  # characters of a text value shown whole in a difference
MAX_SHOWN_DIFFERENCES = 6  # settings named in one difference (the rest counted)


def _show(v: Any) -> str:
    """A value in words for one line: numbers and short texts as they are, the rest by their size."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return f"{v:g}"
    if isinstance(v, str):
        return v if len(v) <= MAX_SHOWN_TEXT and "\n" not in v else f"a text of {len(v):,} characters"
    if isinstance(v, list):
        if len(v) <= 4 and all(isinstance(x, str | int | float) and not isinstance(x, bool) for x in v):
            return "[" + ", ".join(_show(x) for x in v) + "]"
        return f"a list of {len(v)} item{'s' if len(v) != 1 else ''}"
    if isinstance(v, dict):
        return f"a section of {len(v)} key{'s' if len(v) != 1 else ''}"
    return type(v).__name__


def _diff_keys(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Each differing leaf of two JSON objects in words, by path: ``load.concurrency 4 vs 16``, ``seed 1
    vs 2``, ``scenarios[0].input_tokens.value 64 vs 128`` (a section only one side has reads as ``a
    section of N keys vs none``; values that read alike as ``differs (… on each side)``)."""
    out = []
    for k in _diff_keys(a, b):
        out += _leaf_differences(f"{prefix}{k}", a.get(k), b.get(k))
    return out


def _leaf_differences(path: str, va: Any, vb: Any) -> list[str]:
    if isinstance(va, dict) and isinstance(vb, dict):
        return differences(va, vb, f"{path}.")
    if isinstance(va, list) and isinstance(vb, list) and len(va) == len(vb):
        return [
            d
            for i, (x, y) in enumerate(zip(va, vb, strict=True))
            if x != y
            for d in _leaf_differences(f"{path}[{i}]", x, y)
        ]
    sa, sb = _show(va), _show(vb)
    return [f"{path} differs ({sa} on each side)" if sa == sb else f"{path} {sa} vs {sb}"]


def _load_words(a: dict[str, Any], b: dict[str, Any]) -> str:
    """How two resolved profiles' ``load`` sections differ: ``concurrency 4 vs 16``."""
    la, lb = a.get("load"), b.get("load")
    if isinstance(la, dict) and isinstance(lb, dict):
        return ", ".join(differences(la, lb))
    return f"{_show(la)} vs {_show(lb)}"


def check_workloads(sides: list[Side], baseline: int = 0) -> WorkloadCheck:
    """Compare every side with the baseline: equal fingerprints, or equal resolved profiles and seeds.

    Profiles are compared without ``IGNORED_KEYS``, without ``tokenizer`` (a different tokenizer
    is the same workload in other token units; throughput is then normalized) and without ``load``:
    the same profile and seed at another load level sends the same requests, so the comparison goes
    ahead and says so (``load_differences``): its deltas are the effect of the load.
    """
    res = WorkloadCheck()
    base = sides[baseline]
    drop = IGNORED_KEYS + ("tokenizer", "load")
    res.tokenizers_differ = len({tokenizer(s) for s in sides}) > 1
    sweeps = any(s.sweep for s in sides)
    for side in sides:
        if side is base:
            continue
        fa, fb = fingerprint(base), fingerprint(side)
        if fa and fa == fb:
            continue
        pa, pb = _comparable(base, drop), _comparable(side, drop)
        diffs = differences(pa, pb)
        if diffs:
            res.same = False
            res.mismatched.append(sides.index(side))
            shown = diffs[:MAX_SHOWN_DIFFERENCES]
            more = len(diffs) - len(shown)
            rest = f" and {more} more setting{'s' if more > 1 else ''}" if more else ""
            res.differences.append(f"{base.name} and {side.name} differ in {', '.join(shown)}{rest}")
            continue
        full_a, full_b = base.run.config.profile_resolved, side.run.config.profile_resolved
        if full_a.get("load") != full_b.get("load") and not sweeps:
            res.load_differences.append(
                f"{base.name} and {side.name} differ only in load ({_load_words(full_a, full_b)}): the same "
                "requests at two load levels, so the deltas show what the load does, not a change of "
                "endpoint (a load sweep compares many levels: loadtest sweep, then compare the sweeps)"
            )
            continue
        why = [k for k in _diff_keys(full_a, full_b) if k in drop] or ["how the fingerprint was taken"]
        same = (
            "requests of the same sizes, each in its own tokenizer"
            if "tokenizer" in why
            else "the same requests"
        )
        res.notes.append(
            f"{base.name} and {side.name}: fingerprints differ only in {', '.join(why)}; "
            f"same profile and seed, so {same}"
        )
    return res
