"""Options of the one supervised run (:mod:`tokenkeys.process.run`) that ``serve`` and ``route``
share: how long a drain may take and how many processes share the ports."""

from __future__ import annotations

import argparse

from tokenkeys.errors import ConfigError
from tokenkeys.process.supervisor import check_worker_count


def add_run_options(parser: argparse._ActionsContainer, *, in_flight: str, processes: str) -> None:
    """``--shutdown-timeout`` and ``--processes``; ``in_flight`` names what the drain waits for
    ("calls", "requests") and ``processes`` is the command's own help for ``--processes``."""
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help=f"on SIGTERM/SIGINT, how long {in_flight} in flight may take to finish (default 30)",
    )
    parser.add_argument("--processes", type=int, default=1, metavar="N", help=processes)


def check_run_options(args: argparse.Namespace) -> None:
    """The run options in range: ``--processes`` 1..MAX_WORKERS, ``--shutdown-timeout`` >= 0."""
    check_worker_count(getattr(args, "processes", 1))
    if args.shutdown_timeout < 0:
        raise ConfigError("--shutdown-timeout must be >= 0", field="shutdown-timeout")
