"""Run verdict: endpoint, quality, validity, generator-health, SLO and token checks, exit codes and JUnit XML."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from hdrh.histogram import HdrHistogram

from loadtest.client.failures import commonest_from_metrics, failing_text, pct
from loadtest.metrics import delivery, hdr
from loadtest.metrics import early_stopping as es
from loadtest.metrics.samples import LatencySamples
from loadtest.metrics.slo import AnySlo, ConversationSlo, ErrorRateSlo, Slo, parse_slos

CheckKind = Literal["endpoint", "quality", "validity", "health", "slo", "tokens"]
Status = Literal["pass", "slo_missed", "invalid", "error_rate", "quality_failed"]
# judging.generator_health / --generator-health: "fail" (an unhealthy generator makes the run invalid)
# or "warn" (the health checks are made and reported, but never block: a shared, busy CI runner).
GeneratorHealth = Literal["fail", "warn"]
# The checks of the load generator's own health (run.json providers add other, non-blocking "health"
# checks: a failing replica, loadtest/run/providers.py).
GENERATOR_HEALTH_CHECKS = ("schedule_lag_p99", "generator_cpu", "streams_held")

# Process exit codes. 1 ("could not run": crash, endpoint unreachable before the run) and
# 2 ("bad input": usage, profile or SLO errors) belong to the CLI and are never a verdict.
EXIT_CODES: dict[str, int] = {
    "pass": 0,  # every SLO met, with early-stopping evidence, on a valid run
    "slo_missed": 10,  # a latency percentile SLO is over its limit
    "invalid": 11,  # too short, too few queries, generator overloaded, or not enough evidence
    "error_rate": 12,  # the endpoint failed: no successful requests, error rate over its limit, stopped early
    "quality_failed": 13,  # the answers failed the quality gate: empty, malformed JSON, no match (quality_min)
}
# When several apply, the first wins. A failing endpoint is the cause of whatever else fails (an
# overloaded generator spinning on fast errors, no samples to judge), so it comes first; then an
# invalid run, which proves nothing, so its SLO results do not count. Garbage answers come right after
# a failing endpoint: an overloaded generator or a short run does not make answers empty or malformed.
PRECEDENCE: tuple[Status, ...] = ("error_rate", "quality_failed", "invalid", "slo_missed")
OVERLOADED = "the load generator, not the endpoint, limited this run"
HEALTH_FIX = (
    "give the generator more room: --processes N (about one per free core) or a quieter machine; "
    "--generator-health warn on a shared runner"
)
# The error-rate limit when neither the profile's slos nor --slo give one: a CI gate never passes an
# endpoint that fails more than 1 in 100 requests. An explicit error_rate (even 100%) replaces it.
DEFAULT_ERROR_RATE = 0.01
# The quality floor when no quality_min SLO gives one: at least 99 % of the ok answers pass every answer
# check (loadtest/client/quality.py). An explicit quality_min (even 0%) replaces it.
DEFAULT_QUALITY_MIN = 0.99
# Failed checks are listed (reasons) by cause: the endpoint, then the answers' quality, then validity and
# evidence, then the generator's health, then the SLOs, then flags that never fail a run.
CAUSE_ORDER: dict[str, int] = {"endpoint": 0, "quality": 1, "validity": 2, "health": 3, "slo": 4, "tokens": 5}


@dataclass(frozen=True, slots=True)
class ValidityRules:
    """What makes a run valid, and the generator-health and token-agreement thresholds."""

    min_duration_s: float = 0.0
    min_queries: int = 0
    max_schedule_lag_p99_ms: float = 50.0
    max_cpu_percent: float = 90.0
    # A closed loop of one-request units must hold this share of its streams in flight on average
    # (a generator that cannot keep them open measures a lighter load than asked).
    min_streams_held: float = 0.9
    max_token_mismatch: float = 0.01
    confidence: float = es.DEFAULT_CONFIDENCE
    generator_health: GeneratorHealth = "fail"  # "warn": the health checks are non-blocking
    # A smoke run (--smoke): the minimum duration and query count, and the early-stopping evidence,
    # are still checked and reported, but do not block; every output says the result is not a
    # compliant one (docs/ci.md).
    smoke: bool = False


# The check that fails a run that did not end as planned (a signal, a lost worker, a full disk): an
# incomplete run proves nothing, whatever its partial figures say (docs/durability.md).
COMPLETE_RUN = "complete_run"
# The check that fails a run whose tokens mostly arrived merged (metrics/delivery.py): its ITL and TPOT
# time a proxy's buffer, not the server.
MERGED_DELIVERY = "merged_delivery"
# The check that names rate limiting as the endpoint's failure: at least this share of the requests, and
# half of the failed ones, answered 429 (docs/reliability.md, "Rate limits").
RATE_LIMITED = "rate_limited"
RATE_LIMITED_SHARE = 0.05


# MLPerf Inference Server scenario: 600 s minimum duration.
MLPERF_SERVER = ValidityRules(min_duration_s=600.0)


@dataclass(slots=True)
class Check:
    """One judged condition. ``blocking=False`` checks are reported but never change the status."""

    name: str
    passed: bool
    detail: str
    kind: CheckKind
    value: float | None = None
    limit: float | None = None
    blocking: bool = True
    # What to do about a failure (``--duration 600s``), said after the reason; not part of run.json.
    fix: str = ""


class CheckLike(Protocol):
    """What a headline needs of a check: a verdict's ``Check`` or run.json's."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def passed(self) -> bool: ...
    @property
    def blocking(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ExtraCheck:
    """A check the verdict does not make itself (a run.json provider's, e.g. a failing replica), with the
    sentence its failure gives in the verdict's reasons."""

    check: Check
    reason: str


@dataclass(slots=True)
class Verdict:
    """The status, every check made, and one human-readable reason per failed or flagged check."""

    status: Status
    checks: list[Check] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 pass, 10 SLO missed, 11 run invalid, 12 error rate over limit, 13 quality (see EXIT_CODES)."""
        return EXIT_CODES[self.status]

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form."""
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "reasons": list(self.reasons),
            "checks": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "passed": c.passed,
                    "blocking": c.blocking,
                    "value": c.value,
                    "limit": c.limit,
                    "detail": c.detail,
                }
                for c in self.checks
            ],
        }


