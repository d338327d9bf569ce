"""Whether this server process serves or drains, and how many calls it has in flight.

``tokenkeys serve`` drains on SIGTERM (or SIGINT): :meth:`Lifecycle.begin_drain` makes the
call guards refuse every new call but health checks (HTTP 503, gRPC UNAVAILABLE), health
reports draining, and :meth:`Lifecycle.wait_idle` waits, up to ``--shutdown-timeout``, for the
calls already admitted (streams included) to finish before the servers stop.
:func:`exit_stopped` then ends the process without the interpreter's teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from typing import NoReturn


class Lifecycle:
    """Serving state of one process; safe to share between the HTTP and gRPC servers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight = 0
        #: Why the process does not serve yet (its engines start), None once it serves.
        self.starting: str | None = None
        self.draining = False
        #: Monotonic time the drain began, None while serving.
        self.drain_started: float | None = None

    @property
    def state(self) -> str:
        """``starting``, ``serving`` or ``draining``."""
        if self.draining:
            return "draining"
        return "starting" if self.starting is not None else "serving"

    @property
    def inflight(self) -> int:
        """Calls admitted and not finished yet."""
        return self._inflight

    def begin_drain(self) -> None:
        """Refuse new calls from now on (health checks excepted); idempotent."""
        if not self.draining:
            self.drain_started = time.monotonic()
            self.draining = True

    def enter(self) -> None:
        """Count one admitted call."""
        with self._lock:
            self._inflight += 1

    def leave(self) -> None:
        """Count one finished call."""
        with self._lock:
            self._inflight -= 1

    async def wait_idle(self, timeout: float, poll: float = 0.02) -> int:
        """Wait until no call is in flight or ``timeout`` seconds passed; return how many remain.

        Polls, so that calls counted from other threads or event loops (tests run servers on
        their own loops) are seen as well.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while self._inflight > 0 and loop.time() < deadline:
            await asyncio.sleep(poll)
        return self._inflight


def exit_stopped(code: int) -> NoReturn:
    """End a server process whose servers stopped and engines closed, skipping the teardown.

    Nothing is left to run by then, yet the interpreter's finalization would still free the
    heap object by object: every module, the tokenizers' vocabularies and merges. That took
    0.15 s on an idle machine but 7 to 15 s at a load average of about 10 (`tokenkeys serve`
    with the embedded tokenizer, measured from "stopped" to the exit), long enough for a
    supervisor or an orchestrator's grace period to kill a process that had shut down cleanly.
    Log handlers and stdio are flushed first; :func:`os._exit` skips the rest.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe: nothing to flush
            stream.flush()
    os._exit(code)
