"""The endpoint options every command that talks to an endpoint shares: --host (several times),
--hosts-file, --balance and --endpoint-check (docs/multi-endpoint.md, docs/reliability.md)."""

from __future__ import annotations

import argparse
from typing import Any

from loadtest.client.balancer import BALANCE_MODES
from loadtest.client.preflight import CHECK_MODELS, check_mode


class HostAction(argparse.Action):
    """``--host`` given several times: ``args.hosts`` holds them all, ``args.host`` the first."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        given = [h.strip() for h in str(values).split(",") if h.strip()]  # a,b: two replicas
        hosts = [*(getattr(namespace, "hosts", None) or []), *(given or [str(values)])]
        namespace.hosts = hosts
        namespace.host = hosts[0]


def add_hosts_options(parser: argparse.ArgumentParser) -> None:
    """``-H/--host`` (several times: a fleet), --hosts-file and --balance; without them, the embedded engine."""
    parser.add_argument(
        "-H",
        "--host",
        action=HostAction,
        metavar="URL",
        help="endpoint base URL, e.g. http://10.0.0.5:8000; give it again (or a comma-separated list) "
        "for each replica (default: start the embedded engine)",
    )
    add_fleet_options(parser)


def add_fleet_options(parser: argparse.ArgumentParser) -> None:
    """--hosts-file and --balance (``--host`` itself uses HostAction)."""
    parser.add_argument(
        "--hosts-file",
        metavar="FILE",
        help="replicas' base URLs, one a line (# comments); added to any --host (docs/multi-endpoint.md)",
    )
    parser.add_argument(
        "--balance",
        choices=BALANCE_MODES,
        default="round-robin",
        help="how requests spread over several endpoints; session keeps every turn of a session on one "
        "replica (default: %(default)s)",
    )


def add_endpoint_check_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--endpoint-check models|none|PATH``: what is asked of the endpoint before the run."""

    def parse(value: str) -> str:
        try:
            return check_mode(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e

    parser.add_argument(
        "--endpoint-check",
        type=parse,
        default=CHECK_MODELS,
        metavar="models|none|PATH",
        help="before the run: GET /v1/models (default), nothing (none), or GET PATH, e.g. /health, "
        "where any 2xx passes (servers without a JSON model list; give --model)",
    )