def _complete_check(incomplete: str) -> Check:
    """The failed check of a run that did not end as planned (made only for one)."""
    return Check(COMPLETE_RUN, False, incomplete, "validity", fix="run it again to the end")


def _get(d: Mapping[str, Any], *path: str) -> Any:
    cur: Any = d
    for p in path:
        if not isinstance(cur, Mapping) or p not in cur:
            return None
        cur = cur[p]
    return cur


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:g}"


def _pkey(pct: float) -> str:
    return f"p{pct:g}".replace(".", "_")


def _validity_checks(metrics: Mapping[str, Any], rules: ValidityRules) -> list[Check]:
    duration = float(_get(metrics, "window", "duration_s") or 0.0)
    queries = int(_get(metrics, "requests", "completed") or 0)
    smoke = " (smoke run: reported, not applied)" if rules.smoke else ""
    not_a_result = ", or --smoke for a check that is not a result"
    return [
        Check(
            "min_duration",
            duration >= rules.min_duration_s,
            f"ran {duration:g} s, need ≥ {rules.min_duration_s:g} s{smoke}",
            "validity",
            duration,
            rules.min_duration_s,
            blocking=not rules.smoke,
            fix=f"--duration {math.ceil(rules.min_duration_s)}s or longer{not_a_result}",
        ),
        Check(
            "min_queries",
            queries >= rules.min_queries,
            f"completed {queries} queries, need ≥ {rules.min_queries}{smoke}",
            "validity",
            queries,
            rules.min_queries,
            blocking=not rules.smoke,
            fix=_more_requests(rules.min_queries, queries, metrics) + not_a_result,
        ),
    ]


def _health_checks(
    metrics: Mapping[str, Any], health: Mapping[str, Any], rules: ValidityRules
) -> list[Check]:
    out: list[Check] = []
    blocking = rules.generator_health == "fail"
    lag = health.get("schedule_lag_p99_ms")
    if lag is None:
        lag = _get(metrics, "latency_ms", "schedule_lag", "p99")
    if lag is not None:
        ok = lag <= rules.max_schedule_lag_p99_ms
        startup = health.get("startup_s")
        where = f" (steady state: the first {startup:g} s left out)" if startup else ""
        out.append(
            Check(
                "schedule_lag_p99",
                ok,
                f"schedule lag p99 {lag:g} ms {'≤' if ok else '>'} {rules.max_schedule_lag_p99_ms:g} ms{where}",
                "health",
                float(lag),
                rules.max_schedule_lag_p99_ms,
                blocking=blocking,
                fix=HEALTH_FIX,
            )
        )
    # The generator's sustained CPU use (the caller passes e.g. the 90th percentile of per-second samples).
    cpu = health.get("cpu_percent", health.get("cpu_max_percent"))
    if cpu is not None:
        ok = cpu <= rules.max_cpu_percent
        out.append(
            Check(
                "generator_cpu",
                ok,
                f"generator CPU {cpu:g} % of "
                + (
                    "each core its processes on this host share"
                    if health.get("cpu_basis") == "host"
                    else "a core"
                )
                + f" {'≤' if ok else '>'} {rules.max_cpu_percent:g} %",
                "health",
                float(cpu),
                rules.max_cpu_percent,
                blocking=blocking,
                fix=HEALTH_FIX,
            )
        )
    asked, held = health.get("streams_asked"), health.get("mean_in_flight")
    if asked and held is not None:
        ok = held >= rules.min_streams_held * asked
        out.append(
            Check(
                "streams_held",
                ok,
                f"streams in flight {held:,.0f} of {asked:,} asked on average "
                f"({held / asked:.0%} {'≥' if ok else '<'} {rules.min_streams_held:.0%}) over the steady state",
                "health",
                float(held),
                rules.min_streams_held * asked,
                blocking=blocking,
                fix=HEALTH_FIX,
            )
        )
    return out


