"""Engines that are servers of their own (a real vLLM behind the sidecar): readiness, release.

Such an engine can be down while tokenkeys runs: ``/health`` and gRPC ``Health`` ask it
:meth:`FrontedEngine.unready` and report not-ready with its reason while it gives one, ready
again once it answers None. ``/version`` reports its :attr:`FrontedEngine.release` as the
version, as the engine's own ``/version`` does, beside tokenkeys' own.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class FrontedEngine(Protocol):
    """An engine that is a server of its own (see the module doc)."""

    @property
    def release(self) -> str:
        """The engine server's version, as its own ``/version`` reports it ("" unknown)."""
        ...

    async def unready(self) -> str | None:
        """Why the engine cannot serve now, or None when it can."""
        ...


class UpDown:
    """One log line when a fronted engine goes down and one when it is back (not one per probe).

    ``what`` names the engine in the lines, e.g. ``vLLM at http://10.0.0.7:8000``.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.down = False

    def saw(self, problem: str | None) -> None:
        """Note one answer of the engine: ``problem`` why it cannot serve, None when it can."""
        if problem is not None and not self.down:
            log.warning("%s is down: %s", self.what, problem)
        elif problem is None and self.down:
            log.info("%s is back", self.what)
        self.down = problem is not None
