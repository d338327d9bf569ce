"""What a router shares with its replicas, as the policy and the request paths see it.

:class:`SharedLoad` is what the precise policy (its ``Placements``), the routed engine and the
front door call around each request; :class:`LocalLoad` shares nothing (one router).
:class:`~tokenkeys.router.replicas.shared_load.RedisSharedLoad` shares through a Redis stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.policy.placement import LocalPlacements, Placements
from tokenkeys.router.workers.load_view import Flight
from tokenkeys.router.workers.pool import Pool

Ledgers = Callable[[str], GrowthLedger]


class SharedLoad(Placements, Protocol):
    """Tells other router replicas what this one sent; applies what they sent. It is also
    the policy's :class:`~tokenkeys.router.policy.placement.Placements` (what it placed is
    told after the decision)."""

    def sent(self, model: str, address: str, flight: Flight, *, movable: bool = False) -> None:
        """This router sent a request (its :class:`Flight`) to ``address`` of ``model``;
        ``movable``: its sender can move it to any worker of the pool before its first output,
        so the stream's order may balance it (``router.replicas.reconcile``)."""
        ...

    def moves(self, flight: Flight) -> asyncio.Future[str] | None:
        """For a request just :meth:`sent`, that its sender can move before its first output:
        a future resolved with the worker to move it to, when it turns out to be the later
        copy of a new prompt a peer placed elsewhere (``router.replicas.reconcile``); None
        when it never moves."""
        ...

    def answered(self, flight: Flight) -> None:
        """The request's first output arrived (its prefill is done)."""
        ...

    def finished(self, flight: Flight) -> None:
        """The request finished or failed."""
        ...

    async def start(self, pools: Mapping[str, Pool], ledgers: Ledgers) -> None:
        """Begin sharing: peers' flights go to ``pools``' load views, growth to ``ledgers``."""
        ...

    async def close(self) -> None:
        """Stop sharing (idempotent)."""
        ...


class LocalLoad(LocalPlacements):
    """Shares nothing: every router counts only its own requests (its decisions stand as
    made, as :class:`~tokenkeys.router.policy.placement.LocalPlacements`)."""

    def sent(self, model: str, address: str, flight: Flight, *, movable: bool = False) -> None:
        """Nothing to tell."""

    def moves(self, flight: Flight) -> asyncio.Future[str] | None:
        """Never: one router sees all its own decisions."""
        return None

    def answered(self, flight: Flight) -> None:
        """Nothing to tell."""

    def finished(self, flight: Flight) -> None:
        """Nothing to tell."""

    async def start(self, pools: Mapping[str, Pool], ledgers: Ledgers) -> None:
        """Nothing to follow."""

    async def close(self) -> None:
        """Nothing to close."""