def _percentile_checks(
    slo: Slo,
    metrics: Mapping[str, Any],
    hist: HdrHistogram | None,
    confidence: float,
    smoke: bool = False,
    samples: LatencySamples | None = None,
) -> list[Check]:
    """The raw-percentile SLO check and its early-stopping check (histogram values are µs); ``smoke``:
    too little evidence is reported, not applied (a missed SLO still blocks). ``samples``: the exact
    values, used instead of the histogram for a metric they hold (LoadGen's rule on each sample)."""
    key = slo.key
    exact = samples if samples is not None and samples.count(slo.metric) else None
    n = (
        exact.count(slo.metric)
        if exact is not None
        else int(hist.get_total_count())
        if hist is not None
        else int(_get(metrics, "latency_ms", slo.metric, "count") or 0)
    )
    if exact is not None:
        raw = round((exact.percentile(slo.metric, slo.percentile) or 0) / 1000.0, 3)
    elif hist is not None and n:
        raw = round((hdr.value_at(hist, slo.percentile) or 0) / 1000.0, 3)
    else:
        raw = _get(metrics, "latency_ms", slo.metric, _pkey(slo.percentile))
    if not n or raw is None:
        return [
            Check(
                key,
                False,
                f"no {slo.metric} samples to judge {key} ≤ {_fmt(slo.limit_ms)} ms",
                "validity",
                None,
                slo.limit_ms,
            )
        ]
    raw_ok = raw <= slo.limit_ms
    if hist is None and exact is None:
        return [
            Check(
                key,
                raw_ok,
                f"p{slo.percentile:g} {raw:g} ms {'≤' if raw_ok else '>'} {slo.limit_ms:g} ms",
                "slo",
                float(raw),
                slo.limit_ms,
            ),
            Check(
                f"early_stopping.{key}",
                False,
                f"no {slo.metric} histogram: early stopping could not be applied, not enough evidence",
                "validity",
                None,
                None,
                blocking=raw_ok,
            ),
        ]
    if exact is not None:
        est_us: float | None = exact.estimate(slo.metric, slo.p, confidence)
        over = exact.count_above(slo.metric, slo.limit_ms * 1000.0)
    else:
        assert hist is not None
        est_us = es.percentile_estimate_from_histogram(hist, slo.p, confidence)
        over = es.count_above(hist, slo.limit_ms * 1000.0)
    est = None if est_us is None else round(est_us / 1000.0, 3)
    est_txt = (
        f"early-stopping estimate {est:g} ms"
        if est is not None
        else f"no early-stopping estimate (needs ≥ {es.min_queries_for_percentile(slo.p, confidence)} samples)"
    )
    need = es.find_min_passing(over, slo.p, confidence) + over
    es_ok = n >= need
    return [
        Check(
            key,
            raw_ok,
            f"p{slo.percentile:g} {raw:g} ms {'≤' if raw_ok else '>'} {slo.limit_ms:g} ms; {est_txt}; n={n}",
            "slo",
            float(raw),
            slo.limit_ms,
        ),
        Check(
            f"early_stopping.{key}",
            es_ok,
            f"{over} of {n} samples over {slo.limit_ms:g} ms; early stopping at {confidence:g} confidence "
            f"needs ≥ {need} samples"
            + ("" if es_ok else f", have {n}: not enough evidence; {_more_requests(need, n, metrics)}")
            + (" (smoke run: reported, not applied)" if smoke and not es_ok else ""),
            "validity",
            float(n),
            float(need),
            # When the raw percentile already misses, the missed SLO is the result, not the evidence.
            blocking=raw_ok and not smoke,
            fix="" if es_ok else _more_requests(need, n, metrics),
        ),
    ]


