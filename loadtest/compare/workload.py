"""Whether the compared inputs sent the same requests: workload fingerprints and resolved profiles."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from loadtest.compare.inputs import Side

# Resolved-profile keys that do not change which requests are sent: labels, how long the run lasted,
# and the embedded engine's preset (the server under test, which the fingerprint also hashes).
IGNORED_KEYS = ("name", "description", "source", "duration_s", "engine")


@dataclass
class WorkloadCheck:
    """The verdict on workload identity, with the differences in words."""

    same: bool = True
    tokenizers_differ: bool = False
    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mismatched: list[int] = field(default_factory=list)  # indices of the sides that differ from the baseline

    def to_dict(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "tokenizers_differ": self.tokenizers_differ,
            "differences": self.differences,
            "notes": self.notes,
        }


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


def _show(v: Any) -> str:
    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _diff_keys(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def check_workloads(sides: list[Side], baseline: int = 0) -> WorkloadCheck:
    """Compare every side with the baseline: equal fingerprints, or equal resolved profiles and seeds.

    Profiles are compared without ``IGNORED_KEYS`` and without ``tokenizer`` (a different tokenizer
    is the same workload in other token units; throughput is then normalized); with a sweep among
    the inputs also without ``load`` (a sweep sets the load per point).
    """
    res = WorkloadCheck()
    base = sides[baseline]
    drop = IGNORED_KEYS + ("tokenizer",) + (("load",) if any(s.sweep for s in sides) else ())
    res.tokenizers_differ = len({tokenizer(s) for s in sides}) > 1
    for side in sides:
        if side is base:
            continue
        fa, fb = fingerprint(base), fingerprint(side)
        if fa and fa == fb:
            continue
        pa, pb = _comparable(base, drop), _comparable(side, drop)
        keys = _diff_keys(pa, pb)
        if keys:
            res.same = False
            res.mismatched.append(sides.index(side))
            parts = [f"{k}: {_show(pa.get(k))} vs {_show(pb.get(k))}" for k in keys]
            res.differences.append(f"{base.name} vs {side.name}: " + "; ".join(parts))
            continue
        full_a, full_b = base.run.config.profile_resolved, side.run.config.profile_resolved
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
