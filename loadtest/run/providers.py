"""run.json sections that come from a run's extras, one provider each: the token count's description,
several endpoints (per-endpoint figures, a failing replica), embeddings, rerank, KServe v2 samples, economics, answer
quality (the quality gate), the server's telemetry. A provider is fed the record log batch by batch (``add``), then gives its contribution
(``contribute``: its data, its checks and its notes) before the verdict is judged from every check."""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.accuracy.scorers.agentic import AgenticScore
from loadtest.client.quality import CHECKED_APIS, QUALITY_CHECKS, gate_checks
from loadtest.contracts.record_line import AgenticTurn, RecordLine
from loadtest.economics.cost import endpoint_record, run_economics
from loadtest.economics.spec import EndpointSpec
from loadtest.locust.settings import RunSettings
from loadtest.metrics.conversations import ConversationTally
from loadtest.metrics.endpoints import UsageAgreement
from loadtest.metrics.judged import record_from_line
from loadtest.metrics.recorder import Recorder
from loadtest.metrics.slo import AnySlo, ConversationSlo, QualitySlo, RequestSlo
from loadtest.metrics.summary import build_metrics
from loadtest.metrics.verdict import (
    DEFAULT_QUALITY_MIN,
    Check,
    ExtraCheck,
    conversation_checks,
    quality_reason,
)
from loadtest.metrics.window import WindowScan
from loadtest.profile.quality import QualitySpec
from loadtest.run.tokens import tokens_section
from loadtest.telemetry import TelemetryPoller, findings
from loadtest.workload.builder import Workload

# A replica is named in the verdict when its error rate is at least this, and this many times the others'.
REPLICA_MIN_ERROR_RATE = 0.05
REPLICA_FACTOR = 3.0
REPLICA_MIN_REQUESTS = 5