def conversation_checks(
    slo: ConversationSlo,
    judged: int,
    good: int,
    confidence: float = es.DEFAULT_CONFIDENCE,
    smoke: bool = False,
) -> list[ExtraCheck]:
    """The conversation attainment SLO and its early-stopping check: a conversation that is not good is
    a sample over the limit of a percentile at ``slo.limit`` (LoadGen's rule on the conversations'
    count: it passes with n ≥ find_min_passing(t, p) + t, t the conversations not good)."""
    key = slo.key
    want = f"≥ {slo.limit * 100:g} %"
    if not judged:
        check = Check(key, False, f"no conversation ended to judge {key} {want}", "validity", None, slo.limit)
        return [ExtraCheck(check, _reason(check))]
    share = good / judged
    ok = share >= slo.limit
    raw = Check(
        key,
        ok,
        f"{share * 100:.2f} % of {judged} conversations had every call within the SLOs "
        f"({'meets' if ok else 'under'} {want})",
        "slo",
        round(share, 4),
        slo.limit,
    )
    over = judged - good
    need = es.find_min_passing(over, slo.limit, confidence) + over
    es_ok = judged >= need
    more = f"a longer run (≥ {need} judged conversations)"
    stop = Check(
        f"early_stopping.{key}",
        es_ok,
        f"{over} of {judged} conversations not good; early stopping at {confidence:g} confidence needs "
        f"≥ {need} conversations"
        + ("" if es_ok else f", have {judged}: not enough evidence")
        + (" (smoke run: reported, not applied)" if smoke and not es_ok else ""),
        "validity",
        float(judged),
        float(need),
        blocking=ok and not smoke,
        fix="" if es_ok else more,
    )
    return [ExtraCheck(c, _reason(c)) for c in (raw, stop)]


def describe_judging(slos: Sequence[AnySlo], rate: float | None, judged_s: float) -> list[str]:
    """The start-up lines: what the run is judged against, as parsed (``ttft_p99 ≤ 2000 ms``), and,
    for an open loop too short to prove a percentile, how long it would need to run."""
    parts = [f"{s.key} ≤ {s.limit_ms:g} ms" for s in slos if isinstance(s, Slo)]
    errors = [s for s in slos if isinstance(s, ErrorRateSlo)]
    limit = errors[0].limit if errors else DEFAULT_ERROR_RATE
    parts.append(f"error rate ≤ {limit * 100:g} %" + ("" if errors else " (the default)"))
    lines = [f"judged against: {', '.join(parts)}"]
    if rate and judged_s > 0:
        for s in slos:
            if isinstance(s, Slo):
                need = es.server_min_queries(s.p)
                if rate * judged_s < need:
                    lines.append(
                        f"warning: {s.key} needs ≥ {need} requests to be proven (early stopping); "
                        f"{rate:g} req/s for {judged_s:g} s judged gives about {rate * judged_s:.0f}: "
                        f"run ≥ {need / rate:.0f} s (--duration), or --smoke for a check that is not a result"
                    )
                    break
    return lines


def _more_requests(need: int, have: int, metrics: Mapping[str, Any]) -> str:
    """What to do about too little evidence: ``run ≥ 459 requests (about 115 s at this run's 4.0
    req/s: --duration 115s)``."""
    duration = float(_get(metrics, "window", "duration_s") or 0.0)
    if duration <= 0 or have <= 0:
        return f"run ≥ {need} requests"
    rate = have / duration  # this metric's samples per second
    seconds = math.ceil(need / rate)
    return f"run ≥ {need} requests (about {seconds} s at this run's {rate:.1f} req/s: --duration {seconds}s)"


def _endpoint_checks(
    metrics: Mapping[str, Any],
    error_slo: ErrorRateSlo | None,
    failure: str | None,
    stopped_early: str | None,
    load: OfferedLoad,
) -> list[Check]:
    """Did the endpoint work? Rate limited, stopped early for failing wholesale, no successful request,
    error rate."""
    req = metrics.get("requests") or {}
    ok = int(req.get("ok") or 0)
    failed = int(req.get("failed") or 0)
    counted = ok + failed
    failure = failure or commonest_from_metrics(metrics)
    out: list[Check] = []
    limited = _rate_limit_check(metrics, error_slo, load)
    if limited is not None:
        out.append(limited)
    if stopped_early:
        out.append(Check("stopped_early", False, stopped_early, "endpoint", float(failed), None))
    if counted == 0:  # nothing reached an answer or a failure: the endpoint was not tried, nothing to judge
        detail = "no request finished: nothing to judge (none was sent, or the generator cancelled every one)"
        out.append(Check("successful_requests", False, detail, "validity", 0.0, 1.0))
        return out
    out.append(
        Check(
            "successful_requests",
            ok > 0,
            f"{ok} of {counted} requests succeeded"
            if ok
            else f"no successful requests: {failing_text(req, failure)}",
            "endpoint",
            float(ok),
            1.0,
        )
    )
    limit = error_slo.limit if error_slo is not None else DEFAULT_ERROR_RATE
    source = (
        "" if error_slo is not None else " (the default limit: set error_rate in the profile's slos or --slo)"
    )
    rate = float(req.get("error_rate") or 0.0)
    passed = rate <= limit
    detail = f"error rate {pct(rate)} {'≤' if passed else '>'} {limit * 100:g} %{source}"
    if failed:
        detail += f": {failed} of {counted} requests failed" + (f", most often {failure}" if failure else "")
    out.append(Check("error_rate", passed, detail, "endpoint", rate, limit))
    return out


