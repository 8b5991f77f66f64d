"""Locust web UI extension: a run per start, live LLM metrics (tab, /llm, /llm/stats), results on stop."""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent
import msgspec
from flask import Response, jsonify, request, send_file
from gevent.event import Event

from loadtest.contracts.run_document import Verdict, read_run_document
from loadtest.locust.settings import RunSettings
from loadtest.metrics.hdr import fast_percentiles
from loadtest.metrics.recorder import Aggregate
from loadtest.metrics.slo import AnySlo, ErrorRateSlo, QualitySlo, merge_slos
from loadtest.profile.loader import resolve_profile_path
from loadtest.profile.schema import Profile
from loadtest.workload.salt import new_run_nonce

if TYPE_CHECKING:  # importing locust monkey-patches the process: only where a run happens
    from locust.env import Environment
    from werkzeug.wrappers import Response as WerkzeugResponse

    from loadtest.locust.context import RunContext
    from loadtest.locust.runtime import RunOutcome

log = logging.getLogger("loadtest")

TAB_KEY = "llm"
LATENCIES: tuple[tuple[str, str], ...] = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E"))
RECENT_S = 5  # output tokens/s over the last few complete seconds
STATS_CACHE_S = 0.5

# A finalizer writes run.json, report.html and the verdict; it returns the exit code.
Finalizer = Callable[[RunSettings, Profile, Any, "RunOutcome", Path], int]


@dataclass
class UiRun:
    """One run started from the UI: its context, folder and, once stopped, verdict and report."""

    ctx: RunContext
    settings: RunSettings
    out: Path
    started_epoch: float
    phase: str = "running"  # running → draining → finalizing → done (or failed)
    interrupted_reason: str | None = None
    verdict: Verdict | None = None
    report: Path | None = None
    error: str | None = None
    done: Event = field(default_factory=Event)


def new_run_dir(root: Path, profile_name: str) -> Path:
    """A fresh ``<root>/<timestamp>-<profile>`` folder (suffixed when one already exists)."""
    base = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile_name}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    out.mkdir(parents=True)
    return out


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v / 1000.0, 3)


def request_counts(agg: Aggregate) -> dict[str, Any]:
    """ok / failed / cancelled and the error rate (cancelled requests excluded), as run.json counts them."""
    completed = sum(agg.outcomes.values())
    ok = int(agg.outcomes.get("ok", 0))
    cancelled = int(agg.outcomes.get("cancelled", 0))
    counted = completed - cancelled
    return {
        "completed": completed,
        "ok": ok,
        "failed": counted - ok,
        "cancelled": cancelled,
        "error_rate": round((counted - ok) / counted, 6) if counted else 0.0,
    }


def slo_rows(slos: list[AnySlo], agg: Aggregate, requests: dict[str, Any]) -> list[dict[str, Any]]:
    """Each SLO with its measured value so far and whether it is met (no early-stopping evidence here)."""
    rows = []
    for s in slos:
        if isinstance(s, ErrorRateSlo):
            value = requests["error_rate"]
            counted = requests["completed"] - requests["cancelled"]
            met = None if not counted else value <= s.limit
            rows.append({"key": s.key, "limit": s.limit, "value": value, "unit": "fraction", "met": met})
            continue
        if isinstance(s, QualitySlo):  # judged from the record log at the end of the run
            rows.append({"key": s.key, "limit": s.limit, "value": None, "unit": "fraction", "met": None})
            continue
        (us,) = fast_percentiles(agg.hists[s.metric], (s.percentile,))
        value = _ms(us)
        met = None if value is None else value <= s.limit_ms
        rows.append({"key": s.key, "limit": s.limit_ms, "value": value, "unit": "ms", "met": met})
    return rows


def recent_output_tps(agg: Aggregate, now: float, seconds: int = RECENT_S) -> float:
    """Output tokens/s over the last ``seconds`` complete seconds of the run (counted when requests end)."""
    end = int(now)
    start = max(end - seconds, int(agg.first_scheduled or end))
    if end <= start:
        return 0.0
    total = sum(agg.series[s][3] for s in range(start, end) if s in agg.series)
    return round(total / (end - start), 3)


