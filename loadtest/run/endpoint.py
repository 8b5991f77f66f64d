"""Where a run's requests go: the given host, or the embedded engine started for it; checked before the
run (``GET /v1/models`` on every endpoint, the served context window), and the tokenizer settled once the
served model is known. Bad input raises UsageError, an endpoint that fails LoadtestError (exit 1)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.client.http import Endpoint as HttpEndpoint
from loadtest.client.preflight import (
    CHECK_MODELS,
    EndpointError,
    ModelNotServed,
    ServedModel,
    check_headers,
    require_served,
    served_models,
)
from loadtest.errors import LoadtestError, UsageError
from loadtest.profile.schema import Profile
from loadtest.run.inputs import Prepared
from loadtest.run.options import EndpointOptions
from loadtest.run.tokens import settle_tokenizer
from loadtest.sim.start import EngineOverrides, EngineStartError, start_engine
from loadtest.workload.builder import Workload
from loadtest.workload.context_fit import check_fit, scenarios_over


@dataclass
class EndpointFacts:
    """What run.json's ``endpoint`` says of it: the served models, the embedded engine's configuration,
    the server `loadtest serve` started there and the served model's context window (when known)."""

    models: list[str]
    engine_info: dict[str, Any] | None = None
    server: dict[str, Any] | None = None
    max_model_len: int | None = None


@dataclass
class Endpoint:
    host: str
    models: list[str]
    model: str | None
    engine_info: dict[str, Any] | None  # the embedded engine's configuration, when one was started
    server: dict[str, Any] | None = None  # what `loadtest serve` started there (engine, version, argv)
    served: list[ServedModel] = field(default_factory=list)  # /v1/models as listed (context windows)
    notes: list[str] = field(default_factory=list)  # run.json notes of the checks (some prompts too long)

    def served_model(self) -> ServedModel | None:
        """The /v1/models entry of the model the run requests, when the server listed it."""
        return next((m for m in self.served if m.id == self.model), None)

    def facts(self) -> EndpointFacts:
        served = self.served_model()
        return EndpointFacts(
            self.models, self.engine_info, self.server, served.max_model_len if served is not None else None
        )


RECORDED_ANSWERS = "recorded_answers.jsonl"  # --engine-recorded: what the engine answers recorded calls with
_MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls")


def write_recorded_answers(workload: Workload, path: Path) -> Path:
    """Every recorded call with an expected answer, as the engine's ``--recorded-answers`` file: one
    ``{"messages", "answer"}`` line each (the answer the recorded assistant message); UsageError when the
    profile replays no such recording."""
    lines = [
        json.dumps(
            {
                "messages": list(rec.messages),
                "answer": {k: v for k, v in rec.expected.items() if k in _MESSAGE_KEYS},
            }
        )
        for trace in workload.agent_traces.values()
        for conv in trace.conversations
        for call in conv.calls()
        if (rec := call.recorded) is not None and rec.expected is not None
    ]
    if not lines:
        raise UsageError(
            "--engine-recorded: the profile replays no recorded call with an expected answer; give an "
            "agent_trace scenario with an MLPerf agentic recording (docs/traces.md)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def start_embedded(
    stack: contextlib.ExitStack, opts: EngineOverrides, profile: Profile, seed: int, log: Path | None
) -> dict[str, Any]:
    """``sim.start.start_engine`` (stopped when ``stack`` closes): a bad preset is a UsageError, an
    engine that does not start a LoadtestError."""
    try:
        return start_engine(stack, opts, profile, seed, log)
    except EngineStartError as e:
        raise (UsageError(str(e)) if e.usage else LoadtestError(str(e))) from e


def open_endpoint(
    stack: contextlib.ExitStack,
    prepared: Prepared,
    options: EndpointOptions,
    *,
    connect_timeout: float | None,
    engine_log: Path | None = None,
) -> Endpoint:
    """The first endpoint given, or the embedded engine with the profile's preset and ``options.engine``
    (stopped when ``stack`` closes), then ``GET /v1/models`` (``connect_timeout``: the option's, else
    10 s)."""
    host, engine_info = prepared.host, None
    profile, api_key = prepared.profile, prepared.api_key
    if host:
        if options.engine.recorded:
            raise UsageError("--engine-recorded is for the embedded engine; leave out --host")
        try:
            HttpEndpoint.parse(host)  # a malformed URL, or one with credentials in it, is bad input
        except ValueError as e:
            raise UsageError(str(e)) from e
    else:
        engine = options.engine
        if engine.recorded:  # the recordings' answers, for the engine to answer each recorded call with
            where = prepared.out or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="loadtest-")))
            path = write_recorded_answers(prepared.workload, where / RECORDED_ANSWERS)
            engine = dataclasses.replace(engine, recorded_answers=str(path))
        started = start_embedded(stack, engine, profile, prepared.settings.seed, engine_log)
        host, engine_info = started["url"], started["engine"]
        prepared.settings.network = prepared.settings.policy().direct()  # on this host: never proxied
    from loadtest.serve.state import server_info_for

    try:
        server = None if engine_info is not None else server_info_for(host, options.server_info)
    except ValueError as e:
        raise UsageError(str(e)) from e
    try:
        served = served_models(
            host,
            api_key,
            timeout=connect_timeout or 10.0,
            network=prepared.settings.policy(),
            headers=check_headers(api_key, profile),
            check=options.endpoint_check if engine_info is None else CHECK_MODELS,
            api=profile.api,
        )
    except EndpointError as e:
        raise LoadtestError(str(e)) from e
    if engine_info is None:  # the embedded engine answers its preset's aliases too
        check_model(options, profile, served, host)
    models = [m.id for m in served]
    model = options.model or profile.model or (models[0] if models else None)
    return Endpoint(host, models, model, engine_info, server, served)


