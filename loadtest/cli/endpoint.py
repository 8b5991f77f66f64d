"""Where a run's requests go: the given host, or the embedded engine started for it; checked before the run."""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.client.preflight import EndpointError, list_models
from loadtest.profile.schema import Profile


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
    if not host:
        from loadtest.sim import SimProcess
        from loadtest.sim.presets import get_gpu, get_model

        gpu = args.engine_gpu or profile.engine.gpu
        engine_model = args.engine_model or profile.engine.model
        tp = args.engine_tp or profile.engine.tp
        try:
            get_gpu(gpu)
            get_model(engine_model)
        except ValueError as e:
            raise EndpointSetupError(
                f"embedded engine preset: {e} (--engine-gpu, --engine-model, or the profile's engine)",
                usage=True,
            ) from e
        try:
            sim = stack.enter_context(
                SimProcess(
                    gpu=gpu,
                    model=engine_model,
                    tp=tp,
                    faults=args.engine_faults or profile.engine.faults,
                    speedup=args.engine_speedup,
                    seed=seed,
                    stderr_path=engine_log,
                )
            )
        except (RuntimeError, ValueError) as e:
            raise EndpointSetupError(f"embedded engine did not start: {e}", usage=False) from e
        host = sim.base_url
        engine_info = sim.stats().get("config")
        gpus = f"{tp}×{gpu}" if tp > 1 else gpu
        print(f"embedded engine: {engine_model} on {gpus} (speed-up {args.engine_speedup:g}x) at {host}")
    from loadtest.serve.state import server_info_for

    try:
        server = None if engine_info is not None else server_info_for(host, getattr(args, "server_info", None))
    except ValueError as e:
        raise EndpointSetupError(str(e), usage=True) from e
    try:
        models = list_models(
            host,
            api_key,
            timeout=args.connect_timeout or 10.0,
            verify_tls=not getattr(args, "insecure", False),
        )
    except EndpointError as e:
        raise EndpointSetupError(str(e), usage=False) from e
    model = args.model or profile.model or (models[0] if models else None)
    return Endpoint(host, models, model, engine_info, server)