def scope_stats(agg: Aggregate, now: float) -> dict[str, Any]:
    """Latency percentiles, throughput, request counts and error classes of one aggregate."""
    req = request_counts(agg)
    latency = {}
    for key, _ in LATENCIES:
        hist = agg.hists[key]
        p50, p90, p99 = (_ms(v) for v in fast_percentiles(hist, (50.0, 90.0, 99.0)))
        latency[key] = {"p50": p50, "p90": p90, "p99": p99, "count": hist.get_total_count()}
    first, last = agg.first_scheduled, agg.last_done
    duration = (last - first) if first is not None and last is not None else 0.0
    out_tokens = agg.totals.get("output_tokens", 0)
    errors = [
        {"outcome": o, "count": int(n), "sample": (agg.error_samples.get(o) or [""])[0]}
        for o, n in sorted(agg.outcomes.items(), key=lambda kv: -kv[1])
        if o != "ok" and n
    ]
    judged, good = agg.totals.get("slo_judged", 0), agg.totals.get("slo_good", 0)
    goodput = {
        "judged": int(judged),
        "good": int(good),
        "attainment": round(good / judged, 4) if judged else None,
        "good_requests_per_s": round(good / duration, 4) if duration > 0 else 0.0,
        "good_output_tokens_per_s": round(agg.totals.get("slo_good_output_tokens", 0) / duration, 3)
        if duration > 0
        else 0.0,
    }
    return {
        "latency_ms": latency,
        "goodput": goodput,
        "output_tokens_per_s_recent": recent_output_tps(agg, now),
        "output_tokens_per_s_avg": round(out_tokens / duration, 3) if duration > 0 else 0.0,
        "requests_per_s": round(req["ok"] / duration, 4) if duration > 0 else 0.0,
        "requests": req,
        "errors": errors,
    }