def check_model(
    options: EndpointOptions, profile: Profile, served: list[ServedModel], host: str, first: str | None = None
) -> None:
    """UsageError (exit 2) when the model the run asks for (--model, else the profile's, else ``first``:
    the model the first endpoint serves) is not in ``host``'s /v1/models list; nothing listed (no check,
    or no list): no check."""
    model, given_by = (
        (options.model, "--model")
        if options.model
        else (profile.model, "the profile's model")
        if profile.model
        else (first, "the first endpoint's model")
    )
    try:
        require_served(model, served, host, given_by)
    except ModelNotServed as e:
        raise UsageError(str(e)) from e


def connect(
    stack: contextlib.ExitStack,
    prepared: Prepared,
    options: EndpointOptions,
    *,
    connect_timeout: float | None,
    engine_log: Path | None = None,
    check_context: bool = True,
) -> Endpoint:
    """``open_endpoint``, its host and model into the settings, every other replica checked, the
    served model's own tokenizer settled (``prepared``'s profile and workload updated), and with
    ``check_context`` the first requests against the served context window (``Endpoint.notes``)."""
    ep = open_endpoint(stack, prepared, options, connect_timeout=connect_timeout, engine_log=engine_log)
    settings = prepared.settings
    settings.host, settings.model, settings.embedded = ep.host, ep.model, ep.engine_info is not None
    check_replicas(prepared, options, connect_timeout=connect_timeout)
    # vLLM lists its served name as the id and the weights' folder or hub id as `root`
    served = ep.served_model()
    root = served.root if served is not None and served.root else ep.model
    prepared.profile, prepared.workload = settle_tokenizer(
        settings, prepared.profile, prepared.workload, root, ep.engine_info
    )
    if check_context:
        ep.notes = context_notes(ep, prepared.workload, prepared.profile_path)
    return ep


def connect_host(prepared: Prepared, options: EndpointOptions) -> Endpoint:
    """`master`: ``GET /v1/models`` (``options.endpoint_check``) on the settings' host, every worker's
    endpoint; the model checked and into the settings, the served model's own tokenizer settled, and the
    first requests against the served context window (``Endpoint.notes``)."""
    settings, profile, api_key = prepared.settings, prepared.profile, prepared.api_key
    try:
        served = served_models(
            settings.host,
            api_key,
            timeout=settings.connect_timeout,
            network=settings.policy(),
            headers=check_headers(api_key, profile),
            check=options.endpoint_check,
            api=profile.api,
        )
    except EndpointError as e:
        raise LoadtestError(str(e)) from e
    check_model(options, profile, served, settings.host)
    models = [m.id for m in served]
    settings.model = options.model or profile.model or (models[0] if models else None)
    root = next((m.root for m in served if m.id == settings.model and m.root), settings.model)
    prepared.profile, prepared.workload = settle_tokenizer(settings, profile, prepared.workload, root, None)
    ep = Endpoint(settings.host, models, settings.model, None, None, served)
    ep.notes = context_notes(ep, prepared.workload, prepared.profile_path)  # as `run` checks them
    return ep


def check_replicas(prepared: Prepared, options: EndpointOptions, *, connect_timeout: float | None) -> None:
    """``GET /v1/models`` on every replica after the first (``open_endpoint`` checked that one)."""
    settings, api_key = prepared.settings, prepared.api_key
    headers = check_headers(api_key, prepared.profile)
    for host in (settings.hosts or [])[1:]:
        try:
            served = served_models(
                host,
                api_key,
                timeout=connect_timeout or 10.0,
                network=settings.policy(),
                headers=headers,
                check=options.endpoint_check,
                api=prepared.profile.api,
            )
        except EndpointError as e:
            raise LoadtestError(f"replica {host}: {e}") from e
        check_model(options, prepared.profile, served, host, first=settings.model)


def context_notes(ep: Endpoint, workload: Workload, profile_path: Path) -> list[str]:
    """Check the profile's shortest requests, then the workload's first requests, against the served
    context window before the run.

    Nothing can fit: UsageError (the run could only fail). Some cannot: a warning now and a run.json note."""
    served = ep.served_model()
    if served is None or not served.max_model_len:
        return []
    window = f"{served.id}'s context of {served.max_model_len} tokens (/v1/models max_model_len)"
    over, every = scenarios_over(workload.profile, served.max_model_len)
    named = ", ".join(f"{name} ({need:,} tokens)" for name, need in over[:10])
    if every:
        raise UsageError(
            f"{profile_path}: no request can fit {window}: the shortest request of scenario {named} "
            "(its smallest input + output length) is longer: shorten the profile's input_tokens / "
            "output_tokens, or serve the model with a longer context (vLLM --max-model-len)"
        )
    notes = []
    if over:
        notes.append(
            f"warning: no request of scenario {named} can fit {window}: each will fail "
            "(outcome context_length); shorten its lengths, or serve a longer context"
        )
        print(notes[-1], flush=True)
    fit = check_fit(workload, served.max_model_len)
    if fit.nothing_fits:
        raise UsageError(
            f"{profile_path}: every prompt of the first {fit.sampled} requests is longer than {served.id}'s "
            f"context of {served.max_model_len} tokens (/v1/models max_model_len): shorten the profile's "
            "input lengths, or serve the model with a longer context (vLLM --max-model-len)"
        )
    if not fit.over or over:  # a scenario that cannot fit was named already
        return notes
    note = f"warning: {fit.message()}"
    print(note, flush=True)
    return [*notes, note]
