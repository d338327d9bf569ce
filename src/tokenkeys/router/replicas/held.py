"""The blocks the requests in flight bring to each worker's cache, as the replicas' shared
stream tells them.

Every replica reads the same stream in the same order, so a count kept from the stream alone
is the same on every replica at the same entry: what :mod:`router.replicas.reconcile` balances
new prompts by, where a replica's own load view (its own requests at once, the peers' as they
arrive) differs between replicas at the same instant. A placement counts the blocks it brings
(:mod:`router.replicas.reconcile` says how many) from its ``PLACED`` change until its
``FINISHED``; a replica silent for ``silence`` seconds of stream time is gone
(every replica appends a sign of life each heartbeat) and its placements stop counting; any
placement stops counting after ``hold`` seconds of stream time (its end was lost). Times are
the stream's entry ids (milliseconds), not this replica's clock, so every replica forgets at
the same entry.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenkeys.router.replicas.shared_stream import entry_id


@dataclass
class _Placement:
    """One placement counted on ``worker``."""

    model: str
    worker: str
    blocks: int
    at_ms: int


class HeldBlocks:
    """What the requests in flight bring to each worker's cache, in blocks, from the stream's
    order alone (module doc)."""

    def __init__(self, *, silence: float = 5.0, hold: float = 300.0) -> None:
        self.silence_ms = int(silence * 1000)
        self.hold_ms = int(hold * 1000)
        self._held: dict[tuple[str, str], int] = {}  # (model, worker) -> blocks
        self._placements: dict[tuple[str, int], _Placement] = {}  # in the stream's order
        # Each replica's last entry (stream ms) and last placement (entry id).
        self._heard: dict[str, int] = {}
        self._last_placed: dict[str, tuple[int, int]] = {}

    def of(self, model: str, worker: str) -> int:
        """The blocks counted on ``worker`` of ``model`` now."""
        return self._held.get((model, worker), 0)

    def heard(self, replica: str, at: tuple[int, int]) -> None:
        """An entry of ``replica`` at ``at``: forget what the stream's time has outlived."""
        self._heard[replica] = at[0]
        self._forget(at[0])

    def hold(
        self, replica: str, serial: int, model: str, worker: str, blocks: int, at: tuple[int, int]
    ) -> None:
        """Count ``replica``'s placement ``serial`` (entry ``at``) on ``worker``."""
        self._placements[(replica, serial)] = _Placement(model, worker, blocks, at[0])
        self._held[(model, worker)] = self.of(model, worker) + blocks
        self._last_placed[replica] = at

    def release(self, replica: str, serial: int) -> None:
        """The placement ended (or was never counted)."""
        placement = self._placements.pop((replica, serial), None)
        if placement is not None:
            self._held[(placement.model, placement.worker)] -= placement.blocks

    def missed(self, replica: str, seen: Any) -> bool:
        """Whether a peer placed something the stream puts after what ``replica`` had read
        when it decided (``seen``, an entry id; unknown: it may have)."""
        if not seen:
            return True
        read = entry_id(seen)
        return any(r != replica and last > read for r, last in self._last_placed.items())

    def least(
        self, model: str, worker: str, pool: Sequence[str], first_key: int, group: int
    ) -> str:
        """``worker``, unless another of ``pool`` holds at least half of ``group`` blocks less:
        the least held then (ties: an order drawn from the prompt's first block, the same on
        every replica)."""
        if worker not in pool:
            return worker
        salt = first_key & 0xFFFFFFFF

        def rank(address: str) -> tuple[int, int]:
            return self.of(model, address), zlib.crc32(address.encode()) ^ salt

        least = min(pool, key=rank)
        if 2 * (self.of(model, worker) - self.of(model, least)) >= group:
            return least
        return worker

    def reset(self) -> None:
        """Forget everything (the stream is lost)."""
        self._held.clear()
        self._placements.clear()
        self._heard.clear()
        self._last_placed.clear()

    def _forget(self, now_ms: int) -> None:
        while self._placements:  # the oldest first
            (replica, serial), placement = next(iter(self._placements.items()))
            if now_ms - placement.at_ms <= self.hold_ms:
                break
            self.release(replica, serial)
        silent = {r for r, ms in self._heard.items() if now_ms - ms > self.silence_ms}
        if not silent:
            return
        for replica in silent:
            del self._heard[replica]
            self._last_placed.pop(replica, None)
        for replica, serial in [k for k in self._placements if k[0] in silent]:
            self.release(replica, serial)
