"""Per-process run state: workload, recorder, record log and clients, attached to the Locust environment."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import gevent
import psutil
from locust.env import Environment

from loadtest.client.openai import OpenAIClient, Timeouts
from loadtest.client.record import RequestRecord
from loadtest.client.secrets import install_redaction, load_api_key
from loadtest.locust.settings import RunSettings
from loadtest.metrics.recorder import Recorder
from loadtest.metrics.slo import RequestSlo, merge_slos
from loadtest.profile.client import RetrySpec
from loadtest.results.record_log import RecordLog
from loadtest.workload.builder import Workload


class RunContext:
    """What the users of one process share; ``finish`` is the single place a record is accounted."""

    def __init__(self, settings: RunSettings, worker_index: int, n_workers: int, log_name: str) -> None:
        self.settings = settings
        self.worker_index = worker_index
        self.n_workers = max(1, n_workers)
        self.profile, self.profile_path = settings.profile()
        self.workload = Workload(self.profile, settings.seed)
        self.recorder = Recorder(per_scenario=len(self.profile.scenarios) > 1)
        # Per-request SLO (TTFT and TPOT limits) for live attainment and goodput; None without one.
        rule = RequestSlo.from_slos(merge_slos(self.profile.slos, settings.slo))
        self.request_slo = rule if rule.ttft_ms is not None or rule.tpot_ms is not None else None
        self.log = RecordLog(Path(settings.out_dir) / log_name)
        self._api_key = load_api_key(settings.api_key_env, settings.api_key_file)
        install_redaction(self._api_key)
        self.retries = RetrySpec.model_validate(settings.retries or {})
        self._closed_counter = itertools.count()
        self.env: Environment | None = None
        self.in_flight = 0
        self.stopping = False  # set at the end of the run: issue nothing new, let in-flight requests finish
        self._cpu_sampler = gevent.spawn(self._sample_cpu)

    def _sample_cpu(self) -> None:
        """Once a second: this process's CPU use, for the verdict's generator-health check."""
        proc = psutil.Process()
        gevent.sleep(2.0)  # start-up (users spawning, first units built) is not the steady load
        proc.cpu_percent(None)
        while True:
            gevent.sleep(1.0)
            self.recorder.sample_cpu(proc.cpu_percent(None))

    def new_client(self, host: str | None = None) -> OpenAIClient:
        s = self.settings
        if host is None and s.hosts and len(s.hosts) > 1:
            from loadtest.client.balancer import balanced_client

            return balanced_client(self)  # type: ignore[return-value]  # same interface, several endpoints
        client = OpenAIClient(
            host or s.host,
            s.model or self.profile.model,
            self.workload.tokenizer,
            api_key=self._api_key,
            timeouts=Timeouts(connect=s.connect_timeout, read=s.read_timeout, total=s.total_timeout),
            worker=self.worker_index,
            verify_tls=s.verify_tls,
        )
        from loadtest.client.apis import configure_client

        configure_client(client, self.profile)  # the profile's auth scheme, headers and extra body fields
        return client

    def next_closed_loop_index(self) -> int:
        """Global request index for closed loop: workers interleave so indices never collide."""
        return self.worker_index + self.n_workers * next(self._closed_counter)

    @staticmethod
    def now() -> tuple[int, float]:
        return time.perf_counter_ns(), time.time()

    def skip_arrival(self) -> None:
        """An open-loop arrival not sent because load.max_in_flight was reached (counted in run.json)."""
        self.recorder.note("skipped_arrivals")

    def finish(self, rec: RequestRecord) -> None:
        """Account one finished (or cancelled) request: metrics, record log, Locust's own stats."""
        self.recorder.add(rec)
        if self.request_slo is not None and rec.outcome != "cancelled":
            self.recorder.judge_request(rec, self.request_slo.is_good_record(rec))
        self.log.write(rec)
        if self.env is not None:
            e2e = ((rec.done_ns or rec.sent_ns or rec.scheduled_ns) - rec.scheduled_ns) / 1e6
            self.env.events.request.fire(
                request_type=rec.api.upper(),
                name=rec.scenario,
                response_time=e2e,
                response_length=rec.output_tokens,
                exception=None if rec.outcome == "ok" else Exception(f"{rec.outcome}: {rec.error}"),
                context={},
            )

    def close(self) -> None:
        self._cpu_sampler.kill(block=False)
        self.recorder.flush()
        self.log.close()
