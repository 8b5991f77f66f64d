"""`loadtest run` additions: several endpoints, the endpoint's hardware and price, and their run.json results."""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from loadtest.cli.endpoint_flags import resolve_hosts
from loadtest.cli.endpoint_options import spec_from_args
from loadtest.economics.cost import endpoint_record, run_economics
from loadtest.economics.spec import EndpointSpecError

# A replica is named in the verdict when its error rate is at least this, and this many times the others'.
REPLICA_MIN_ERROR_RATE = 0.05
REPLICA_FACTOR = 3.0
REPLICA_MIN_REQUESTS = 5


def setup(args: argparse.Namespace, settings: Any) -> None:
    """Before the run: the endpoints (``--host`` ×N, ``--hosts-file``), balance mode, endpoint description.
    Raises ValueError with one line on bad input."""
    hosts = resolve_hosts(args)
    settings.hosts = hosts if len(hosts) > 1 else None
    settings.balance = getattr(args, "balance", None) or "round-robin"
    try:
        spec = spec_from_args(args)
    except EndpointSpecError as e:
        raise ValueError(str(e)) from e
    settings.endpoint_spec = spec.model_dump() if spec is not None else None


def check_replicas(settings: Any, api_key: str | None, args: argparse.Namespace, profile: Any) -> str | None:
    """``GET /v1/models`` on every replica after the first (open_endpoint checked that one); the error line."""
    from loadtest.client.apis import auth_headers
    from loadtest.client.preflight import EndpointError, served_models

    headers = auth_headers(api_key, profile)
    for host in (settings.hosts or [])[1:]:
        try:
            served_models(
                host,
                api_key,
                timeout=args.connect_timeout or 10.0,
                verify_tls=settings.verify_tls,
                headers=headers,
                check=getattr(args, "endpoint_check", "models"),
            )
        except EndpointError as e:
            return f"replica {host}: {e}"
    return None


def endpoint_extras(settings: Any, engine_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """run.json ``endpoint`` keys: ``replicas`` and ``balance``, ``hardware`` and ``price`` (when known)."""
    from loadtest.economics.spec import EndpointSpec

    out: dict[str, Any] = {}
    if settings.hosts:
        out["replicas"] = list(settings.hosts)
        out["balance"] = settings.balance
    data = dict(settings.endpoint_spec or {})
    hw = data.get("hardware") or {}
    if engine_info and hw.get("gpu_kind", "unknown") == "unknown" and hw.get("gpu_count") is None:
        gpu, tp = engine_info.get("gpu"), engine_info.get("tp")
        data["hardware"] = {
            "gpu_kind": (gpu.get("name") if isinstance(gpu, dict) else gpu) or "unknown",
            "gpu_count": tp if isinstance(tp, int) else 1,
        }
    if data:
        out.update(endpoint_record(EndpointSpec.model_validate(data)))
    return out


def _pct(v: float) -> str:
    return f"{v * 100:.0f}%" if v >= 0.01 or v == 0 else f"{v * 100:.2f}%"


def per_endpoint(lines: Sequence[Mapping[str, Any]], hosts: Sequence[str], balance: str) -> dict[str, Any]:
    """``metrics.per_endpoint``: requests, outcomes, output tokens/s, TTFT/TPOT p50/p99, share per replica,
    and the imbalance (largest share ÷ even share, 1 = even)."""
    from loadtest.metrics.judged import aggregate_lines
    from loadtest.metrics.summary import build_metrics

    groups: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for ln in lines:
        groups[int(ln.get("endpoint") or 0)].append(ln)
    total = sum(len(g) for g in groups.values()) or 1
    rows = []
    for i, url in enumerate(hosts):
        m = build_metrics(aggregate_lines(groups.get(i, []), per_scenario=False).all)
        lat, req = m["latency_ms"], m["requests"]
        rows.append(
            {
                "index": i,
                "url": url,
                "requests": len(groups.get(i, [])),
                "share": round(len(groups.get(i, [])) / total, 6),
                "ok": req["ok"],
                "failed": req["failed"],
                "error_rate": req["error_rate"],
                "by_outcome": {k: v for k, v in req["by_outcome"].items() if v},
                "output_tokens_per_s": m["throughput"]["output_tokens_per_s"],
                "ttft_p50_ms": lat["ttft"]["p50"],
                "ttft_p99_ms": lat["ttft"]["p99"],
                "tpot_p50_ms": lat["tpot"]["p50"],
                "tpot_p99_ms": lat["tpot"]["p99"],
                "e2e_p99_ms": lat["e2e"]["p99"],
            }
        )
    shares = [r["share"] for r in rows]
    return {
        "balance": balance,
        "endpoints": rows,
        "imbalance": round(max(shares) * len(rows), 4) if rows and total else None,
    }


def failing_replicas(per: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(index, sentence) for each replica whose error rate is far above the others'."""
    rows = per.get("endpoints") or []
    out = []
    for r in rows:
        others = [o for o in rows if o is not r]
        done = sum(o["ok"] + o["failed"] for o in others)
        rate_others = sum(o["failed"] for o in others) / done if done else 0.0
        n = r["ok"] + r["failed"]
        if n < REPLICA_MIN_REQUESTS or r["error_rate"] < REPLICA_MIN_ERROR_RATE:
            continue
        if r["error_rate"] >= REPLICA_FACTOR * rate_others:
            out.append(
                (
                    r["index"],
                    f"replica {r['index']} ({r['url']}) failed {_pct(r['error_rate'])} of its {n} requests "
                    f"(the others {_pct(rate_others)})",
                )
            )
    return out


def embeddings_metrics(lines: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``metrics.embeddings``: inputs, inputs/s and request latency of embeddings requests (no TTFT/TPOT)."""
    emb = [ln for ln in lines if ln.get("api") == "embeddings" or ln.get("inputs")]
    if not emb:
        return None
    ok = [ln for ln in emb if ln.get("outcome") == "ok" and ln.get("e2e_us") is not None]
    start = min(ln["t"] for ln in emb)
    end = max(ln["t"] + (ln.get("e2e_us") or 0) / 1e6 for ln in emb)
    dur = end - start
    lat = sorted(ln["e2e_us"] / 1000 for ln in ok)

    def q(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else None

    inputs = sum(int(ln.get("inputs") or 0) for ln in ok)
    return {
        "requests_ok": len(ok),
        "inputs_total": inputs,
        "inputs_per_s": round(inputs / dur, 3) if dur > 0 else 0.0,
        "input_tokens_total": sum(int(ln.get("prompt_tokens") or 0) for ln in ok),
        "latency_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99)},
    }


def results(doc: dict[str, Any], verdict: Any, lines: Sequence[Mapping[str, Any]], settings: Any) -> None:
    """After the verdict: per-endpoint breakdown (a failing replica named in the verdict, as a flagged
    check), embeddings figures and token economics, into run.json."""
    from loadtest.metrics.verdict import Check

    if settings.hosts:
        per = per_endpoint(lines, settings.hosts, settings.balance)
        doc["metrics"]["per_endpoint"] = per
        for index, sentence in failing_replicas(per):
            verdict.checks.append(Check(f"replica_{index}_errors", False, sentence, "health", blocking=False))
            verdict.reasons.append(sentence)
    emb = embeddings_metrics(lines)
    if emb is not None:
        doc["metrics"]["embeddings"] = emb
    econ = run_economics(doc)
    if econ is not None:
        doc["economics"] = econ