@dataclass
class Contribution:
    """What one provider adds to run.json: keys of ``metrics`` (figures over the whole run, like the
    rest of it), top-level sections, checks for the verdict (each with the reason its failure gives),
    and notes (which the verdict's reasons repeat; the server's telemetry's are remarks instead:
    ``finalize`` puts them, and its sections, after the verdict)."""

    metrics: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)
    checks: list[ExtraCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Provider:
    """One run.json section. ``add`` sees every record-log line once, in log order, in batches;
    ``contribute`` reads the run.json document built so far (never changes it)."""

    def add(self, lines: Sequence[RecordLine]) -> None:
        """One batch of record-log lines (most providers need none)."""

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        raise NotImplementedError


class TokensProvider(Provider):
    """run.json ``tokens``: which count the figures use and which tokenizer; a note when that is a guess."""

    def __init__(self, settings: RunSettings, workload: Workload) -> None:
        self.settings, self.workload = settings, workload
        self._endpoints = UsageAgreement()

    def add(self, lines: Sequence[RecordLine]) -> None:
        for line in lines:
            self._endpoints.add(line)

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        section, note = tokens_section(doc["metrics"], self.settings, self.workload)
        section["endpoints"] = self._endpoints.to_dict()
        return Contribution(sections={"tokens": section}, notes=[note] if note else [])


class EndpointsProvider(Provider):
    """``metrics.per_endpoint`` (several endpoints): requests, outcomes, output tokens/s, TTFT/TPOT
    p50/p99 and share per replica, the imbalance; a non-blocking check naming each failing replica."""

    def __init__(self, hosts: Sequence[str], balance: str) -> None:
        self.hosts, self.balance = list(hosts), balance
        self._recorders = [Recorder(per_scenario=False) for _ in self.hosts]
        self._requests: Counter[int] = Counter()

    def add(self, lines: Sequence[RecordLine]) -> None:
        recorders, n = self._recorders, len(self._recorders)
        for line in lines:
            i = line.endpoint
            self._requests[i] += 1
            if 0 <= i < n:
                recorders[i].add(record_from_line(line))

    def per_endpoint(self) -> dict[str, Any]:
        """The largest share ÷ the even share is the imbalance (1 = even)."""
        total = sum(self._requests.values()) or 1
        rows = []
        for i, url in enumerate(self.hosts):
            m = build_metrics(self._recorders[i].result().all)
            lat, req = m["latency_ms"], m["requests"]
            requests = self._requests.get(i, 0)
            rows.append(
                {
                    "index": i,
                    "url": url,
                    "requests": requests,
                    "share": round(requests / total, 6),
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
            "balance": self.balance,
            "endpoints": rows,
            "imbalance": round(max(shares) * len(rows), 4) if rows and total else None,
        }

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        per = self.per_endpoint()
        checks = [
            ExtraCheck(Check(f"replica_{index}_errors", False, sentence, "health", blocking=False), sentence)
            for index, sentence in failing_replicas(per)
        ]
        return Contribution(metrics={"per_endpoint": per}, checks=checks)


def _pct(v: float) -> str:
    return f"{v * 100:.0f}%" if v >= 0.01 or v == 0 else f"{v * 100:.2f}%"


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


class _LatencyOnlyProvider(Provider):
    """A ``metrics`` section for an API with no tokens out (no TTFT/TPOT): requests, the inputs they
    carried (the record line's ``inputs``), inputs/s, input tokens and request latency percentiles."""

    KEY = ""  # the metrics key
    INPUTS = ""  # what the section calls the inputs ("inputs", "documents")

    def __init__(self) -> None:
        self._seen = 0
        self._start = self._end = 0.0
        self._latency_ms = array("d")  # ok requests'
        self._inputs = self._input_tokens = 0

    def selects(self, ln: RecordLine) -> bool:
        raise NotImplementedError

    def add(self, lines: Sequence[RecordLine]) -> None:
        for ln in lines:
            if not self.selects(ln):
                continue
            end = ln.t + (ln.e2e_us or 0) / 1e6
            self._start = min(self._start, ln.t) if self._seen else ln.t
            self._end = max(self._end, end) if self._seen else end
            self._seen += 1
            if ln.outcome == "ok" and ln.e2e_us is not None:
                self._latency_ms.append(ln.e2e_us / 1000)
                self._inputs += ln.n_inputs
                self._input_tokens += ln.prompt_tokens

    def extra(self) -> dict[str, Any]:
        """Keys the section has before the common ones."""
        return {}

    def section(self) -> dict[str, Any] | None:
        if not self._seen:
            return None
        dur = self._end - self._start
        lat = sorted(self._latency_ms)

        def q(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else None

        return {
            **self.extra(),
            "requests_ok": len(lat),
            f"{self.INPUTS}_total": self._inputs,
            f"{self.INPUTS}_per_s": round(self._inputs / dur, 3) if dur > 0 else 0.0,
            "input_tokens_total": self._input_tokens,
            "latency_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99)},
        }

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        section = self.section()
        return Contribution(metrics={self.KEY: section} if section is not None else {})


class EmbeddingsProvider(_LatencyOnlyProvider):
    """``metrics.embeddings``: inputs, inputs/s and request latency of embeddings requests."""

    KEY, INPUTS = "embeddings", "inputs"

    def selects(self, ln: RecordLine) -> bool:
        return ln.api not in (
            "rerank",
            "kserve_v2",
            "kserve_v2_grpc",
            "videogen",
            "video_jobs",
            "images",
        ) and (ln.api == "embeddings" or bool(ln.n_inputs))


class RerankProvider(_LatencyOnlyProvider):
    """``metrics.rerank``: requests, documents, documents/s and request latency of rerank requests."""

    KEY, INPUTS = "rerank", "documents"

    def selects(self, ln: RecordLine) -> bool:
        return ln.api == "rerank"

    def extra(self) -> dict[str, Any]:
        return {"requests": self._seen}


class SamplesProvider(RerankProvider):
    """``metrics.samples``: queries, samples, samples/s and request latency of KServe v2 inference and video
    generation requests (one video or image a sample; MLPerf's Offline samples/s, its Server figure the queries/s)."""

    KEY, INPUTS = "samples", "samples"

    def selects(self, ln: RecordLine) -> bool:
        return ln.api in ("kserve_v2", "kserve_v2_grpc", "videogen", "video_jobs", "images")


CHECK_WORDS = {
    "empty": "empty output",
    "finish_reason": "an unexpected finish reason",
    "length": "an output length out of range",
    "json": "malformed JSON (JSON mode or a tool call)",
    "match": "no match with the reference answer",
}


class QualityProvider(Provider):
    """run.json ``quality``: the ok answers' check results (the record log's ``quality_failed``), overall
    and per check; a blocking ``quality_min`` check (kind ``quality``) against the SLO or the default floor."""

    def __init__(self, spec: QualitySpec, slos: Sequence[AnySlo]) -> None:
        self.gate = gate_checks(spec)
        self.slo = next((s for s in slos if isinstance(s, QualitySlo)), None)
        self.checked = self.failed = 0
        self.per_check: Counter[str] = Counter()
        self.first: dict[str, str] = {}

    def add(self, lines: Sequence[RecordLine]) -> None:
        gate = self.gate
        for ln in lines:
            if ln.outcome != "ok" or ln.api not in CHECKED_APIS:
                continue
            self.checked += 1
            failed = ln.failed_checks
            if not failed:
                continue
            self.per_check.update(failed)
            for name in failed:
                self.first.setdefault(name, ln.id)
            if any(name in gate for name in failed):
                self.failed += 1

    def section(self) -> dict[str, Any]:
        n = self.checked

        def rate(failed: int) -> float | None:
            return round((n - failed) / n, 6) if n else None

        return {
            "checked": n,
            "passed": n - self.failed,
            "pass_rate": rate(self.failed),
            "min": self.slo.limit if self.slo is not None else DEFAULT_QUALITY_MIN,
            "min_source": "slo" if self.slo is not None else "default",
            "gate": list(self.gate),
            "checks": {
                name: {
                    "failed": self.per_check[name],
                    "pass_rate": rate(self.per_check[name]),
                    "first_failed": self.first.get(name),
                }
                for name in QUALITY_CHECKS
            },
        }

    def check(self, section: Mapping[str, Any]) -> ExtraCheck | None:
        """The gate: None when no ok answer was checked (the endpoint checks say why)."""
        rate, limit = section["pass_rate"], section["min"]
        if rate is None:
            return None
        passed = rate >= limit
        source = (
            ""
            if self.slo is not None
            else ", the default floor: set quality_min in the profile's slos or --slo"
        )
        detail = (
            f"{_pct(rate)} of {self.checked} ok answers passed every answer check "
            f"(need ≥ {limit * 100:g} %{source})"
        )
        worst = [(name, self.per_check[name]) for name in self.gate if self.per_check[name]]
        if worst:
            name, count = max(worst, key=lambda nc: nc[1])
            detail += f"; {count} failed {name} ({CHECK_WORDS[name]}), first {self.first[name]}"
        check = Check("quality_min", passed, detail, "quality", rate, limit)
        return ExtraCheck(check, quality_reason(detail))

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        section = self.section()
        gate = self.check(section)
        return Contribution(sections={"quality": section}, checks=[gate] if gate is not None else [])


class ConversationsProvider(Provider):
    """run.json ``conversations``: the per-conversation figures of a run with sessions (multi-turn chats,
    agents, recorded agent sessions; metrics/conversations.py)."""

    def __init__(self, slos: Sequence[AnySlo], smoke: bool = False) -> None:
        self.tally = ConversationTally(RequestSlo.from_slos(slos))
        self.slo = next((s for s in slos if isinstance(s, ConversationSlo)), None)
        self.smoke = smoke

    def add(self, lines: Sequence[RecordLine]) -> None:
        self.tally.add(lines)

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        """The section, and with a ``conversation_attainment`` SLO its checks (judged even when the run
        had no conversation: then nothing could be judged)."""
        section = self.tally.result(float(doc["metrics"]["window"]["duration_s"]))
        checks = (
            conversation_checks(
                self.slo,
                section["judged"] if section else 0,
                section["good"] if section else 0,
                smoke=self.smoke,
            )
            if self.slo is not None
            else []
        )
        return Contribution(sections={"conversations": section} if section is not None else {}, checks=checks)


class AgenticAccuracyProvider(Provider):
    """run.json ``agentic_accuracy``: the MLPerf agentic inline accuracy of the recorded agent calls with
    an expected answer (accuracy/scorers/agentic.py); a blocking ``agentic_accuracy`` check (kind
    ``quality``) when the profile gives ``agent_trace.accuracy_target``."""

    def __init__(self, target: float | None) -> None:
        self.target = target
        self.tally = AgenticScore()

    def add(self, lines: Sequence[RecordLine]) -> None:
        for ln in lines:
            if isinstance(ln.agentic, AgenticTurn):
                self.tally.add(ln.agentic, ln.outcome == "ok")

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        if not self.tally.issued:
            return Contribution()
        section = {**self.tally.section(), "target": self.target}
        score = section["score"]
        if self.target is None:
            return Contribution(sections={"agentic_accuracy": section})
        n = self.tally.scored
        detail = (
            f"agentic accuracy {score:.4f} over {n} scored calls, need ≥ {self.target:g} "
            "(agent_trace.accuracy_target)"
            if score is not None
            else "agentic accuracy: no recorded call had an answer to score (agent_trace.accuracy_target)"
        )
        passed = score is not None and score >= self.target
        check = Check("agentic_accuracy", passed, detail, "quality", score, self.target)
        return Contribution(sections={"agentic_accuracy": section}, checks=[ExtraCheck(check, detail)])


class EconomicsProvider(Provider):
    """run.json ``economics``: per-GPU throughput and cost per 1M tokens over the judged window, when the
    endpoint's GPU count or price is known (docs/economics.md)."""

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        econ = run_economics(dict(doc))
        return Contribution(sections={"economics": econ} if econ is not None else {})


class WindowProvider(Provider):
    """run.json ``reporting_window``: the MLPerf Endpoints steady-state window on issue time, its
    status and verdict (metrics/window.py); the whole run stays the ``total``."""

    def __init__(self) -> None:
        self.scan = WindowScan()

    def add(self, lines: Sequence[RecordLine]) -> None:
        self.scan.add(lines)

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        datasets = (doc.get("workload") or {}).get("datasets") or {}
        size = sum(d["requests"] for d in datasets.values()) or None
        concurrency = doc["config"]["load"]["concurrency"]
        return Contribution(sections={"reporting_window": self.scan.window(concurrency, size).to_dict()})


class TelemetryProvider(Provider):
    """run.json ``telemetry`` (the endpoint's series and server-side latency, judged window included)
    and ``prefix_cache``. A missing /metrics or a warm prefix cache is a remark, not a reason."""

    def __init__(self, poller: TelemetryPoller | None, run_started_epoch: float | None) -> None:
        self.poller, self.run_started_epoch = poller, run_started_epoch

    def contribute(self, doc: Mapping[str, Any]) -> Contribution:
        found = findings(doc, self.poller, self.run_started_epoch)
        sections = {"telemetry": found.telemetry} if found.telemetry is not None else {}
        if found.prefix_cache is not None:
            sections["prefix_cache"] = found.prefix_cache
        return Contribution(sections=sections, notes=found.notes)


def endpoint_extras(settings: RunSettings, engine_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """run.json ``endpoint`` keys: ``replicas`` and ``balance``, ``hardware`` and ``price`` (when known)."""

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
