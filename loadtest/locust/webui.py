"""Locust web UI extension: a run per start, the live LLM dashboard (/llm), every run's report, results on stop."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent
import msgspec
from flask import Response, jsonify, request, send_file

from loadtest.contracts.run_document import read_run_document
from loadtest.errors import LoadtestError
from loadtest.locust.live_series import LiveSeries
from loadtest.locust.settings import RunSettings
from loadtest.locust.ui_login import install_login
from loadtest.locust.ui_runs import RunEntry, UiRun, new_run_dir
from loadtest.locust.ui_stats import scope_stats, slo_rows, slos_text, table_rows, verdict_lines
from loadtest.metrics.slo import AnySlo, merge_slos
from loadtest.profile.loader import load_profile, resolve_profile_path
from loadtest.profile.schema import Profile
from loadtest.workload.salt import new_run_nonce

if TYPE_CHECKING:  # importing locust monkey-patches the process: only where a run happens
    from locust.env import Environment

    from loadtest.locust.runtime import RunOutcome

log = logging.getLogger("loadtest")

TAB_KEY = "llm"
STATS_CACHE_S = 0.5
SAMPLE_TICK_S = 0.25  # how often the sampler looks whether the next point of the series is due
DASHBOARD_TEMPLATE = Path(__file__).parent / "templates" / "llm_dashboard.html"
# A fixed link on Locust's own page to the dashboard (Locust's tables render text, never links).
DASHBOARD_LINK = (
    '<a id="llm-dashboard-link" href="./llm" style="position:fixed;left:16px;bottom:16px;z-index:2000;'
    "padding:8px 14px;border-radius:6px;background:#1d2430;color:#fff;font:600 14px system-ui,sans-serif;"
    'text-decoration:none;box-shadow:0 2px 6px rgba(0,0,0,.3)">LLM dashboard ↗</a>'
)

# A finalizer writes run.json (with the given notes), report.html and the verdict; it returns the exit code.
Finalizer = Callable[[RunSettings, Profile, Any, "RunOutcome", Path, list[str]], int]


@cache
def dashboard_html() -> str:
    return DASHBOARD_TEMPLATE.read_text(encoding="utf-8")


@cache
def _plotly_js() -> bytes:
    from loadtest.report.charts import plotly_js  # plotly is a heavy import: only when the page asks

    return plotly_js().encode()


class LlmWebUi:
    """Owns the runs of a UI process: a new RunContext per start, finalization on stop, the LLM views."""

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
        profile_choices: list[str] | None = None,
        series_interval_s: float = 2.0,
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
        self.base_profile_name = profile.name
        self.profile_choices = profile_choices or []
        self.series_interval_s = series_interval_s
        self.run: UiRun | None = None
        self.runs: list[RunEntry] = []  # every run of this session, oldest first
        self.interrupt_reason: str | None = None  # set on SIGINT/SIGTERM: stop without draining
        self._cache: tuple[float, dict[str, Any]] | None = None
        self._sampler: gevent.Greenlet | None = None
        env.events.test_start.add_listener(self._on_test_start)
        env.events.test_stopping.add_listener(self._on_test_stopping)
        env.events.test_stop.add_listener(self._on_test_stop)
        env.events.spawning_complete.add_listener(self._on_spawned)

    # ---- run lifecycle ---------------------------------------------------------------------
    def _profile_ref(self, chosen: str | None) -> str:
        """The profile a start runs: the form's choice, or the one the UI started with (blank or its name)."""
        chosen = (chosen or "").strip()
        if not chosen or chosen in (self.base.profile_ref, self.base_profile_name):
            return self.base.profile_ref
        return chosen

    def check_profile_choice(self, chosen: str) -> str | None:
        """Why the start form's profile cannot run here (None when it can): unknown, or another load model."""
        ref = self._profile_ref(chosen)
        if ref == self.base.profile_ref:
            return None
        try:
            profile, path = load_profile(ref)
        except LoadtestError as e:
            return f"Profile {chosen!r}: {e}"
        if profile.load.open_loop != self.open_loop:
            loop = "open" if self.open_loop else "closed"
            return (
                f"Profile {chosen!r} ({path.name}) is {'open' if profile.load.open_loop else 'closed'} loop; this UI "
                f"runs {loop}-loop profiles (restart `loadtest ui --profile {chosen}` for it)"
            )
        return None

    def _on_test_start(self, environment: Environment, **_kw: Any) -> None:
        from loadtest.locust.context import RunContext

        ref = self._profile_ref(getattr(environment, "profile", None))  # the form's "Profile" field
        base = self.base
        if ref != base.profile_ref:
            base = dataclasses.replace(base, profile_ref=str(resolve_profile_path(ref)))
        runner = environment.runner
        users: int | None = None
        if not self.open_loop and runner is not None and runner.target_user_count:
            # the form's user count is this run's concurrency: run.json and the MLPerf summary say so
            users = int(runner.target_user_count)
            base = dataclasses.replace(base, concurrency=users)
        profile, _ = base.profile()
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
        started = time.time()
        entry = RunEntry(out.name, profile.name, self.load_description, users, out, started)
        self.run = UiRun(
            ctx=ctx, settings=settings, entry=entry, series=LiveSeries(started, self.series_interval_s)
        )
        self.runs.append(entry)
        self._cache = None
        self._sampler = gevent.spawn(self._sample_loop, self.run)
        if self.on_start is not None:
            self.on_start(settings)
        log.warning("run %s started: writing %s/", out.name, out)

    def _on_spawned(self, user_count: int, **_kw: Any) -> None:
        run = self.run
        if run is None or run.phase != "running" or run.entry.users is None:
            return
        entry = run.entry
        last = entry.user_changes[-1][1] if entry.user_changes else entry.users
        if user_count != last:
            entry.user_changes.append((round(time.time() - entry.started_epoch, 1), int(user_count)))
            log.warning("run %s: %d users now (started with %d)", entry.id, user_count, entry.users)

    def _sample(self, run: UiRun) -> None:
        runner = self.env.runner
        users = runner.user_count if runner is not None else 0
        run.series.sample(run.ctx.recorder, time.time(), run.ctx.in_flight, users)

    def _sample_loop(self, run: UiRun) -> None:
        """The dashboard's series: one point every interval while the run is live."""
        while run.phase in ("running", "draining"):
            gevent.sleep(SAMPLE_TICK_S)
            if run.phase in ("running", "draining") and run.series.due(time.time()):
                try:
                    self._sample(run)
                except Exception:  # the series is a view: never break the run for it
                    log.exception("sampling the dashboard series failed")
                    return

    def _on_test_stopping(self, environment: Environment, **_kw: Any) -> None:
        run = self.run
        if run is None or run.phase != "running":
            return
        run.ctx.stopping = True
        if self.interrupt_reason is None:
            run.entry.phase = "draining"
            deadline = time.monotonic() + self.drain_timeout_s
            while run.ctx.in_flight > 0 and time.monotonic() < deadline:
                gevent.sleep(0.05)

    def _on_test_stop(self, environment: Environment, **_kw: Any) -> None:
        run = self.run
        if run is None or run.phase not in ("running", "draining"):
            return
        from loadtest.locust.runtime import RunOutcome

        run.entry.phase = "finalizing"
        if self._sampler is not None:
            self._sampler.kill(block=False)
            self._sampler = None
        try:
            self._sample(run)  # the last point: what the run ended with
        except Exception:  # the series is a view: the results come first
            log.exception("sampling the dashboard series failed")
        run.interrupted_reason = self.interrupt_reason
        run.ctx.close()
        run.entry.ended_epoch = time.time()
        outcome = RunOutcome(
            aggregates=run.ctx.recorder.result(),
            interrupted_reason=run.interrupted_reason,
            record_files=[run.ctx.log.path.name],
            records_written=run.ctx.log.count,
            started_epoch=run.entry.started_epoch,
            ended_epoch=run.entry.ended_epoch,
        )
        gevent.spawn(self._finalize, run, outcome)

    def _finalize(self, run: UiRun, outcome: RunOutcome) -> None:
        entry = run.entry
        try:
            self.finalize(run.settings, run.ctx.profile, run.ctx.workload, outcome, run.out, entry.notes())
            entry.verdict = read_run_document(run.out).verdict
            report = run.out / "report.html"
            entry.report = report if report.exists() else None
            entry.phase = "done"
        except Exception as e:  # the UI keeps serving; the error shows on the page
            log.exception("writing the results of %s failed", run.out)
            entry.error, entry.phase = f"{type(e).__name__}: {e}", "failed"
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
                "slos_text": slos_text(self.slos),
                "host": self.env.host or self.base.host,
                "model": self.base.model,
            },
            "state": runner.state if runner is not None else "missing",
            "users": runner.user_count if runner is not None else 0,
            "run": None,
            "overall": None,
            "scenarios": {},
            "slos": [],
            "verdict": None,
            "verdict_lines": [],
            "report_url": None,
            "runs": [e.to_data() for e in reversed(self.runs)],  # newest first
        }
        if run is not None:
            rec = run.ctx.recorder
            agg = rec.total  # flushes pending values
            overall = scope_stats(agg, now)
            payload["slos"] = slo_rows(self.slos, agg, overall["requests"])
            payload["overall"] = overall
            for name, track in sorted(rec.scenarios.items()):
                payload["scenarios"][name] = scope_stats(track.total, now)
            entry = run.entry
            payload["run"] = {
                "id": entry.id,
                "out_dir": str(entry.out),
                "phase": entry.phase,
                "users": entry.users,
                "load": entry.load,
                "in_flight": run.ctx.in_flight,
                "elapsed_s": round((entry.ended_epoch or now) - entry.started_epoch, 1),
                "interrupted_reason": run.interrupted_reason,
                "error": entry.error,
            }
            if entry.verdict is not None:
                payload["verdict"] = msgspec.to_builtins(entry.verdict)  # JSON for the page
                payload["verdict_lines"] = verdict_lines(payload["verdict"])
            payload["report_url"] = entry.report_url
        self._cache = (now, payload)
        return payload

    def series(self) -> dict[str, Any]:
        """What /llm/series serves: the current (or last) run's sampled series."""
        run = self.run
        if run is None:
            return {"run": None, "interval_s": self.series_interval_s, "t": [], "scopes": {}}
        return {"run": run.entry.id, **run.series.to_data()}

    # ---- the web UI --------------------------------------------------------------------------
    def install(self, auth: tuple[str, str] | None = None) -> None:
        """LLM tab, the dashboard (/llm, /llm/stats, /llm/series), reports, the form's profile field."""
        web_ui = self.env.web_ui
        runner = self.env.runner
        assert web_ui is not None and runner is not None
        app = web_ui.app
        assert app is not None  # WebUI.__init__ always creates its Flask app
        cols = [
            ("section", "Section"),
            ("metric", "Metric"),
            ("p50", "p50 ms"),
            ("p90", "p90 ms"),
            ("p99", "p99 ms"),
        ]
        web_ui.template_args["extended_tabs"] = [{"title": "LLM metrics", "key": TAB_KEY}]
        web_ui.template_args["extended_tables"] = [
            {"key": TAB_KEY, "structure": [{"key": k, "title": t} for k, t in [*cols, ("value", "Value")]]}
        ]
        web_ui.template_args["extended_csv_files"] = [
            {"href": "./llm", "title": "Live LLM dashboard"},
            {"href": "./llm/stats", "title": "LLM metrics (JSON)"},
            {"href": "./llm/series", "title": "LLM time series (JSON)"},
            {"href": "./llm/report", "title": "Latest run report (after a stop)"},
        ]
        # One "Profile" field: Locust's own, offering the traffic profiles this UI can run.
        web_ui.template_args["all_profiles"] = self.profile_choices
        self.env.profile = self.base_profile_name

        protect = web_ui.auth_required_if_enabled  # Locust's --web-login: its login page guards every view
        if auth is not None:
            install_login(web_ui, *auth)

        @app.before_request
        def check_start_form() -> Response | None:
            if request.path != "/swarm" or request.method != "POST":
                return None
            problem = self.check_profile_choice(request.form.get("profile", ""))
            if problem is None:
                return None
            return jsonify({"success": False, "message": problem, "host": self.env.host})

        @app.after_request
        def extend_locust(response: Response) -> Response:
            if response.status_code != 200:
                return response
            if request.path == "/" and response.mimetype == "text/html":
                html = response.get_data(as_text=True)
                response.set_data(html.replace("</body>", DASHBOARD_LINK + "</body>", 1))
                return response
            if request.path != "/stats/requests":
                return response
            try:
                data = json.loads(response.get_data())
                data["extended_stats"] = [{"key": TAB_KEY, "data": table_rows(self.stats())}]
                response.set_data(json.dumps(data))
            except Exception:  # never break Locust's own stats view
                log.exception("extending /stats/requests failed")
            return response

        @app.route("/llm/stats")
        @protect
        def llm_stats() -> Response:
            return jsonify(self.stats())

        @app.route("/llm/series")
        @protect
        def llm_series() -> Response:
            return jsonify(self.series())

        @app.route("/llm")
        @protect
        def llm_page() -> Response:
            return Response(dashboard_html(), mimetype="text/html")

        @app.route("/llm/plotly.js")
        @protect
        def llm_plotly() -> Response:
            resp = Response(_plotly_js(), mimetype="application/javascript")
            resp.headers["Cache-Control"] = "max-age=86400"
            return resp

        @app.route("/llm/report")
        @protect
        def llm_report() -> Response:
            run = self.run
            if run is None or run.entry.report is None:
                return Response("no report yet: stop a run first", 404, mimetype="text/plain")
            return send_file(run.entry.report.resolve(), mimetype="text/html")

        @app.route("/llm/runs/<run_id>/report")
        @protect
        def llm_run_report(run_id: str) -> Response:
            entry = next((e for e in self.runs if e.id == run_id), None)
            if entry is None or entry.report is None:
                return Response(f"no report for run {run_id!r}", 404, mimetype="text/plain")
            return send_file(entry.report.resolve(), mimetype="text/html")

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
