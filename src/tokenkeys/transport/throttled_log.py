"""One log line per interval for an event that may happen thousands of times a second.

Under a flood (a descriptor table full, a client opening connections in a loop) logging each
occurrence costs more than the occurrence and fills the disk: the issue that asked for this saw
143,359 tracebacks in 30 s. A :class:`ThrottledLog` logs the first occurrence of each kind at
once, then at most one line per interval saying how many more there were.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable


class ThrottledLog:
    """Counts events by kind and logs each kind at most once per ``interval`` seconds."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._pending: dict[str, tuple[str, int]] = {}  # kind: (latest message, count)
        self._scheduled: set[str] = set()
        self.totals: dict[str, int] = {}
        """Occurrences of each kind since start, logged or not (for tests and diagnostics)."""

    def note(self, kind: str, message: str) -> None:
        """Count one occurrence of ``kind``; log it now if its interval has passed.

        Occurrences inside the interval are summed and logged when it ends (on the running
        event loop, if there is one, else with the next occurrence after it).
        """
        self.totals[kind] = self.totals.get(kind, 0) + 1
        now = self._clock()
        last = self._last.get(kind)
        if last is None or now - last >= self.interval:
            _, held = self._pending.pop(kind, (message, 0))
            self._emit(message, 1 + held, now, kind)
            return
        _, held = self._pending.get(kind, (message, 0))
        self._pending[kind] = (message, held + 1)
        self._schedule(kind, last + self.interval - now)

    def _schedule(self, kind: str, delay: float) -> None:
        if kind in self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._scheduled.add(kind)
        loop.call_later(max(delay, 0.0), self._flush, kind)

    def _flush(self, kind: str) -> None:
        self._scheduled.discard(kind)
        if kind not in self._pending:
            return
        now = self._clock()
        last = self._last.get(kind, now - self.interval)
        if now - last < self.interval:  # logged meanwhile by note(): wait for the next interval
            self._schedule(kind, last + self.interval - now)
            return
        message, count = self._pending.pop(kind)
        self._emit(message, count, now, kind)

    def _emit(self, message: str, count: int, now: float, kind: str) -> None:
        self._last[kind] = now
        if count == 1:
            self.logger.warning("%s", message)
        else:
            self.logger.warning(
                "%s (%d times in the last %g s; logged once per %g s)",
                message,
                count,
                self.interval,
                self.interval,
            )
