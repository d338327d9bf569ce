"""When a worker whose prefix-index writes failed may be rebuilt: an exponential backoff.

A full Redis (``maxmemory`` with ``noeviction``) refuses writes but still serves reads and
deletes. Clearing a worker and replaying its events at once would then fill it again and fail
again: a clear-and-replay loop that churns Redis and the publisher's replay buffer. Instead the
worker is cleared once when a write fails (its partial entries could over-report, and the clear
frees space), requests go to it by load, and the rebuild waits ``delay`` seconds; each failed
rebuild doubles the delay up to ``cap``. So a worker is cleared at most once per backoff period,
and routes by prefix again as soon as a rebuild succeeds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class BackoffSettings:
    """Delays shared by every worker's :class:`WriteBackoff` (``clock``: seconds)."""

    base: float = 1.0
    cap: float = 60.0
    clock: Callable[[], float] = time.monotonic

    def new(self) -> WriteBackoff:
        """A backoff for one worker's index writes, reading these settings at each call."""
        return WriteBackoff(self)


class WriteBackoff:
    """One worker's index-write state: healthy, or failing and waiting for ``retry_at``."""

    def __init__(self, settings: BackoffSettings) -> None:
        self.settings = settings
        #: True from a failed write until a rebuild succeeds.
        self.failing = False
        #: Seconds of the current (or last) backoff period; 0 before any failure.
        self.delay = 0.0
        self.retry_at = 0.0
        #: The last failure, for ``/router/workers``.
        self.error: str | None = None
        self._healthy_since = 0.0

    def failed(self, error: str) -> None:
        """A write failed: start the next (longer) backoff period."""
        s = self.settings
        now = s.clock()
        if not self.failing and now - self._healthy_since >= s.cap:
            self.delay = 0.0  # healthy for a whole cap: start over from the base delay
        self.delay = min(self.delay * 2, s.cap) if self.delay else s.base
        self.retry_at = now + self.delay
        self.failing = True
        self.error = error

    def due(self) -> bool:
        """Whether writes may be tried now (healthy, or the backoff period is over)."""
        return not self.failing or self.settings.clock() >= self.retry_at

    def remaining(self) -> float:
        """Seconds until :meth:`due` (0 when due)."""
        return max(self.retry_at - self.settings.clock(), 0.0) if self.failing else 0.0

    def succeeded(self) -> None:
        """Writes went through: healthy again (the delay is kept a while, so that a rebuild
        failing again right after backs off longer)."""
        if self.failing:
            self.failing, self.error = False, None
            self._healthy_since = self.settings.clock()

    def retry_now(self) -> None:
        """End the current period early (the index is known to be back)."""
        self.retry_at = self.settings.clock()

    def as_dict(self) -> dict:
        """A JSON-ready summary (``GET /router/workers``)."""
        return {
            "failing": self.failing,
            "retry_in_seconds": round(self.remaining(), 3),
            "error": self.error,
        }
