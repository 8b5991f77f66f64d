"""A run's inputs checked and its settings built, before any endpoint is touched: the profile with the
command line's overrides, its workload, the SLOs, the API key, the duration, the endpoints and the run
folder. Bad input raises UsageError (a ProfileError is one) with one line that names it."""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.client.balancer import read_hosts_file
from loadtest.client.network import NetworkPolicy
from loadtest.client.secrets import KeySourceError, install_redaction, load_api_key
from loadtest.economics.spec import EndpointSpecError, spec_from_options
from loadtest.errors import UsageError
from loadtest.locust.settings import RunSettings
from loadtest.metrics.slo import AnySlo, merge_slos
from loadtest.profile.base import MAX_CONCURRENCY, MAX_RATE
from loadtest.profile.loader import load_profile
from loadtest.profile.quality import CaptureSpec
from loadtest.profile.request import SESSION_HEADER, header_name_error
from loadtest.profile.schema import Profile
from loadtest.run.options import EndpointOptions, RunOptions
from loadtest.traces import TraceFormatError
from loadtest.workload.builder import Workload
from loadtest.workload.seed_set import SeedSetError, load_seed_set

MIN_FREE_BYTES = 64 * 2**20  # refuse to start a run on a (nearly) full disk
# What a run writes into its folder: a folder holding any of these holds a run.
RUN_FILES = (
    "run.json",
    "report.html",
    "mlperf_log_summary.txt",
    "mlperf_log_detail.txt",
    "records*.jsonl",
    "*.records.jsonl",
    "engine.log",
)


def apply_seed_set(settings: RunSettings, options: RunOptions) -> None:
    """--seed-set: the set's sample-index seed becomes the run's seed, its scheduler seed the arrivals'."""
    if options.seed is not None:
        raise UsageError("--seed and --seed-set both given; fix: one of them (a seed set has its own seeds)")
    assert options.seed_set is not None
    try:
        seeds = load_seed_set(options.seed_set)
    except SeedSetError as e:
        raise UsageError(str(e)) from e
    settings.seed = seeds.sample_index_rng_seed
    settings.schedule_seed = seeds.scheduler_rng_seed
    settings.model_seed = seeds.model_seed
    settings.seed_set = seeds.record()


@dataclass
class Prepared:
    """A run's inputs, checked: settings (the endpoint's host and model come once it is open), the
    effective profile, its workload (tokenizer and any trace already loaded) and the SLOs to judge."""

    settings: RunSettings
    profile: Profile
    profile_path: Path
    workload: Workload
    slos: list[AnySlo]
    api_key: str | None = None  # read once to check it; never stored in settings or files
    hosts: list[str] = field(
        default_factory=list
    )  # every endpoint given, in order (none: the embedded engine)
    out: Path | None = None  # the run folder, when asked for

    @property
    def host(self) -> str | None:
        """The first endpoint given (None: the embedded engine)."""
        return self.hosts[0] if self.hosts else None


def prepare(
    options: RunOptions,
    *,
    host: str = "",
    endpoints: EndpointOptions | None = None,
    run_folder: bool = True,
) -> Prepared:
    """What `run`, `master`, `ui` and `sweep` share: the profile loaded and the load options checked,
    then settings from ``options``, the profile with its overrides, the workload, the SLOs and the API
    key; with ``endpoints``, the endpoints, their balance and their hardware and price; the duration;
    with ``run_folder``, the run folder (new, or cleared with ``options.force``). ``host``: the
    endpoint when it is known already (`master`). UsageError with one line on bad input."""
    _, profile_path = load_profile(options.profile)
    if options.processes < 1:
        raise UsageError(f"{options.processes_option} must be ≥ 1")
    if options.concurrency is not None and not 1 <= options.concurrency <= MAX_CONCURRENCY:
        raise UsageError(f"--concurrency {options.concurrency}: give 1 to {MAX_CONCURRENCY:,} streams")
    if options.rate is not None and not 0 < options.rate <= MAX_RATE:
        raise UsageError(f"--rate {options.rate:g}: give more than 0 and at most {MAX_RATE:,.0f} requests/s")
    prepared = prepare_settings(options, profile_path, host=host)
    if endpoints is not None:
        prepared.hosts = _endpoints(prepared.settings, endpoints)
    prepared.settings.duration_s = run_duration(options, prepared.profile, prepared.workload)
    _check_ramp(prepared.profile, profile_path, options, prepared.settings.duration_s)
    if run_folder:
        prepared.out = out_dir(options, prepared.profile.name)
        prepared.settings.out_dir, prepared.settings.run_id = str(prepared.out), prepared.out.name
    return prepared


