"""Locust web UI extension: a run per start (users here or on workers), the live LLM dashboard (/llm), every
run's report, results on stop."""

from __future__ import annotations

import contextlib
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
from loadtest.locust.ui_stats import (
    judged_figures,
    scope_stats,
    slo_rows,
    slos_text,
    table_rows,
    verdict_lines,
)
from loadtest.metrics.slo import AnySlo, merge_slos
from loadtest.profile.loader import load_profile, resolve_profile_path
from loadtest.profile.schema import Profile
from loadtest.workload.salt import new_run_nonce

if TYPE_CHECKING:  # importing locust monkey-patches the process: only where a run happens
    from locust.env import Environment

    from loadtest.locust.runtime import RunOutcome
    from loadtest.locust.ui_sources import RunSource

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
# The start form's host checked as `run` checks one (connect, /v1/models, the model served): the model a run
# there asks for; a LoadtestError says why the host cannot be used.
HostCheck = Callable[[str], str | None]


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
        source: RunSource | None = None,
        check_host: HostCheck | None = None,
    ) -> None:
        if source is None:
            from loadtest.locust.ui_sources import LocalRuns

            source = LocalRuns()
        self.source = source  # where each run's users run: this process, or the workers of a master
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
        self.check_host = check_host
        self.host_models: dict[str, str | None] = {}  # a start form's host, checked: the model it serves
        self.run: UiRun | None = None
        self.runs: list[RunEntry] = []  # every run of this session, oldest first
        self.judged: dict[str, dict[str, Any]] = {}  # by run id: the figures its verdict judged (run.json)
        self.interrupt_reason: str | None = None  # set on SIGINT/SIGTERM: stop without draining
        self._cache: tuple[float, dict[str, Any]] | None = None
        self._sampler: gevent.Greenlet | None = None
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

    def _typed_host(self, host: str) -> str | None:
        """The start form's host when it is another endpoint than the UI's own (None: the UI's), as Locust
        keeps it (< and > dropped)."""
        host = host.replace("<", "").replace(">", "").strip()
        return host if host and host.rstrip("/") != (self.base.host or "").rstrip("/") else None

    def check_host_choice(self, host: str) -> str | None:
        """Why the start form's host cannot be used (None when it can: checked like `run` checks one)."""
        typed = self._typed_host(host)
        if typed is None or self.check_host is None:
            return None
        try:
            self.host_models[typed] = self.check_host(typed)
        except LoadtestError as e:
            return f"Host {typed}: {e}"
        return None

    def _begin_run(self, user_count: int) -> bool:
        """A start (not Locust's Edit of a live run): a new run with its own folder, settings and numbers;
        False when it could not start (the reason shows on the dashboard)."""
        environment = self.env
        ref = self._profile_ref(getattr(environment, "profile", None))  # the form's "Profile" field
        base = self.base
        if ref != base.profile_ref:
            base = dataclasses.replace(base, profile_ref=str(resolve_profile_path(ref)))
        users: int | None = None
        if not self.open_loop and user_count:
            # the form's user count is this run's concurrency: run.json and the MLPerf summary say so
            users = int(user_count)
            base = dataclasses.replace(base, concurrency=users)
        profile, _ = base.profile()
        self.profile, self.load_description = profile, profile.load.describe()
        self.slos = merge_slos(profile.slos, base.slo)
        out = new_run_dir(self.reports_root, profile.name)
        # each start is its own run: its own run nonce (run_salt: per_run sends new prompts)
        settings = dataclasses.replace(base, out_dir=str(out), run_id=out.name, run_nonce=new_run_nonce())
        typed = self._typed_host(environment.host or "")
        if typed is not None:  # the start form's host field: checked before this start (check_host_choice)
            settings.host, settings.hosts, settings.embedded = typed, None, False
            settings.model = self.host_models.get(typed) or settings.model  # None: its list was not read
        started = time.time()
        entry = RunEntry(out.name, profile.name, self.load_description, users, out, started)
        self._cache = None
        try:
            live = self.source.begin(settings, environment)
        except RuntimeError as e:  # a worker could not set up the run: nothing started
            log.error("run %s did not start: %s", out.name, e)
            entry.error, entry.phase, entry.ended_epoch = str(e), "failed", time.time()
            with contextlib.suppress(OSError):  # nothing was written: no empty folder is left
                out.rmdir()
            self.runs.append(entry)
            return False
        self.run = UiRun(
            live=live, settings=settings, entry=entry, series=LiveSeries(started, self.series_interval_s)
        )
        self.runs.append(entry)
        self._sampler = gevent.spawn(self._sample_loop, self.run)
        if self.on_start is not None:
            self.on_start(settings)
        log.warning("run %s started: writing %s/", out.name, out)
        return True

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
        run.series.sample(run.live.aggregates(), time.time(), run.live.in_flight(), users)

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
        drain = self.interrupt_reason is None
        if drain:
            run.entry.phase = "draining"
        run.live.finish(drain, self.drain_timeout_s)  # workers: each drains, then sends its final results

    def _on_test_stop(self, environment: Environment, **_kw: Any) -> None:
        run = self.run
        if run is None or run.phase not in ("running", "draining"):
            return
        run.entry.phase = "finalizing"
        if self._sampler is not None:
            self._sampler.kill(block=False)
            self._sampler = None
        try:
            self._sample(run)  # the last point: what the run ended with
        except Exception:  # the series is a view: the results come first
            log.exception("sampling the dashboard series failed")
        run.entry.ended_epoch = time.time()
        outcome = run.live.outcome(self.interrupt_reason, run.entry.started_epoch, run.entry.ended_epoch)
        run.interrupted_reason = outcome.interrupted_reason  # a signal, or a worker lost
        gevent.spawn(self._finalize, run, outcome)

    def _finalize(self, run: UiRun, outcome: RunOutcome) -> None:
        entry = run.entry
        try:
            self.finalize(run.settings, run.live.profile, run.live.workload, outcome, run.out, entry.notes())
            document = read_run_document(run.out)
            entry.verdict = document.verdict
            self.judged[entry.id] = judged_figures(document)
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
            "judged": None,  # the judged figures (run.json's) once the run has its verdict
            "report_url": None,
            "runs": [e.to_data() for e in reversed(self.runs)],  # newest first
            "workers": self.source.workers(),  # None: the users run in this process
        }
        if run is not None:
            aggs = run.live.aggregates()  # a recorder's totals (pending values flushed) or a master's merge
            overall = scope_stats(aggs.all, now)
            payload["slos"] = slo_rows(self.slos, aggs.all, overall["requests"])
            payload["overall"] = overall
            for name, agg in sorted(aggs.scenarios.items()):
                payload["scenarios"][name] = scope_stats(agg, now)
            entry = run.entry
            payload["run"] = {
                "id": entry.id,
                "out_dir": str(entry.out),
                "phase": entry.phase,
                "users": entry.users,
                "load": entry.load,
                "in_flight": run.live.in_flight(),
                "elapsed_s": round((entry.ended_epoch or now) - entry.started_epoch, 1),
                "interrupted_reason": run.interrupted_reason,
                "error": entry.error,
            }
            if entry.verdict is not None:
                payload["verdict"] = msgspec.to_builtins(entry.verdict)  # JSON for the page
                payload["verdict_lines"] = verdict_lines(payload["verdict"])
                payload["judged"] = self.judged.get(entry.id)
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
            if problem is None and runner.state not in ("running", "spawning"):  # a start, not an Edit
                problem = self.source.refusal()  # e.g. fewer workers ready than expected
                if problem is None:
                    problem = self.check_host_choice(request.form.get("host", ""))
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

        start = runner.start

        def start_run(user_count: int, spawn_rate: float, *a: Any, **kw: Any) -> None:
            if runner.state not in ("running", "spawning") and not self._begin_run(user_count):
                return  # the run could not start: nothing is spawned
            # open loop: the schedule sets the load; one dispatcher per process, whatever the form says
            if self.open_loop:
                user_count, spawn_rate = self.base.processes, max(spawn_rate, 1.0)
            start(user_count, spawn_rate, *a, **kw)

        runner.start = start_run  # type: ignore[method-assign]  # wrap locust's Runner.start

    def interrupt(self, reason: str) -> None:
        """SIGINT/SIGTERM: stop any run without draining and wait for its results to be written."""
        self.interrupt_reason = reason
        runner = self.env.runner
        if runner is not None and runner.state in ("running", "spawning", "cleanup", "stopping"):
            runner.stop()
        self.wait_finalized(60.0)