@dataclass(frozen=True, slots=True)
class OfferedLoad:
    """What the run asked of the endpoint, for the rate-limit reason: the open-loop rate (None: closed
    loop) and the retries of a 429 (0: none)."""

    rate: float | None = None
    retries: int = 0


def _rate_limit_check(
    metrics: Mapping[str, Any], error_slo: ErrorRateSlo | None, load: OfferedLoad
) -> Check | None:
    """The failed ``rate_limited`` check when at least RATE_LIMITED_SHARE of the requests, and at least
    half of the failed ones, got 429 and the endpoint failed (its error rate over its limit, or not one
    request succeeded); None otherwise. Its detail: the share, the achieved rate (ok requests a second)
    against the offered one."""
    req = metrics.get("requests") or {}
    counted = int(req.get("ok") or 0) + int(req.get("failed") or 0)
    limited = int((req.get("by_outcome") or {}).get("http_429") or 0)
    failed = int(req.get("failed") or 0)
    limit = error_slo.limit if error_slo is not None else DEFAULT_ERROR_RATE
    if (
        not counted
        or limited < RATE_LIMITED_SHARE * counted
        or 2 * limited < failed  # 429 is not the endpoint's main failure: the error rate says the rest
        or (float(req.get("error_rate") or 0.0) <= limit and int(req.get("ok") or 0) > 0)
    ):
        return None
    share = limited / counted
    duration = float(_get(metrics, "window", "duration_s") or 0.0)
    achieved = f"{int(req.get('ok') or 0) / duration:.3g} ok req/s" if duration > 0 else "n/a"
    offered = (
        f"{load.rate:g} req/s offered"
        if load.rate
        else f"{counted / duration:.3g} req/s sent (closed loop)"
        if duration > 0
        else "n/a offered"
    )
    honoured = (
        f"Retry-After honoured, up to {load.retries} retr{'y' if load.retries == 1 else 'ies'}"
        if load.retries
        else "no retries: --retries N waits as Retry-After asks"
    )
    return Check(
        RATE_LIMITED,
        False,
        f"{pct(share)} of {counted} requests got 429 ({honoured}); achieved {achieved} against {offered}",
        "endpoint",
        share,
        RATE_LIMITED_SHARE,
        fix="lower the offered rate or concurrency to the endpoint's quota, or raise the quota",
    )


def _delivery_checks(
    metrics: Mapping[str, Any], slos: Sequence[AnySlo], behind: Check | None = None
) -> list[Check]:
    """When most streams arrived merged (metrics/delivery.py): the failed ``merged_delivery`` check,
    and each ITL or TPOT SLO as not measurable (neither passed nor missed on a meaningless value).
    ``behind``: a failed generator-health check (blocking or not), named as the likelier cause."""
    itl_merged = metrics.get("itl_merged") or {}
    if behind is None:
        text, fix = delivery.diagnosis(itl_merged), ""
    else:
        text, fix = delivery.generator_diagnosis(itl_merged, behind.detail), delivery.GENERATOR_FIX
    if text is None:
        return []
    share = delivery.merged_share(itl_merged)
    out = [Check(MERGED_DELIVERY, False, text, "validity", share, delivery.RUN_SHARE, fix=fix)]
    for s in slos:
        if isinstance(s, Slo) and s.metric in delivery.UNMEASURABLE:
            out.append(Check(s.key, False, delivery.not_measurable(s.metric), "validity", None, s.limit_ms))
    return out


def _token_check(metrics: Mapping[str, Any], rules: ValidityRules) -> Check | None:
    reports = int(_get(metrics, "tokens", "usage_reports") or 0)
    if not reports:
        return None
    output = int(_get(metrics, "tokens", "mismatched_requests") or 0)
    inputs = int(_get(metrics, "tokens", "input_mismatched_requests") or 0)
    share = max(output, inputs) / reports
    ok = share <= rules.max_token_mismatch
    return Check(
        "token_agreement",
        ok,
        f"{_disagreeing(output, inputs, reports)} ({share * 100:.3g} %) disagree with the server's usage "
        f"count ({'≤' if ok else '>'} {rules.max_token_mismatch * 100:g} %)",
        "tokens",
        share,
        rules.max_token_mismatch,
        blocking=False,
    )


def _disagreeing(output: int, inputs: int, reports: int) -> str:
    """Which counts disagree: 'input: 3, output: 0 of 29 requests'."""
    return f"input: {inputs}, output: {output} of {reports} requests"


def quality_reason(detail: str) -> str:
    """The verdict's sentence for a failed quality gate."""
    return f"quality gate failed: {detail}"


def _with_fix(text: str, c: Check) -> str:
    return f"{text}; fix: {c.fix}" if c.fix and not c.passed else text


