"""The comparison document: per-run estimates, deltas against the baseline with CIs, token units, Pareto data."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadtest import __version__
from loadtest.compare import samples as smp
from loadtest.compare import stats
from loadtest.compare.inputs import Side
from loadtest.compare.stats import Estimate
from loadtest.compare.tokens import token_units
from loadtest.compare.workload import WorkloadCheck, check_workloads, fingerprint, tokenizer
from loadtest.contracts.run_document import RunDocument
from loadtest.contracts.sweep_document import SweepDocument
from loadtest.metrics.slo import RequestSlo

# Token agreement: a run whose server usage disagrees with the client on more than this share of
# requests switches the token-unit section on.
MISMATCH_SHARE = 0.01


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    better: str  # "higher" or "lower"
    definition: str


METRICS: tuple[Metric, ...] = (
    Metric("output_tps", "Output tokens/s", "tok/s", "higher", "output tokens of ok requests per second"),
    Metric("requests_per_s", "Requests/s", "req/s", "higher", "ok requests per second"),
    Metric("tps_per_user", "Tokens/s per user", "tok/s", "higher", "1000 / TPOT p90 (ms)"),
    Metric("ttft_p50", "TTFT p50", "ms", "lower", "time to first token, from the scheduled time"),
    Metric("ttft_p90", "TTFT p90", "ms", "lower", "time to first token, from the scheduled time"),
    Metric("ttft_p99", "TTFT p99", "ms", "lower", "time to first token, from the scheduled time"),
    Metric("tpot_p50", "TPOT p50", "ms", "lower", "time per output token after the first, per request"),
    Metric("tpot_p90", "TPOT p90", "ms", "lower", "time per output token after the first, per request"),
    Metric("itl_p50", "ITL p50", "ms", "lower", "gap between consecutive token-carrying chunks"),
    Metric("itl_p99", "ITL p99", "ms", "lower", "gap between consecutive token-carrying chunks"),
    Metric("e2e_p90", "E2E p90", "ms", "lower", "scheduled time to the last byte of the answer"),
    Metric("slo_attainment", "SLO attainment", "%", "higher", "good / judged requests (per-request SLO)"),
    Metric("goodput_rps", "Goodput", "req/s", "higher", "requests meeting the per-request SLO, per second"),
)
NORMALIZED: tuple[Metric, ...] = (
    Metric(
        "output_tps_norm",
        "Output tokens/s, normalized",
        "tok/s",
        "higher",
        "output tokens/s × token factor, in {unit}",
    ),
    Metric(
        "tps_per_user_norm",
        "Tokens/s per user, normalized",
        "tok/s",
        "higher",
        "tokens/s per user × token factor, in {unit}",
    ),
    Metric(
        "output_tps_usage",
        "Output tokens/s by server usage",
        "tok/s",
        "higher",
        "output tokens as each server reported them",
    ),
)

ROW_ORDER = [m.key for m in METRICS]
ROW_ORDER[1:1] = ["output_tps_norm", "output_tps_usage"]
ROW_ORDER.insert(ROW_ORDER.index("tps_per_user") + 1, "tps_per_user_norm")


def _slo_rule(sides: list[Side], baseline: int) -> tuple[RequestSlo | None, str | None]:
    """The baseline's per-request SLO, else the first side's that has one: one yardstick for all."""
    for side in [sides[baseline], *sides]:
        gp = side.run.goodput
        rule = gp.rule if gp is not None else None
        if rule is not None and (rule.ttft_ms is not None or rule.tpot_ms is not None):
            return RequestSlo(ttft_ms=rule.ttft_ms, tpot_ms=rule.tpot_ms), side.name
    return None, None


def _window(side: Side) -> tuple[float, float] | None:
    judged = side.run.judged
    return (judged.window.start, judged.window.end) if judged is not None else None


def _estimates(side: Side, s: smp.RunSamples) -> dict[str, Estimate | None]:
    rng = stats.rng_for(side.name, str(side.run_dir))
    ttft = stats.percentiles(s.ttft_ms, (50.0, 90.0, 99.0), rng) or {}
    tpot = stats.percentiles(s.tpot_ms, (50.0, 90.0), rng) or {}
    e2e = stats.percentiles(s.e2e_ms, (90.0,), rng) or {}
    itl = stats.clustered_percentiles(s.itl_ms, s.itl_req, s.n_itl_requests, (50.0, 99.0), rng) or {}
    out: dict[str, Estimate | None] = {
        "output_tps": stats.rate(s.done, s.tokens, s.start, s.end, rng),
        "requests_per_s": stats.rate(s.done, np.ones_like(s.done), s.start, s.end, rng),
        "tps_per_user": stats.transform(tpot.get(90.0), lambda x: 1000.0 / x),
        "ttft_p50": ttft.get(50.0),
        "ttft_p90": ttft.get(90.0),
        "ttft_p99": ttft.get(99.0),
        "tpot_p50": tpot.get(50.0),
        "tpot_p90": tpot.get(90.0),
        "itl_p50": itl.get(50.0),
        "itl_p99": itl.get(99.0),
        "e2e_p90": e2e.get(90.0),
        "slo_attainment": None,
        "goodput_rps": None,
    }
    if s.judged_good is not None:
        out["slo_attainment"] = stats.transform(stats.proportion(s.judged_good, rng), lambda x: x * 100.0)
        good_done = s.judged_done[s.judged_good]
        out["goodput_rps"] = stats.rate(good_done, np.ones_like(good_done), s.start, s.end, rng)
    has_usage = s.usage_tokens.size and not np.isnan(s.usage_tokens).any()
    out["output_tps_usage"] = stats.rate(s.done, s.usage_tokens, s.start, s.end, rng) if has_usage else None
    return out


def _cell(est: Estimate | None) -> dict[str, float] | None:
    if est is None or not np.isfinite(est.value):
        return None
    lo, hi = est.ci
    return {"value": est.value, "ci_lo": lo, "ci_hi": hi}


def _row(metric: Metric, ests: list[Estimate | None], baseline: int) -> dict[str, Any]:
    base = ests[baseline]
    deltas: list[dict[str, Any] | None] = []
    for i, est in enumerate(ests):
        if i == baseline or base is None or est is None:
            deltas.append(None)
            continue
        d = stats.delta(base, est)
        improves = (d.abs > 0) == (metric.better == "higher") if d.abs != 0 else None
        deltas.append(
            {
                "abs": d.abs,
                "abs_ci": list(d.abs_ci),
                "pct": d.pct,
                "pct_ci": list(d.pct_ci) if d.pct_ci else None,
                "significant": d.significant,
                "better": improves,
            }
        )
    return {
        "key": metric.key,
        "label": metric.label,
        "unit": metric.unit,
        "better": metric.better,
        "definition": metric.definition,
        "values": [_cell(e) for e in ests],
        "deltas": deltas,
    }


def _mismatch_share(side: Side) -> float:
    tok = side.run.metrics.tokens
    reports = tok.usage_reports
    return tok.mismatched_requests / reports if reports else 0.0


def _token_section(sides: list[Side], baseline: int, found: list[smp.RunSamples]) -> dict[str, Any]:
    tokenizers = [tokenizer(s) for s in sides]
    units = token_units(tokenizers, baseline)
    differ = len(set(tokenizers)) > 1
    mismatch = [_mismatch_share(s) for s in sides]
    per = []
    for side, unit, s, share in zip(sides, units, found, mismatch, strict=True):
        usage = s.usage_tokens
        client = s.tokens.sum()
        ratio = (
            float(np.nansum(usage) / client) if usage.size and client and not np.isnan(usage).all() else None
        )
        per.append(
            {
                "name": side.name,
                "tokenizer": unit.tokenizer,
                "chars_per_token": unit.chars_per_token,
                "factor": unit.factor,
                "usage_per_client_token": ratio,
                "mismatch_share": share,
            }
        )
    if differ:
        reason = "the runs counted tokens with different tokenizers"
    elif any(m > MISMATCH_SHARE for m in mismatch):
        reason = "server usage counts disagree with the client's"
    else:
        reason = None
    return {
        "active": reason is not None,
        "reason": reason,
        "tokenizers_differ": differ,
        "unit": f"{tokenizers[baseline]} tokens",
        "runs": per,
    }


def _sweep_pareto(sweep: SweepDocument, f: float) -> list[dict[str, Any]]:
    pts = []
    for p in sweep.points:
        x, y = p.tps_per_user, p.output_tps
        if x is None or y is None:
            continue
        pts.append(
            {
                "label": p.label,
                "tps_per_user": x * f,
                "output_tps": y * f,
                "knee": p.index == sweep.knee,
                "best": p.index == sweep.best_under_slo,
                "verdict": p.verdict,
            }
        )
    return pts


def _run_pareto(run: RunDocument, f: float) -> list[dict[str, Any]]:
    thr = run.metrics.throughput
    x, y = thr.tps_per_user, thr.output_tokens_per_s
    if x is None:
        return []
    label = run.config.load.description or "run"
    return [{"label": label, "tps_per_user": x * f, "output_tps": y * f, "knee": False, "best": False}]


def _pareto(side: Side, factor: float | None) -> dict[str, Any]:
    f = factor if factor is not None else 1.0
    pts = _sweep_pareto(side.sweep.doc, f) if side.sweep is not None else _run_pareto(side.run, f)
    return {"name": side.name, "kind": side.kind, "points": pts}


def _verdict_info(run: RunDocument) -> dict[str, Any]:
    v = run.verdict
    if v is None:
        return {"status": None, "exit_code": None, "reasons": []}
    return {"status": v.status, "exit_code": v.exit_code, "reasons": list(v.reasons)}


def _sweep_info(side: Side) -> dict[str, Any] | None:
    if side.sweep is None or side.point is None:
        return None
    sw = side.sweep.doc
    knee, best = sw.point(sw.knee), sw.point(sw.best_under_slo)
    return {
        "path": str(side.sweep.path),
        "mode": sw.mode,
        "status": sw.status,
        "points": len(sw.points),
        "knee": knee.label if knee else None,
        "best_under_slo": best.label if best else None,
        "compared_point": side.point.label,
        "compared_because": side.point_reason,
    }


def _side_info(side: Side, s: smp.RunSamples) -> dict[str, Any]:
    run = side.run
    engine = run.endpoint.engine or {}  # the embedded engine's configuration: a JSON object
    return {
        "name": side.name,
        "path": str(side.path),
        "kind": side.kind,
        "run_dir": str(side.run_dir),
        "run_id": run.run_id,
        "report": str(side.run_dir / (run.files.report or "report.html")),
        "status": run.status,
        "interrupted_reason": run.interrupted_reason,
        "verdict": _verdict_info(run),
        "endpoint": run.endpoint.url,
        "embedded": run.endpoint.embedded,
        "engine": {k: engine.get(k) for k in ("gpu", "model", "tp", "speedup")} if engine else None,
        "model": run.config.model,
        "load": run.config.load.description,
        "tokenizer": tokenizer(side),
        "fingerprint": fingerprint(side),
        "samples": {"ok": s.n_ok, "sampled": s.n_sampled, "duration_s": round(s.end - s.start, 3)},
        "sweep": _sweep_info(side),
    }


def build_comparison(
    sides: list[Side], baseline: int = 0, check: WorkloadCheck | None = None, allowed: bool = False
) -> dict[str, Any]:
    """Everything the report shows, as a JSON-ready document (written as compare.json)."""
    check = check or check_workloads(sides, baseline)
    rule, rule_from = _slo_rule(sides, baseline)
    found = [smp.read_samples(s.records, rule, _window(s)) for s in sides]
    ests = [_estimates(side, s) for side, s in zip(sides, found, strict=True)]
    tokens = _token_section(sides, baseline, found)
    rows = [_row(m, [e[m.key] for e in ests], baseline) for m in METRICS]
    rows = [r for r in rows if any(v is not None for v in r["values"])]
    if tokens["active"]:
        factors = [r["factor"] for r in tokens["runs"]]

        def scaled(key: str, i: int) -> Estimate | None:
            f = factors[i]
            return None if f is None else stats.transform(ests[i][key], lambda x: x * f)

        n = len(sides)
        extra = [
            (NORMALIZED[0], [scaled("output_tps", i) for i in range(n)]),
            (NORMALIZED[1], [scaled("tps_per_user", i) for i in range(n)]),
            (NORMALIZED[2], [e["output_tps_usage"] for e in ests]),
        ]
        for m, col in extra:
            row = _row(
                Metric(m.key, m.label, m.unit, m.better, m.definition.format(unit=tokens["unit"])),
                col,
                baseline,
            )
            if any(v is not None for v in row["values"]):
                rows.append(row)
        rows.sort(key=lambda r: ROW_ORDER.index(r["key"]))
    factors_for_plot = [r["factor"] for r in tokens["runs"]] if tokens["active"] else [1.0] * len(sides)
    return {
        "schema_version": 1,
        "kind": "compare",
        "tool": {"name": "loadtest", "version": __version__},
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "baseline": baseline,
        "sides": [_side_info(side, s) for side, s in zip(sides, found, strict=True)],
        "workload": {**check.to_dict(), "allowed_different": allowed and not check.same},
        "tokens": tokens,
        "slo_rule": None
        if rule is None
        else {"ttft_ms": rule.ttft_ms, "tpot_ms": rule.tpot_ms, "from": rule_from},
        "metrics": rows,
        "pareto": [_pareto(side, f) for side, f in zip(sides, factors_for_plot, strict=True)],
        "method": {
            "confidence": stats.CONFIDENCE,
            "replicates": stats.REPLICATES,
            "seed": stats.BOOT_SEED,
            "max_requests": smp.MAX_REQUESTS,
            "max_itl_requests": smp.MAX_ITL_REQUESTS,
        },
    }
