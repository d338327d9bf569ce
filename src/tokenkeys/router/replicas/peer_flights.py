"""What a router replica knows of its peers' requests: their stream entries, applied here.

A peer's placement is a flight in this replica's view of that worker (``LoadView.adopt``: its
blocks in use, its fresh blocks queued to prefill) and growth in the pool's ledger; its first
output and its end follow (``router.replicas.shared_stream`` names the change kinds). A peer's
flights are only as good as its entries: a peer silent for ``timeout`` seconds (crashed, cut off: no
heartbeat) has its flights ended here, and all of them end when this replica loses the stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.replicas.shared_stream import ANSWERED, FINISHED, GREW, PLACED
from tokenkeys.router.workers.load_view import Flight, LoadView


class PeerFlights:
    """Peers' flights applied to this replica's load views and growth ledgers.

    ``member(model, address)`` finds a pool member (its ``view``) or None; ``ledger(model)``
    the pool's growth ledger or None (a model this replica does not route).
    """

    def __init__(
        self,
        member: Callable[[str, str], Any],
        ledger: Callable[[str], GrowthLedger | None],
        *,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.member, self.ledger = member, ledger
        self.timeout, self.clock = timeout, clock
        self._flights: dict[tuple[str, int], tuple[Flight, LoadView]] = {}
        self._seen: dict[str, float] = {}

    def __len__(self) -> int:
        """Peers' requests in flight applied here now."""
        return len(self._flights)

    def apply(self, peer: str, changes: Iterable[list[Any]]) -> None:
        """Apply one of ``peer``'s batches of changes, in order."""
        self._seen[peer] = self.clock()
        for change in changes:
            kind, serial = change[0], change[1]
            if kind == PLACED:
                model, address, keys, fresh, blocks = change[2:7]
                member = self.member(model, address)
                if member is not None:
                    flight = member.view.adopt(keys, fresh)
                    self._flights[(peer, serial)] = (flight, member.view)
                    if blocks:
                        self._grow(model, address, blocks)
            elif kind == ANSWERED:
                held = self._flights.get((peer, serial))
                if held is not None:
                    held[1].first_output(held[0])
            elif kind == FINISHED:
                held = self._flights.pop((peer, serial), None)
                if held is not None:
                    held[1].end(held[0])
            elif kind == GREW:
                self._grow(*change[2:5])

    def _grow(self, model: str, address: str, blocks: float) -> None:
        """A peer's decision: every growth decays, ``address``'s grows (``GrowthLedger``)."""
        ledger = self.ledger(model)
        if ledger is not None:
            ledger.record(address, blocks)

    def expire(self) -> None:
        """End the flights of peers silent for longer than the timeout."""
        now = self.clock()
        gone = {p for p, seen in self._seen.items() if now - seen > self.timeout}
        if gone:
            self._end(gone.__contains__)
            for peer in gone:
                del self._seen[peer]

    def end_all(self) -> None:
        """End every peer's flight (the stream is lost: nothing of them is known any more)."""
        self._end(lambda peer: True)

    def _end(self, which: Callable[[str], bool]) -> None:
        for key in [k for k in self._flights if which(k[0])]:
            flight, view = self._flights.pop(key)
            view.end(flight)