def _reason(c: Check) -> str:
    if c.kind == "quality":
        return quality_reason(c.detail)
    if c.kind == "endpoint":
        if c.name == RATE_LIMITED:
            return _with_fix(f"rate limited: {c.detail}", c)
        if c.name == "stopped_early":
            return f"stopped early: {c.detail}"
        if c.name == "error_rate":
            return f"error rate over limit: {c.detail}"
        return f"endpoint failing: {c.detail}"
    if c.kind == "health":
        if c.blocking:
            return _with_fix(f"invalid: {OVERLOADED} ({c.detail})", c)
        if c.name in GENERATOR_HEALTH_CHECKS:
            return f"warning: {OVERLOADED} ({c.detail}); not blocking (judging.generator_health: warn)"
        return f"flagged: {c.detail} (does not fail the run)"
    if c.kind == "tokens":
        return f"flagged: client and server token counts disagree: {c.detail} (does not fail the run)"
    if c.name.startswith("early_stopping."):
        slo_key = c.name.split(".", 1)[1]
        if c.blocking:
            return f"invalid: {slo_key} meets its limit at the raw percentile but not enough evidence: {c.detail}"
        return f"note: early stopping for {slo_key} also fails: {c.detail}"
    if c.name == MERGED_DELIVERY:
        return _with_fix(c.detail, c)
    if c.kind == "validity":
        return _with_fix(f"invalid: {c.name}: {c.detail}", c)
    return f"SLO missed: {c.name}: {c.detail}"


def _status_of(c: Check) -> Status:
    if c.kind == "endpoint":
        return "error_rate"
    if c.kind == "quality":
        return "quality_failed"
    if c.kind in ("validity", "health"):
        return "invalid"
    return "slo_missed"


def health_warnings(verdict: Verdict) -> list[str]:
    """The failed generator-health checks that did not block the run (judging.generator_health: warn)."""
    return [
        _reason(c)
        for c in verdict.checks
        if c.name in GENERATOR_HEALTH_CHECKS and c.kind == "health" and not c.passed and not c.blocking
    ]


def _evidence_reason(group: list[Check]) -> str:
    """One sentence for every percentile SLO met at its raw percentile but without the early-stopping
    evidence: which SLOs, the samples there are and need, and the one fix (the largest need)."""
    keys = ", ".join(c.name.split(".", 1)[1] for c in group)
    have = min(int(c.value or 0) for c in group)
    needs = sorted({int(c.limit or 0) for c in group})
    need_txt = (
        f"≥ {needs[0]}" if len(needs) == 1 else "≥ " + " to ".join(str(n) for n in (needs[0], needs[-1]))
    )
    worst = max(group, key=lambda c: c.limit or 0)
    smoke = not any(c.blocking for c in group)
    head = "note (smoke run: reported, not applied)" if smoke else "invalid"
    return _with_fix(
        f"{head}: not enough evidence for {keys} (met at the raw percentile): {have} samples, "
        f"early stopping needs {need_txt}",
        worst,
    )


def _grouped_reasons(ranked: list[Check]) -> list[str]:
    """One sentence per failed check, except the early-stopping checks: one sentence for those of
    SLOs met at the raw percentile, none for those of missed SLOs (the miss is the result)."""
    missed = {c.name for c in ranked if c.kind == "slo"}
    evidence = [
        c
        for c in ranked
        if c.name.startswith("early_stopping.") and c.value is not None and c.limit is not None
    ]
    out: list[str] = []
    done = False
    for c in ranked:
        if c not in evidence:
            out.append(_reason(c))
            continue
        group = [e for e in evidence if e.name.split(".", 1)[1] not in missed]
        if group and not done:
            out.append(_evidence_reason(group))
        done = True
    return out


def _reasons(failed: list[Check]) -> list[str]:
    """One short sentence per failed check with its fix, by cause (CAUSE_ORDER), blocking ones first;
    the early-stopping checks in one sentence (``_grouped_reasons``).

    When the endpoint failed wholesale (stopped early, or no request succeeded) that is the one cause:
    its first sentence leads, and every other failed check is named on one line as a consequence.
    """
    rank = _cause_rank(failed)
    ranked = sorted(failed, key=lambda c: (not c.blocking, rank(c)))
    dead = next((c for c in ranked if c.name in ("stopped_early", "successful_requests")), None)
    if dead is None:
        return _grouped_reasons(ranked)
    others = [c.name for c in ranked if c.kind != "endpoint" and c.blocking]
    out = [_reason(c) for c in ranked if c.name == RATE_LIMITED] + [_reason(dead)]
    if others:
        out.append(f"also failed, as consequences of the failing endpoint: {', '.join(others)}")
    return out


def _cause_rank(failed: Sequence[CheckLike]) -> Callable[[CheckLike], float]:
    """A failed check's place among the causes (CAUSE_ORDER): a generator that was overloaded (a failed
    blocking health check) comes before the delivery diagnosis and the SLOs it makes not measurable,
    since a client that falls behind reads events together too."""
    overloaded = any(c.kind == "health" and c.blocking for c in failed)

    def rank(c: CheckLike) -> float:
        if overloaded and _of_delivery(c):
            return CAUSE_ORDER["health"] + 0.5
        return CAUSE_ORDER.get(c.kind, 9)

    return rank


