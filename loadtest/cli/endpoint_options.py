"""The hardware and price options of run and sweep (docs/economics.md), read into the endpoint description."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtest.economics.spec import OPTION_FIELDS, EndpointSpec, EndpointSpecError, spec_from_options
from loadtest.errors import UsageError


def spec_from_args(args: argparse.Namespace) -> EndpointSpec | None:
    """The run's endpoint description from --endpoint-file and the single options (EndpointSpecError)."""
    options = {opt: getattr(args, opt, None) for opt in OPTION_FIELDS}
    return spec_from_options(options, getattr(args, "endpoint_file", None))


def add_endpoint_options(parser: argparse.ArgumentParser) -> None:
    """--gpu-kind, --gpu-count, --price-gpu-hour | --price-in-per-m/--price-out-per-m, --endpoint-file."""
    g = parser.add_argument_group("hardware and price behind the endpoint (docs/economics.md)")
    g.add_argument(
        "--gpu-kind", metavar="NAME", help="GPU model serving the endpoint, e.g. H200 (default: unknown)"
    )
    g.add_argument("--gpu-count", type=int, metavar="N", help="GPUs serving the endpoint, over every replica")
    g.add_argument("--price-gpu-hour", type=float, metavar="USD", help="price of one GPU-hour")
    g.add_argument("--price-in-per-m", type=float, metavar="USD", help="price per million input tokens")
    g.add_argument("--price-out-per-m", type=float, metavar="USD", help="price per million output tokens")
    g.add_argument("--currency", metavar="CODE", help="currency of the prices (default: USD)")
    g.add_argument(
        "--endpoint-file", metavar="YAML", help="hardware: and price: in a file (options override it)"
    )


def endpoint_args(args: argparse.Namespace) -> list[str]:
    """The same options as `loadtest run` arguments (a sweep passes them to every point), checked first
    (UsageError with one line on bad input)."""
    try:
        spec_from_args(args)
    except EndpointSpecError as e:
        raise UsageError(str(e)) from e
    out: list[str] = []
    for opt in (*OPTION_FIELDS, "endpoint_file"):
        value = getattr(args, opt, None)
        if value is not None:
            flag = "--" + opt.replace("_", "-")
            out += [flag, str(Path(value).resolve()) if opt == "endpoint_file" else f"{value}"]
    return out
