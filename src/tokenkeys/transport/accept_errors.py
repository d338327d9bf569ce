"""Accept failures (descriptor table full) logged once per interval, with the server recovering.

When ``accept()`` fails with EMFILE, ENFILE, ENOBUFS or ENOMEM, asyncio
(``BaseSelectorEventLoop._accept_connection``, CPython 3.10-3.13) calls the loop's exception
handler with the message ``socket.accept() out of system resource``, stops watching the
listening socket and starts again one second later. The recovery is asyncio's own; what it lacks
is restraint: it reports once per failed attempt, and keeps attempting up to ``backlog`` times in
the same tick, each report a full traceback. This handler turns those reports into one counted
line per interval and passes every other report to the handler it replaces.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tokenkeys.transport.throttled_log import ThrottledLog

#: asyncio's message for an accept that failed for lack of a resource (selector_events.py).
ACCEPT_FAILED = "socket.accept() out of system resource"

log = logging.getLogger("tokenkeys.transport")


class AcceptErrorHandler:
    """A loop exception handler that throttles accept failures and delegates the rest."""

    def __init__(self, previous: Any, throttle: ThrottledLog) -> None:
        self.previous = previous
        self.throttle = throttle

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == ACCEPT_FAILED:
            exc = context.get("exception")
            self.throttle.note(
                "accept",
                f"cannot accept new connections: {exc}; refusing them until descriptors are "
                "free (retried every second)",
            )
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)


def throttle_accept_errors(
    loop: asyncio.AbstractEventLoop, interval: float = 10.0
) -> AcceptErrorHandler:
    """Install the handler on ``loop`` (once: a second call returns the installed one)."""
    current = loop.get_exception_handler()
    if isinstance(current, AcceptErrorHandler):
        return current
    handler = AcceptErrorHandler(current, ThrottledLog(log, interval))
    loop.set_exception_handler(handler)
    return handler
