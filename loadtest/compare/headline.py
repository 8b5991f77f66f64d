"""The comparison in one line per input: which headline metrics got better, worse or stayed within noise."""

from __future__ import annotations

from typing import Any

# The metrics a headline names, in order (output_tps only when there is no normalized figure).
HEADLINE_KEYS = ("output_tps_norm", "output_tps", "ttft_p90", "tpot_p90", "itl_p50", "slo_attainment")
BETTER, WORSE, SAME = "better", "worse", "no significant change"


def change(delta: dict[str, Any]) -> str:
    """A delta in one word: better or worse (significant, by the metric's better direction) or no
    significant change (its 95 % interval includes 0)."""
    if not delta.get("significant") or delta.get("better") is None:
        return SAME
    return BETTER if delta["better"] else WORSE


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = {r["key"]: r for r in doc["metrics"]}
    keys = [k for k in HEADLINE_KEYS if not (k == "output_tps" and "output_tps_norm" in rows)]
    return [rows[k] for k in keys if k in rows]


def side_parts(doc: dict[str, Any], i: int) -> list[tuple[str, float, str]]:
    """(metric label, % change, change word) of input ``i``'s headline metrics against the baseline."""
    out = []
    for r in _rows(doc):
        d = r["deltas"][i]
        if d is None or d.get("pct") is None:
            continue
        out.append((r["label"], float(d["pct"]), change(d)))
    return out


def side_headline(doc: dict[str, Any], i: int) -> str:
    """``H200 vs H100 (baseline): better on 3, worse on 1, no significant change on 1: output tokens/s
    +25.1 % (better), TTFT p90 −10.2 % (better), …``."""
    base = doc["sides"][doc["baseline"]]["name"]
    parts = side_parts(doc, i)
    counts = {w: sum(1 for *_, c in parts if c == w) for w in (BETTER, WORSE, SAME)}
    tally = ", ".join(f"{w} on {n}" for w, n in counts.items() if n) or "nothing to compare"
    figures = ", ".join(f"{label} {pct:+.1f} % ({word})" for label, pct, word in parts)
    name = doc["sides"][i]["name"]
    return f"{name} vs {base} (baseline): {tally}" + (f": {figures}" if figures else "")


def headlines(doc: dict[str, Any]) -> list[str]:
    """One headline per input other than the baseline."""
    return [side_headline(doc, i) for i in range(len(doc["sides"])) if i != doc["baseline"]]