def _of_delivery(c: CheckLike) -> bool:
    """Whether ``c`` is the delivery diagnosis or an ITL or TPOT SLO it made not measurable."""
    return c.name == MERGED_DELIVERY or (
        c.kind == "validity" and c.name.split("_", 1)[0] in delivery.UNMEASURABLE
    )


def _cause_phrase(c: CheckLike) -> str:
    """A failed blocking check in a few words, for the headline."""
    if c.kind == "endpoint":
        return {
            RATE_LIMITED: "rate limited (HTTP 429)",
            "stopped_early": "stopped early: endpoint failing",
            "error_rate": "error rate over limit",
        }.get(c.name, "no successful request")
    if c.name == MERGED_DELIVERY:
        return "tokens arrived merged (a buffering proxy?)"
    if c.name == "agentic_accuracy":  # run/providers.AgenticAccuracyProvider
        return "agentic accuracy below target"
    if c.kind == "quality":
        return "quality gate failed"
    if c.kind == "health":
        return "the load generator was overloaded"
    if c.name == COMPLETE_RUN:
        return "run incomplete"
    if c.name in ("min_duration", "min_queries"):
        return "too short"
    if c.name.startswith("early_stopping."):
        return "too few samples to prove {}"
    if c.kind == "validity":
        return "nothing to judge {}" if c.name != "successful_requests" else "no request finished"
    return "{} over the limit"


def headline(status: str, checks: Sequence[CheckLike]) -> str:
    """The verdict in a few words: ``too short; too few samples to prove ttft_p99, tpot_p99``, the causes
    of the failed blocking checks in cause order (a failing endpoint alone when it failed wholesale)."""
    failing = [c for c in checks if c.blocking and not c.passed]
    failed = sorted(failing, key=_cause_rank(failing))
    if not failed:
        flagged = sum(1 for c in checks if not c.passed)
        return "every check passed" + (f"; {flagged} flagged" if flagged else "")
    if any(c.name in ("stopped_early", "successful_requests") and c.kind == "endpoint" for c in failed):
        failed = [c for c in failed if c.kind == "endpoint"]
    merged = any(c.name == MERGED_DELIVERY for c in failed)
    behind = any(c.name in GENERATOR_HEALTH_CHECKS and not c.passed for c in checks)  # a warning too
    phrases: dict[str, list[str]] = {}
    for c in failed:
        phrase = _cause_phrase(c)
        if c.name == MERGED_DELIVERY and behind:
            phrase = "tokens read merged (the load generator fell behind)"
        if merged and _of_delivery(c) and c.name != MERGED_DELIVERY:
            phrase = "{} not measurable"
        phrases.setdefault(phrase, []).append(c.name.split(".", 1)[-1])
    return "; ".join(p.format(", ".join(names)) if "{}" in p else p for p, names in phrases.items())