def prepare_settings(options: RunOptions, profile_path: Path, *, host: str = "") -> Prepared:
    """Settings from ``options``, the profile with its overrides (client policy, judging), the workload
    and the SLOs, the API key read once (and redacted from every log line from now on)."""
    settings = RunSettings(
        run_id="",
        profile_ref=str(profile_path),
        host=host,
        out_dir="",
        duration_s=0.0,
        seed=0,
        concurrency=options.concurrency,
        rate=options.rate,
        ramp_up_s=_seconds(options.ramp_up, "--ramp-up") if options.ramp_up else None,
        api_key_env=_api_key_env(options),
        api_key_file=str(Path(options.api_key_file).expanduser().resolve()) if options.api_key_file else None,
        processes=options.processes,
        verify_tls=options.verify_tls,
        network=NetworkPolicy.from_env(ca_bundle=options.ca_bundle, verify_tls=options.verify_tls),
        tokenizer=options.tokenizer,
        dataset=_dataset_path(options.dataset),
        slo=options.slo,
        progress_s=options.progress_s,
        max_requests=options.max_requests,
        session_header=_session_header(options.session_header),
    )
    assert settings.network is not None
    if why := settings.network.check():
        raise UsageError(why)
    try:
        api_key = load_api_key(settings.api_key_env, settings.api_key_file)
    except KeySourceError as e:
        raise UsageError(str(e)) from e
    install_redaction(api_key)
    profile, _ = settings.profile()
    _apply_client_policy(settings, profile, options)
    settings.capture = capture_rule(profile, options)
    settings.seed = profile.seed if options.seed is None else options.seed
    if options.seed_set:
        apply_seed_set(settings, options)
    try:
        # checks the tokenizer and reads any trace now; the run nonce is the one every worker gets
        workload = settings.workload(profile)
        workload.request(0)  # the first unit built: what every request needs (files, images, lengths)
        if settings.max_requests is None:  # dataset.passes: the run ends after its whole passes
            settings.max_requests = workload.pass_units
    except (ValueError, OSError, TraceFormatError) as e:
        raise UsageError(f"{profile_path}: {e}") from e
    profile = with_judging(profile, options)
    try:
        slos = merge_slos(profile.slos, options.slo)
    except ValueError as e:
        raise UsageError(f"--slo {e}" if options.slo else f"{profile_path}: slos: {e}") from e
    return Prepared(settings, profile, profile_path, workload, slos, api_key)


def _endpoints(settings: RunSettings, options: EndpointOptions) -> list[str]:
    """The endpoints (``--host`` values, then the hosts file's), their balance mode and the endpoint
    description into ``settings``; every endpoint given, in order."""
    try:
        hosts = list(options.hosts)
        if options.hosts_file:
            hosts += read_hosts_file(options.hosts_file)
        seen: set[str] = set()
        unique = [h for h in hosts if not (h.rstrip("/") in seen or seen.add(h.rstrip("/")))]  # type: ignore[func-returns-value]
        if len(unique) < len(hosts):
            raise ValueError(
                "the same endpoint is given twice (--host / --hosts-file): give each replica once"
            )
        spec = spec_from_options(options.hardware, options.endpoint_file)
    except (ValueError, EndpointSpecError) as e:
        raise UsageError(str(e)) from e
    settings.hosts = unique if len(unique) > 1 else None
    settings.balance = options.balance or "round-robin"
    settings.endpoint_spec = spec.model_dump() if spec is not None else None
    return unique


def _dataset_path(given: str | None) -> str | None:
    """--dataset's file, absolute (every process reads it at that path); UsageError when it is not there."""
    if not given:
        return None
    path = Path(given).expanduser().resolve()
    if not path.exists():
        raise UsageError(f"--dataset {given}: no such file or folder (give the prompt file's path)")
    return str(path)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``500ms``, ``5m``, ``1h`` in seconds (> 0); UsageError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise UsageError(f"--duration {text!r}: use a number of seconds or 90s, 5m, 1h")
    value, unit = float(m.group(1)), m.group(2) or "s"
    seconds = value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    if seconds <= 0:
        raise UsageError("--duration must be positive")
    return seconds


