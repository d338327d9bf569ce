"""Options of the log of a serving command (``serve`` and ``route``): level, format, access log.

The log itself is :mod:`tokenkeys.process.logs`; the access log is
:mod:`tokenkeys.frontend.access_log`.
"""

from __future__ import annotations

import argparse

from tokenkeys.process.logs import FORMATS, LEVELS


def add_log_options(parser: argparse.ArgumentParser, *, worker: bool) -> None:
    """``--log-level``, ``--log-format`` and ``--access-log`` in a group of their own;
    ``worker``: the access line names the worker each request was routed to (``route``)."""
    g = parser.add_argument_group("logging")
    g.add_argument(
        "--log-level",
        choices=LEVELS,
        default="info",
        help="lowest level logged, tokenkeys' and its libraries' (default info; the lines that "
        "say what is served and where are shown at every level)",
    )
    g.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text: 'TIME LEVEL LOGGER: message' lines in UTC; json: one JSON object per line "
        "(ts, level, logger, message and the fields of the line) (default text)",
    )
    routed = ", worker" if worker else ""
    g.add_argument(
        "--access-log",
        action="store_true",
        help="one line per HTTP request: method, route, status, duration, prompt tokens"
        f"{routed} (default off)",
    )