class LlmWebUi:
    """Owns the run of a UI process: a new RunContext per start, finalization on stop, the LLM views."""

    def __init__(
        self,
        env: Environment,
        base: RunSettings,
        profile: Profile,
        load_description: str,
        slos: list[AnySlo],
        reports_root: Path,
        finalize: Finalizer,
        drain_timeout_s: float = 10.0,
        on_start: Callable[[RunSettings], None] | None = None,
    ) -> None:
        self.env = env
        self.on_start = on_start  # e.g. start the endpoint's telemetry for this run
        self.base = base
        self.profile = profile
        self.load_description = load_description
        self.slos = slos
        self.reports_root = reports_root
        self.finalize = finalize
        self.drain_timeout_s = drain_timeout_s
        self.open_loop = profile.load.open_loop
        self.run: UiRun | None = None
        self.interrupt_reason: str | None = None  # set on SIGINT/SIGTERM: stop without draining
        self._cache: tuple[float, dict[str, Any]] | None = None
        env.events.test_start.add_listener(self._on_test_start)
        env.events.test_stopping.add_listener(self._on_test_stopping)
        env.events.test_stop.add_listener(self._on_test_stop)

    # ---- run lifecycle ---------------------------------------------------------------------
    def _on_test_start(self, environment: Environment, **_kw: Any) -> None:
        from loadtest.locust.context import RunContext

        chosen = getattr(environment.parsed_options, "llm_profile", None)
        base = self.base
        if chosen and chosen != base.profile_ref:  # the start form's profile choice
            base = dataclasses.replace(base, profile_ref=str(resolve_profile_path(chosen)))
        profile, _ = base.profile()
        if profile.name != self.profile.name:
            self.profile, self.load_description = profile, profile.load.describe()
            self.slos = merge_slos(profile.slos, base.slo)
        out = new_run_dir(self.reports_root, profile.name)
        # each start is its own run: its own run nonce (run_salt: per_run sends new prompts)
        settings = dataclasses.replace(base, out_dir=str(out), run_id=out.name, run_nonce=new_run_nonce())
        if environment.host:
            settings.host = environment.host  # the start form's host field
        ctx = RunContext(settings, 0, 1, "records.jsonl")
        ctx.env = environment
        environment.loadtest = ctx  # type: ignore[attr-defined]  # our context rides on locust's Environment
        self.run = UiRun(ctx=ctx, settings=settings, out=out, started_epoch=time.time())
        self._cache = None
        if self.on_start is not None:
            self.on_start(settings)
        log.warning("run %s started: writing %s/", out.name, out)

    def _on_test_stopping(self, environment: Environment, **_kw: Any) -> None:
        run = self.run
        if run is None or run.phase != "running":
            return
        run.ctx.stopping = True
        if self.interrupt_reason is None:
            run.phase = "draining"
            deadline = time.monotonic() + self.drain_timeout_s
            while run.ctx.in_flight > 0 and time.monotonic() < deadline:
                gevent.sleep(0.05)

    def _on_test_stop(self, environment: Environment, **_kw: Any) -> None:
        run = self.run
        if run is None or run.phase not in ("running", "draining"):
            return
        from loadtest.locust.runtime import RunOutcome

        run.phase = "finalizing"
        run.interrupted_reason = self.interrupt_reason
        run.ctx.close()
        outcome = RunOutcome(
            aggregates=run.ctx.recorder.result(),
            interrupted_reason=run.interrupted_reason,
            record_files=[run.ctx.log.path.name],
            records_written=run.ctx.log.count,
            started_epoch=run.started_epoch,
            ended_epoch=time.time(),
        )
        gevent.spawn(self._finalize, run, outcome)

    def _finalize(self, run: UiRun, outcome: RunOutcome) -> None:
        try:
            self.finalize(run.settings, run.ctx.profile, run.ctx.workload, outcome, run.out)
            run.verdict = read_run_document(run.out).verdict
            report = run.out / "report.html"
            run.report = report if report.exists() else None
            run.phase = "done"
        except Exception as e:  # the UI keeps serving; the error shows on the page
            log.exception("writing the results of %s failed", run.out)
            run.error, run.phase = f"{type(e).__name__}: {e}", "failed"
        finally:
            self._cache = None
            run.done.set()

    def wait_finalized(self, timeout: float) -> None:
        if self.run is not None and self.run.phase != "running":
            self.run.done.wait(timeout)

    # ---- numbers -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """What /llm/stats serves (cached for half a second)."""
        now = time.time()
        if self._cache is not None and now - self._cache[0] < STATS_CACHE_S:
            return self._cache[1]
        runner = self.env.runner
        run = self.run
        payload: dict[str, Any] = {
            "profile": {
                "name": self.profile.name,
                "load": self.load_description,
                "mode": "open" if self.open_loop else "closed",
                "slos": {s.key: getattr(s, "limit_ms", getattr(s, "limit", None)) for s in self.slos},
                "host": self.env.host or self.base.host,
                "model": self.base.model,
            },
            "state": runner.state if runner is not None else "missing",
            "run": None,
            "overall": None,
            "scenarios": {},
            "slos": [],
            "verdict": None,
            "report_url": None,
        }
        if run is not None:
            rec = run.ctx.recorder
            agg = rec.total  # flushes pending values
            overall = scope_stats(agg, now)
            payload["slos"] = slo_rows(self.slos, agg, overall["requests"])
            payload["overall"] = overall
            for name, track in sorted(rec.scenarios.items()):
                payload["scenarios"][name] = scope_stats(track.total, now)
            payload["run"] = {
                "id": run.out.name,
                "out_dir": str(run.out),
                "phase": run.phase,
                "in_flight": run.ctx.in_flight,
                "elapsed_s": round(now - run.started_epoch, 1),
                "interrupted_reason": run.interrupted_reason,
                "error": run.error,
            }
            if run.verdict is not None:
                payload["verdict"] = msgspec.to_builtins(run.verdict)  # JSON for the page
            if run.report is not None:
                payload["report_url"] = "/llm/report"
        self._cache = (now, payload)
        return payload

    def table_rows(self) -> list[dict[str, Any]]:
        """The rows of the React UI's extended tab (one flat table: section, metric, p50/p90/p99, value)."""
        st = self.stats()
        p = st["profile"]
        rows: list[dict[str, Any]] = [
            {"section": "profile", "metric": p["name"], "value": p["load"]},
            {
                "section": "profile",
                "metric": "SLOs",
                "value": ", ".join(f"{k} ≤ {v:g}" for k, v in p["slos"].items()) or "none",
            },
            {"section": "page", "metric": "live LLM page", "value": "/llm"},
        ]
        scopes = [("all", st["overall"])] + [(f"scenario {n}", s) for n, s in st["scenarios"].items()]
        for label, sc in scopes:
            if sc is None:
                continue
            for key, title in LATENCIES:
                lat = sc["latency_ms"][key]
                rows.append(
                    {
                        "section": label,
                        "metric": f"{title} ms",
                        "p50": lat["p50"],
                        "p90": lat["p90"],
                        "p99": lat["p99"],
                        "value": f"n={lat['count']}",
                    }
                )
            r = sc["requests"]
            rows.append(
                {
                    "section": label,
                    "metric": "output tokens/s",
                    "value": f"{sc['output_tokens_per_s_recent']:g} (last {RECENT_S} s), "
                    f"{sc['output_tokens_per_s_avg']:g} (run)",
                }
            )
            rows.append(
                {
                    "section": label,
                    "metric": "requests ok / failed / cancelled",
                    "value": f"{r['ok']} / {r['failed']} / {r['cancelled']}",
                }
            )
            for e in sc["errors"]:
                rows.append(
                    {
                        "section": label,
                        "metric": f"error {e['outcome']}",
                        "value": f"{e['count']}: {e['sample']}",
                    }
                )
        for s in st["slos"]:
            met = "n/a" if s["met"] is None else ("met" if s["met"] else "MISSED")
            rows.append(
                {
                    "section": "SLO",
                    "metric": s["key"],
                    "value": f"{s['value']} ≤ {s['limit']:g} {s['unit']}: {met}",
                }
            )
        if st["verdict"] is not None:
            rows.append(
                {
                    "section": "verdict",
                    "metric": st["verdict"]["status"],
                    "value": f"report: {st['report_url']}" if st["report_url"] else "",
                }
            )
        if st["run"] is not None:
            rows.append({"section": "run", "metric": st["run"]["id"], "value": st["run"]["phase"]})
        # The React table sorts by "name" first: a hidden zero-padded index keeps this order.
        return [{"name": f"{i:04d}", **row} for i, row in enumerate(rows)]

    # ---- the web UI --------------------------------------------------------------------------
    def install(self, auth: tuple[str, str] | None = None) -> None:
        """Extended tab, /llm, /llm/stats, /llm/report and the open-loop user count, on env.web_ui."""
        web_ui = self.env.web_ui
        runner = self.env.runner
        assert web_ui is not None and runner is not None
        app = web_ui.app
        assert app is not None  # WebUI.__init__ always creates its Flask app
        cols = [("section", "Section"), ("metric", "Metric"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99")]
        web_ui.template_args["extended_tabs"] = [{"title": "LLM metrics", "key": TAB_KEY}]
        web_ui.template_args["extended_tables"] = [
            {"key": TAB_KEY, "structure": [{"key": k, "title": t} for k, t in [*cols, ("value", "Value")]]}
        ]
        web_ui.template_args["extended_csv_files"] = [
            {"href": "./llm", "title": "Live LLM metrics page"},
            {"href": "./llm/stats", "title": "LLM metrics (JSON)"},
            {"href": "./llm/report", "title": "Run report (after a stop)"},
        ]

        protect = web_ui.auth_required_if_enabled  # Locust's --web-login: its login page guards every view
        if auth is not None:
            _install_login(web_ui, *auth)

        @app.after_request
        def extend_stats(response: Response) -> Response:
            if request.path != "/stats/requests" or response.status_code != 200:
                return response
            try:
                data = json.loads(response.get_data())
                data["extended_stats"] = [{"key": TAB_KEY, "data": self.table_rows()}]
                response.set_data(json.dumps(data))
            except Exception:  # never break Locust's own stats view
                log.exception("extending /stats/requests failed")
            return response

        @app.route("/llm/stats")
        @protect
        def llm_stats() -> Response:
            return jsonify(self.stats())

        @app.route("/llm")
        @protect
        def llm_page() -> Response:
            return Response(LLM_PAGE, mimetype="text/html")

        @app.route("/llm/report")
        @protect
        def llm_report() -> Response:
            run = self.run
            if run is None or run.report is None:
                return Response("no report yet: stop a run first", 404, mimetype="text/plain")
            return send_file(run.report.resolve(), mimetype="text/html")

        if self.open_loop:
            start = runner.start

            def start_dispatchers(user_count: int, spawn_rate: float, *a: Any, **kw: Any) -> None:
                # Open loop: the schedule sets the load; one dispatcher per process, whatever the form says.
                start(self.base.processes, max(spawn_rate, 1.0), *a, **kw)

            runner.start = start_dispatchers  # type: ignore[method-assign]  # wrap locust's Runner.start

    def interrupt(self, reason: str) -> None:
        """SIGINT/SIGTERM: stop any run without draining and wait for its results to be written."""
        self.interrupt_reason = reason
        runner = self.env.runner
        if runner is not None and runner.state in ("running", "spawning", "cleanup", "stopping"):
            runner.stop()
        self.wait_finalized(60.0)


def _install_login(web_ui: Any, user: str, password: str) -> None:
    """Locust's web login with one user: its login page posts to /llm/login, which checks the credentials."""
    from flask import redirect, session, url_for
    from flask_login import UserMixin, login_user

    class _Operator(UserMixin):
        def __init__(self, name: str) -> None:
            self.id = name

    import secrets

    # Sessions need a key; without one Locust's login check fails open (it logs and serves the page).
    web_ui.app.secret_key = secrets.token_bytes(32)
    web_ui.login_manager.user_loader(lambda uid: _Operator(uid) if uid == user else None)
    web_ui.auth_args = {"username_password_callback": "/llm/login"}

    @web_ui.app.route("/llm/login", methods=["POST"])
    def llm_login() -> WerkzeugResponse:  # flask.redirect's type
        ok_user = hmac.compare_digest(request.form.get("username", ""), user)
        ok_password = hmac.compare_digest(request.form.get("password", ""), password)
        if ok_user and ok_password:
            login_user(_Operator(user))
            return redirect(url_for("locust.index"))
        session["auth_error"] = "Invalid username or password"
        return redirect(url_for("locust.login"))


LLM_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>LLM metrics · loadtest</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1.2rem}
td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left}
.met{color:#17803d}.missed{color:#b42318;font-weight:600}
#verdict{font-size:1.2rem;font-weight:600}
.muted{color:#666}
</style></head>
<body>
<h1>LLM metrics <span class="muted" id="state"></span></h1>
<p><a href="./">← Locust</a> · <a href="./llm/stats">JSON</a></p>
<div id="profile"></div>
<div id="verdict"></div>
<div id="body"><p class="muted">loading…</p></div>
<script>
const LAT=[["ttft","TTFT"],["itl","ITL"],["tpot","TPOT"],["e2e","E2E"]];
const esc=s=>String(s??"").replace(/[&<>"]/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));
const num=v=>v==null?"–":String(v);
function scope(id,sc){
  let h="<table><tr><th>latency (ms)</th><th>p50</th><th>p90</th><th>p99</th><th>count</th></tr>";
  for(const [k,t] of LAT){const l=sc.latency_ms[k];
    h+=`<tr><td>${t}</td><td id="${id}-${k}-p50">${num(l.p50)}</td><td id="${id}-${k}-p90">${num(l.p90)}</td>`+
       `<td id="${id}-${k}-p99">${num(l.p99)}</td><td>${l.count}</td></tr>`;}
  h+="</table>";
  const r=sc.requests;
  h+=`<table><tr><th>output tokens/s (last 5 s)</th><td id="${id}-tps">${sc.output_tokens_per_s_recent}</td></tr>`+
     `<tr><th>output tokens/s (run)</th><td>${sc.output_tokens_per_s_avg}</td></tr>`+
     `<tr><th>requests ok / failed / cancelled</th><td id="${id}-requests">${r.ok} / ${r.failed} / ${r.cancelled}</td></tr>`+
     `<tr><th>error rate</th><td>${(100*r.error_rate).toFixed(2)} %</td></tr></table>`;
  if(sc.errors.length){h+="<table><tr><th>error class</th><th>count</th><th>sample message</th></tr>";
    for(const e of sc.errors)h+=`<tr><td>${esc(e.outcome)}</td><td>${e.count}</td><td>${esc(e.sample)}</td></tr>`;
    h+="</table>";}
  return h;
}
function render(s){
  const p=s.profile;
  document.getElementById("state").textContent="· "+s.state+(s.run?" · "+s.run.id+" ("+s.run.phase+")":"");
  const slos=Object.entries(p.slos).map(([k,v])=>esc(k)+" ≤ "+v).join(", ")||"none";
  document.getElementById("profile").innerHTML=`<p><b id="profile-name">${esc(p.name)}</b>: `+
    `<span id="profile-load">${esc(p.load)}</span> · model ${esc(p.model)} · ${esc(p.host)}<br>SLOs: ${slos}</p>`;
  const v=document.getElementById("verdict");
  v.innerHTML=s.verdict?`verdict: <span id="verdict-status">${esc(s.verdict.status)}</span>`+
    (s.report_url?` · <a id="report-link" href=".${s.report_url}">report</a>`:""):
    (s.run&&s.run.error?"results failed: "+esc(s.run.error):"");
  if(!s.overall){document.getElementById("body").innerHTML=
    '<p class="muted">no run yet: start one on the <a href="./">Locust page</a></p>';return;}
  let h="<h2>all requests</h2>"+scope("all",s.overall);
  for(const [n,sc] of Object.entries(s.scenarios))h+="<h2>scenario "+esc(n)+"</h2>"+scope("sc-"+esc(n),sc);
  if(s.slos.length){h+="<h2>SLOs</h2><table><tr><th>SLO</th><th>measured</th><th>limit</th><th></th></tr>";
    for(const o of s.slos){const m=o.met==null?"n/a":(o.met?"met":"missed");
      h+=`<tr><td>${esc(o.key)}</td><td>${num(o.value)}</td><td>${o.limit} ${o.unit}</td>`+
         `<td class="${m}">${m}</td></tr>`;}
    h+="</table>";}
  document.getElementById("body").innerHTML=h;
}
async function tick(){
  try{const r=await fetch("./llm/stats",{cache:"no-store"});if(r.ok)render(await r.json());}catch(e){}
  setTimeout(tick,1000);
}
tick();
</script></body></html>
"""