def judge(
    metrics: Mapping[str, Any],
    histograms: Mapping[str, HdrHistogram] | None,
    slos: Iterable[AnySlo] | Mapping[str, Any] | str | None,
    validity: ValidityRules | None = None,
    health: Mapping[str, Any] | None = None,
    *,
    failure: str | None = None,
    stopped_early: str | None = None,
    extra_checks: Sequence[ExtraCheck] = (),
    notes: Sequence[str] = (),
    samples: LatencySamples | None = None,
    incomplete: str | None = None,
    load: OfferedLoad | None = None,
) -> Verdict:
    """Judge a run from its run.json ``metrics`` dict and its (µs) histograms.

    The endpoint is judged first: at least one successful request, and the error rate within the
    ``error_rate`` SLO (DEFAULT_ERROR_RATE when none is given). ``failure`` names the commonest failed
    class and message (``http_4xx: HTTP 400: ...``, from the record log; else taken from ``metrics``);
    ``stopped_early`` is the cause when the run was stopped for failing wholesale (always a failure).

    Percentile SLOs use ``samples`` (the record log's exact values) for the metrics they hold, else the
    histogram when given (any percentile, LoadGen's rank), else ``metrics['latency_ms']``.
    Early stopping (LoadGen Server, per metric): n = the metric's sample count, t = samples over
    the limit; it passes when n ≥ find_min_passing(t, p) + t. A percentile meeting its limit
    without that evidence makes the run invalid.

    A run whose streams mostly arrived merged (metrics/delivery.py) fails ``merged_delivery``, and its
    ITL and TPOT SLOs are not measurable (failed, without a value). At least RATE_LIMITED_SHARE of the
    requests answered 429 with the error rate over its limit: the ``rate_limited`` check leads, with the
    achieved rate against ``load``'s offered one.

    ``incomplete``: why the run did not end as planned (``interrupted: SIGTERM``, ``incomplete: disk full
    at …``); the run is then never a pass, and that sentence is its first reason.

    ``extra_checks`` follow the verdict's own checks (a blocking one that fails sets the status like
    they do); the reasons of those that fail follow the verdict's own reasons. Then each of ``notes``
    (run.json's notes) not already a reason.
    """
    rules = validity or ValidityRules()
    hists = histograms or {}
    parsed = parse_slos(slos) if isinstance(slos, str | Mapping) or slos is None else list(slos)
    error_slo = next((s for s in parsed if isinstance(s, ErrorRateSlo)), None)
    health_checks = _health_checks(metrics, health or {}, rules)
    behind = next((c for c in health_checks if c.name in GENERATOR_HEALTH_CHECKS and not c.passed), None)
    delivery_checks = _delivery_checks(metrics, parsed, behind)
    unmeasurable = {c.name for c in delivery_checks}
    checks: list[Check] = [
        *_endpoint_checks(metrics, error_slo, failure, stopped_early, load or OfferedLoad()),
        *delivery_checks,
        *_validity_checks(metrics, rules),
        *health_checks,
        *([_complete_check(incomplete)] if incomplete is not None else []),
    ]
    for s in parsed:
        if isinstance(s, Slo) and s.key not in unmeasurable:
            checks.extend(
                _percentile_checks(s, metrics, hists.get(s.metric), rules.confidence, rules.smoke, samples)
            )
    tok = _token_check(metrics, rules)
    if tok is not None:
        checks.append(tok)
    own_failed = [c for c in checks if not c.passed and c.name != COMPLETE_RUN]
    reasons = _reasons(own_failed)
    # A blocking extra check of a cause ranked before validity (the quality gate) follows the endpoint's
    # reasons; the other extras follow the verdict's own reasons.
    lead = [
        e
        for e in extra_checks
        if not e.check.passed and e.check.blocking and CAUSE_ORDER[e.check.kind] < CAUSE_ORDER["validity"]
    ]
    at = sum(1 for c in own_failed if c.kind == "endpoint" and c.blocking)
    reasons[at:at] = [e.reason for e in lead]
    reasons += [e.reason for e in extra_checks if not e.check.passed and e not in lead]
    if incomplete is not None:  # what happened to the run comes before what its partial figures say
        reasons.insert(0, incomplete)
    # The run's notes carry the delivery diagnosis a proxy would explain; the check's own names the generator.
    told = {delivery.diagnosis(metrics.get("itl_merged") or {})} if behind is not None else set()
    for note in notes:
        if note not in reasons and note not in told:
            reasons.append(note)
    checks += [e.check for e in extra_checks]
    statuses = {_status_of(c) for c in checks if c.blocking and not c.passed}
    status: Status = next((s for s in PRECEDENCE if s in statuses), "pass")
    return Verdict(status, checks, reasons)


def junit_xml(verdict: Verdict, suite_name: str = "loadtest", time_s: float = 0.0) -> str:
    """JUnit XML: testsuites > testsuite > one testcase per check (classname ``<suite>.<kind>``).

    A failed blocking check is a ``<failure>`` (the endpoint missed: an SLO, the error rate, the
    quality gate), or an ``<error>`` when it makes the run invalid (too short, too few samples to prove
    a percentile, an overloaded generator): the measurement proves nothing either way, which a CI
    system tells from a miss. A failed non-blocking (flagged) check passes with its warning in
    ``<system-out>``. ``skipped`` is always 0.
    """
    blocking_failures = [c for c in verdict.checks if c.blocking and not c.passed]
    invalid = [c for c in blocking_failures if _status_of(c) == "invalid"]
    counts = {
        "tests": str(len(verdict.checks)),
        "failures": str(len(blocking_failures) - len(invalid)),
        "errors": str(len(invalid)),
        "skipped": "0",
        "time": f"{time_s:.3f}",
    }
    root = ET.Element("testsuites", {"name": suite_name, **counts})
    suite = ET.SubElement(root, "testsuite", {"name": suite_name, **counts})
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", {"name": "status", "value": verdict.status})
    ET.SubElement(props, "property", {"name": "exit_code", "value": str(verdict.exit_code)})
    for c in verdict.checks:
        case = ET.SubElement(
            suite, "testcase", {"name": c.name, "classname": f"{suite_name}.{c.kind}", "time": "0"}
        )
        if not c.passed and c.blocking:
            tag = "error" if _status_of(c) == "invalid" else "failure"
            fail = ET.SubElement(case, tag, {"message": _reason(c), "type": _status_of(c)})
            fail.text = c.detail
        elif not c.passed:
            out = ET.SubElement(case, "system-out")
            out.text = _reason(c)
        else:
            out = ET.SubElement(case, "system-out")
            out.text = c.detail
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
