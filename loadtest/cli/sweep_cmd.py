"""``loadtest sweep``: concurrency or rate ladders and the rate search, one run folder per point."""

from __future__ import annotations

import argparse

from loadtest.cli.common_options import (
    add_out_option,
    client_parent,
    engine_parent,
    telemetry_parent,
    workload_parent,
)
from loadtest.cli.endpoint_flags import add_endpoint_check_option
from loadtest.cli.endpoint_options import add_endpoint_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``sweep`` subcommand (docs/sweep.md)."""
    s = sub.add_parser(
        "sweep",
        help="run a concurrency or rate ladder, or search the highest rate meeting the SLOs; write sweep.html",
        description="Each point is a full `loadtest run` folder under OUT/points/; OUT/sweep.json and "
        "OUT/sweep.html summarize them (docs/sweep.md).",
        parents=[
            workload_parent("a point"),
            client_parent(),
            telemetry_parent(),
            engine_parent("; one engine for every point"),
        ],
    )
    s.add_argument(
        "-H",
        "--host",
        metavar="URL",
        help="endpoint base URL (default: start one embedded engine for the whole sweep)",
    )
    add_endpoint_check_option(s)
    s.add_argument(
        "--ladder",
        choices=("concurrency", "rate", "search"),
        default="concurrency",
        help="concurrency ladder (closed loop), rate ladder (open loop), or a search for the highest "
        "rate that meets the SLOs (default: %(default)s)",
    )
    s.add_argument("--points", metavar="LIST", help="the ladder's levels, e.g. 1,2,4,8 (streams or req/s)")
    s.add_argument("--min", type=float, metavar="X", help="lowest level (concurrency: 1; rate: max/steps)")
    s.add_argument(
        "--max",
        type=float,
        metavar="X",
        help="highest level (concurrency: 128; rate and search: the offline point's requests/s)",
    )
    s.add_argument("--steps", type=int, metavar="N", help="levels between --min and --max (rate: 8)")
    s.add_argument(
        "--offline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add the offline point (concurrency ladder: on; rate and search: on when --max is not given)",
    )
    s.add_argument(
        "--offline-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="streams of the offline point's closed loop (default: 256, or twice the ladder's top if higher; "
        "over a one-scenario dataset profile: the dataset's size, every query at once for whole passes)",
    )
    s.add_argument(
        "--point-duration", metavar="S", help="how long each point issues requests (default: the profile's)"
    )
    s.add_argument(
        "--stop-at-saturation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stop climbing a ladder once throughput stops growing or errors explode (default: on)",
    )
    s.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="F",
        help="search: stop when the bracket is within this fraction of its failing rate (default: 0.05)",
    )
    s.add_argument(
        "--max-iterations",
        type=int,
        default=None,
        metavar="N",
        help="search: at most N runs, the two bounds included (default: 10)",
    )
    s.add_argument("--processes", type=int, default=1, metavar="N", help="Locust processes per point")
    add_out_option(s, "the sweep folder (default: reports/<timestamp>-<profile>-sweep/)")
    s.add_argument(
        "--mlperf-endpoints",
        metavar="DIR",
        help="also write the concurrency points as an MLPerf Endpoints v1.0 submission bundle in DIR "
        "(cli_metadata.json, src/, docs/, results/<system>/<model>/r<N>/); the declarations come from "
        "--endpoint-file (system:, system_power:, submission:) and --seed-set (docs/sweep.md)",
    )
    s.add_argument(
        "--accuracy",
        metavar="BENCH:FILE",
        help="after each point the v1.0 plan marks mandatory (every point without a plan), an accuracy run "
        "of FILE at the point's concurrency against the same endpoint, its accuracy.json in the point's "
        "folder and in the bundle (docs/accuracy.md)",
    )
    s.add_argument(
        "--engine-reference",
        action="store_true",
        help="with --accuracy: the embedded engine answers the dataset's prompts with their references "
        "(whole answers; the streamed load is unchanged): tests the accuracy path",
    )
    s.add_argument(
        "--c-max",
        type=int,
        metavar="N",
        help="the declared Maximum Supported Concurrency (default: --endpoint-file's "
        "system.max_supported_concurrency): with --mlperf-endpoints and no --points, the ladder is the "
        "v1.0 plan's points, each as long as the rules ask unless --point-duration",
    )
    s.add_argument(
        "--plan",
        action="store_true",
        help="print the MLPerf Endpoints v1.0 point plan for the declared C_max (points, regions, "
        "minimum durations, total time) and exit without running (docs/sweep.md)",
    )
    add_endpoint_options(s)  # hardware and price, passed to every point (docs/economics.md)


def sweep_command(args: argparse.Namespace) -> int:
    from loadtest.cli.sweep_run import run_sweep

    return run_sweep(args)
