"""Where a run's requests go: the given host, or the embedded engine started for it; checked before the run."""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.client.apis import auth_headers
from loadtest.client.http import Endpoint as HttpEndpoint
from loadtest.client.preflight import CHECK_MODELS, EndpointError, ServedModel, served_models
from loadtest.profile.schema import Profile
from loadtest.sim.start import EngineOverrides


class EndpointSetupError(Exception):
    """One line for the user; ``usage`` tells bad input (exit 2) from an endpoint that failed (exit 1)."""

    def __init__(self, message: str, usage: bool) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class Endpoint:
    host: str
    models: list[str]
    model: str | None
    engine_info: dict[str, Any] | None  # the embedded engine's configuration, when one was started
    server: dict[str, Any] | None = None  # what `loadtest serve` started there (engine, version, argv)
    served: list[ServedModel] = field(default_factory=list)  # /v1/models as listed (context windows)

    def served_model(self) -> ServedModel | None:
        """The /v1/models entry of the model the run requests, when the server listed it."""
        return next((m for m in self.served if m.id == self.model), None)


def open_endpoint(
    stack: contextlib.ExitStack,
    args: argparse.Namespace,
    profile: Profile,
    seed: int,
    api_key: str | None,
    engine_log: Path | None = None,
) -> Endpoint:
    """``args.host``, or the embedded engine with the profile's preset (stopped when ``stack`` closes),
    then ``GET /v1/models``; raises EndpointSetupError with one line on any problem."""
    host, engine_info = args.host, None
    if host:
        try:
            HttpEndpoint.parse(host)  # a malformed URL, or one with credentials in it, is bad input
        except ValueError as e:
            raise EndpointSetupError(str(e), usage=True) from e
    if not host:
        from loadtest.sim.start import EngineStartError, start_engine

        try:
            started = start_engine(stack, engine_overrides(args), profile, seed, engine_log)
        except EngineStartError as e:
            raise EndpointSetupError(str(e), usage=e.usage) from e
        host, engine_info = started["url"], started["engine"]
    from loadtest.serve.state import server_info_for

    try:
        server = (
            None if engine_info is not None else server_info_for(host, getattr(args, "server_info", None))
        )
    except ValueError as e:
        raise EndpointSetupError(str(e), usage=True) from e
    try:
        served = served_models(
            host,
            api_key,
            timeout=args.connect_timeout or 10.0,
            verify_tls=not getattr(args, "insecure", False),
            headers=auth_headers(api_key, profile),
            check=getattr(args, "endpoint_check", CHECK_MODELS) if engine_info is None else CHECK_MODELS,
        )
    except EndpointError as e:
        raise EndpointSetupError(str(e), usage=False) from e
    models = [m.id for m in served]
    model = args.model or profile.model or (models[0] if models else None)
    return Endpoint(host, models, model, engine_info, server, served)


def engine_overrides(args: argparse.Namespace) -> EngineOverrides:
    """The --engine-* options of run, ui and sweep (``--engine-max-num-seqs`` is sweep's only)."""
    return EngineOverrides(
        gpu=args.engine_gpu,
        model=args.engine_model,
        tp=args.engine_tp,
        faults=args.engine_faults,
        speedup=args.engine_speedup,
        max_num_seqs=getattr(args, "engine_max_num_seqs", None),
    )
