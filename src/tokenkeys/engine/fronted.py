"""Engines that are servers of their own (a real vLLM behind the sidecar): readiness, release.

Such an engine can be down while tokenkeys runs: ``/health`` and gRPC ``Health`` ask it
:meth:`FrontedEngine.unready` and report not-ready with its reason while it gives one, ready
again once it answers None. ``/version`` reports its :attr:`FrontedEngine.release` as the
version, as the engine's own ``/version`` does, beside tokenkeys' own.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


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
