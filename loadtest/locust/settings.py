"""Run settings shared by the master and every worker process (serialized to JSON, never holding secrets)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadtest.client.network import NetworkPolicy
from loadtest.profile.loader import ProfileError, dataset_scenario, load_profile
from loadtest.profile.schema import Load, Profile
from loadtest.workload.builder import Workload
from loadtest.workload.salt import new_run_nonce


def load_mode(profile: Profile) -> str:
    """'open' when arrivals follow a schedule (rate, trace, rate stages), 'closed' for concurrency."""
    return "open" if profile.load.open_loop else "closed"


@dataclass(slots=True)
class RunSettings:
    run_id: str
    profile_ref: str  # shipped name or path
    host: str
    out_dir: str
    duration_s: float
    seed: int
    concurrency: int | None = None
    rate: float | None = None
    ramp_up_s: float | None = None  # --ramp-up: over the profile's load.ramp_up_s (closed loop only)
    model: str | None = None
    api_key_env: str | None = None  # the NAME of the variable holding the key; the key itself is never stored
    api_key_file: str | None = None  # or the path of a file holding it (read by each process)
    processes: int = 1
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    total_timeout: float = 0.0  # 0 = none
    retries: dict | None = None  # the profile's client.retries (RetrySpec fields), --retries applied
    capture: dict | None = None  # --capture / --capture-rate (CaptureSpec fields) over the profile's capture
    verify_tls: bool = True
    # proxies, CA bundle, TLS verification: resolved once where the settings are made (client/network.py)
    network: NetworkPolicy | None = None
    embedded: bool = False
    tokenizer: str | None = None  # overrides the profile's
    dataset: str | None = (
        None  # --dataset: its absolute path; one scenario sending its prompts replaces the profile's
    )
    slo: str | None = None  # the command line's SLO spec, merged over the profile's
    hosts: list[str] | None = None  # several endpoints (replicas); host is the first
    balance: str = "round-robin"  # how requests spread over hosts (loadtest.client.balancer)
    endpoint_spec: dict | None = None  # hardware and price behind the endpoint (loadtest.economics)
    # The run's random nonce, mixed into every prompt under run_salt: per_run (workload/salt.py): drawn
    # once per run where the settings are made, and sent to every worker with them (not a secret).
    run_nonce: int = field(default_factory=new_run_nonce)
    # Where the client tokenizer came from (option, profile, model folder, HF cache, a guess...):
    # run/tokens.settle_tokenizer; run.json's `tokens` describes it.
    tokenizer_source: dict | None = None
    progress_s: float = 10.0  # a progress line on the console every this many seconds (0: none)
    max_requests: int | None = None  # --max-requests: units issued in all (split over the processes)
    # --seed-set: the arrival schedule's own seed (``seed`` then being the sample-index seed), the model
    # seed and the set's record for run.json (workload/seed_set.py); None: ``seed`` drives everything
    schedule_seed: int | None = None
    model_seed: int | None = None
    seed_set: dict | None = None
    session_header: str | None = (
        None  # --session-header over the profile's request.session_header ("none": off)
    )

    def profile(self) -> tuple[Profile, Path]:
        """The profile as this run uses it: the file, with the command line's overrides applied."""
        profile, path = load_profile(self.profile_ref)
        load = profile.load
        if load.trace is not None and (self.rate is not None or self.concurrency is not None):
            if self.concurrency is not None:
                raise ProfileError(
                    f"{path}: --concurrency cannot replace a trace replay's timestamps "
                    "(use --rate for a target rate, or load.trace.speedup)"
                )
            trace = load.trace.model_copy(update={"target_rate": self.rate, "speedup": None})
            load = load.model_copy(update={"trace": trace})
        elif self.concurrency is not None:
            load = Load(
                concurrency=self.concurrency, ramp_up_s=load.ramp_up_s if not load.open_loop else None
            )
        elif self.rate is not None:
            keep_cv = load.arrival == "gamma" and load.cv is not None
            load = Load(
                rate=self.rate,
                arrival=load.arrival if keep_cv or load.arrival != "gamma" else "poisson",
                cv=load.cv if keep_cv else None,
                max_in_flight=load.max_in_flight,
            )
        if self.ramp_up_s is not None:
            if load.concurrency is None:
                raise ProfileError(
                    f"{path}: --ramp-up applies to a closed loop (load.concurrency or --concurrency); "
                    f"this profile's load is {load.describe()}"
                )
            load = load.model_copy(update={"ramp_up_s": self.ramp_up_s})
        update: dict = {"load": load}
        if self.tokenizer:
            update["tokenizer"] = self.tokenizer
        if self.dataset:
            update["scenarios"] = [dataset_scenario(profile, path, self.dataset)]
        if self.session_header is not None:
            name = None if self.session_header.lower() == "none" else self.session_header
            update["request"] = profile.request.model_copy(update={"session_header": name})
        return profile.model_copy(update=update), path

    def workload(self, profile: Profile) -> Workload:
        """The run's workload of ``profile``: this run's seeds (a seed set's too) and nonce."""
        return Workload(
            profile,
            self.seed,
            run_nonce=self.run_nonce,
            schedule_seed=self.schedule_seed,
            model_seed=self.model_seed,
        )

    def policy(self) -> NetworkPolicy:
        """The run's network policy (without one: no proxy, the system's CAs, ``verify_tls``)."""
        return self.network or NetworkPolicy(verify_tls=self.verify_tls)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunSettings:
        data = json.loads(text)
        if data.get("network") is not None:
            data["network"] = NetworkPolicy.from_data(data["network"])
        return cls(**data)

    def write(self, path: Path) -> None:
        path.write_text(self.to_json())

    @classmethod
    def read(cls, path: Path) -> RunSettings:
        return cls.from_json(path.read_text())