def ensure_writable(folder: Path, what: str) -> Path:
    """Create ``folder`` and prove it takes a file, before any run starts (a clear error otherwise)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"{what} {folder} is not writable: {e.strerror or e}") from e
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        raise UsageError(
            f"{what} {folder} has only {free / 2**20:.1f} MiB free: a run needs at least "
            f"{MIN_FREE_BYTES // 2**20} MiB for its records and report (free space, or choose --out elsewhere)"
        )
    return folder


def out_dir(options: RunOptions, profile_name: str) -> Path:
    """The run folder: new, or (``force``) an old run's folder cleared of that run's files.

    Appending a run's records to another's would mix two runs in every report, export and comparison."""
    out = (
        Path(options.out)
        if options.out
        else Path("reports") / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile_name}"
    )
    old = sorted({f for pattern in RUN_FILES for f in out.glob(pattern)}) if out.is_dir() else []
    if old and not options.force:
        names = ", ".join(f.name for f in old[:3]) + (", …" if len(old) > 3 else "")
        raise UsageError(
            f"--out {out} already holds a run ({names}): give a new folder, or --force to replace that run"
        )
    for f in old:
        f.unlink()
    return ensure_writable(out, "output folder")


def _api_key_env(options: RunOptions) -> str | None:
    if options.api_key_file:
        if options.api_key_env:
            raise UsageError("give the API key by --api-key-env or --api-key-file, not both")
        return None
    if options.api_key_env:
        if not os.environ.get(options.api_key_env):
            raise UsageError(
                f"--api-key-env {options.api_key_env}: that environment variable is not set or empty"
            )
        return options.api_key_env
    return "OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else None


def _session_header(given: str | None) -> str | None:
    """--session-header NAME (or ``none``), checked: a header name loadtest may send."""
    if given is None or given.lower() == "none":
        return given
    problem = header_name_error(given)
    if problem:
        raise UsageError(f"--session-header: {problem}; give a name like {SESSION_HEADER}, or none")
    return given


def _apply_client_policy(settings: RunSettings, profile: Profile, options: RunOptions) -> None:
    """Timeouts and retries: the profile's ``client`` section, each overridden by its command-line option."""
    client = profile.client

    def pick(option: str, value: float | None, default: float) -> float:
        if value is None:
            return default
        if value < 0 or (value == 0 and option != "total_timeout"):
            raise UsageError(f"--{option.replace('_', '-')} must be > 0")
        return float(value)

    settings.connect_timeout = pick("connect_timeout", options.connect_timeout, client.connect_timeout_s)
    settings.read_timeout = pick("read_timeout", options.read_timeout, client.read_timeout_s)
    settings.total_timeout = pick("total_timeout", options.total_timeout, client.total_timeout_s)
    retries = client.retries.model_dump()
    n = options.retries
    if n is not None:
        if not 0 <= n <= 10:
            raise UsageError("--retries must be between 0 and 10")
        retries["max"] = n
    settings.retries = retries


SCHEDULE_TAIL_S = 1.0
"""A schedule that ends by itself issues until this long after its last arrival: the dispatcher's clock
starts when its user does, a little after the run's, so a window ending at the last arrival misses it."""


def run_duration(options: RunOptions, profile: Profile, workload: Workload) -> float:
    """--duration, else the length of a schedule that ends by itself (trace, stages) plus its tail, so
    that its last arrival is sent; else the profile's."""
    if options.duration:
        return parse_duration(options.duration)
    span = workload.schedule_span_s
    return span + SCHEDULE_TAIL_S if span is not None else profile.duration_s


def capture_rule(profile: Profile, options: RunOptions) -> dict[str, Any] | None:
    """The capture rule (CaptureSpec fields): --capture N or --capture-rate R over the profile's
    ``capture`` (its max_chars kept); None: no capture."""
    base = profile.capture.model_dump() if profile.capture is not None else {}
    if options.capture is None and options.capture_rate is None:
        return base or None
    if options.capture is not None and options.capture < 1:
        raise UsageError(f"--capture {options.capture}: give a number of requests ≥ 1")
    if options.capture_rate is not None and not 0 < options.capture_rate <= 1:
        raise UsageError(f"--capture-rate {options.capture_rate}: give a fraction 0 < R ≤ 1 (e.g. 0.01)")
    rule = {**base, "first": options.capture, "sample": options.capture_rate}
    try:
        return CaptureSpec.model_validate(rule).model_dump()
    except ValueError as e:
        raise UsageError(f"--capture / --capture-rate: {e}") from e


def with_judging(profile: Profile, options: RunOptions) -> Profile:
    """The profile with --warmup / --cooldown / --generator-health / --smoke applied (commands without them leave
    it as it is)."""
    update: dict[str, Any] = {}
    if options.generator_health:
        update["generator_health"] = options.generator_health
    if options.smoke:
        update["smoke"] = True
    for flag, key in ((options.warmup, "warmup_s"), (options.cooldown, "cooldown_s")):
        if flag:
            option = "--warmup" if key == "warmup_s" else "--cooldown"
            update[key] = "auto" if flag.strip() == "auto" else _seconds(flag, option, " or auto")
    return (
        profile.model_copy(update={"judging": profile.judging.model_copy(update=update)})
        if update
        else profile
    )


def _seconds(text: str, option: str, also: str = "") -> float:
    """--warmup / --cooldown / --ramp-up seconds: like --duration, but 0 is allowed (``--warmup 0``: judge
    from the start; ``--ramp-up 0``: every stream at once); ``also``: what else the option takes."""
    if re.fullmatch(r"\s*0+(?:\.0*)?\s*(ms|s|m|h)?\s*", text):
        return 0.0
    try:
        return parse_duration(text)
    except UsageError:
        raise UsageError(f"{option} {text!r}: use seconds like 30s, 2m, 0{also}") from None


def _check_ramp(profile: Profile, path: Path, options: RunOptions, duration_s: float) -> None:
    """A ramp set by --ramp-up or load.ramp_up_s must end before the run does (UsageError naming it)."""
    ramp = profile.load.ramp_up_s
    if ramp is None or ramp < duration_s:
        return
    what = f"--ramp-up {options.ramp_up}" if options.ramp_up else f"{path}: load.ramp_up_s {ramp:g}"
    raise UsageError(
        f"{what}: the streams would still be starting when the {duration_s:g} s run ends; give a ramp "
        "shorter than the duration (or a longer --duration)"
    )
