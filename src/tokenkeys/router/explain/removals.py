"""What the events removed, per worker: a bounded record beside the prefix index.

:class:`RemovalLog` wraps any :class:`~tokenkeys.router.index.model.PrefixIndex` (a
cross-cutting concern wraps; no backend knows of it) and remembers, for each worker, the keys
its ``BlockRemoved`` events removed most recently, each with the batch it came in
(:class:`~tokenkeys.router.ingest.ingestor.BatchMark`: sequence number, engine timestamp, when
it was applied here), and the last time the worker was cleared (``AllBlocksCleared``, a
restart, lost events, a resync). An explanation reads it to tell "evicted at seq N" from "never
stored".

Bounded: at most ``per_worker`` keys per worker (default 1,024), the oldest removal dropped
first; a key removed again moves to the newest end. An entry costs about 150 bytes (the key, an
ordered-dict slot, a shared mark), so the default is about 150 kB per worker. A key stored
again is dropped from the record (it is held again). One key per worker may be *watched*
(a block the engine did not serve although the index held it) until an event stores it. The
record is this process's: a router replica sharing a Redis index remembers the removals it
applied itself.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tokenkeys.errors import ConfigError
from tokenkeys.router.index.model import DEFAULT_TIER, PrefixIndex, PrefixMatch
from tokenkeys.router.ingest.ingestor import BatchMark, applying

#: Default number of removed keys remembered per worker.
DEFAULT_PER_WORKER = 1024


@dataclass(frozen=True)
class Removal:
    """One key's removal: the tier it left and the batch that removed it (``mark.seq`` None:
    not applied from an event batch, e.g. a caller's direct index call)."""

    tier: str
    mark: BatchMark


class RemovalLog:
    """A :class:`PrefixIndex` recording what the index it wraps was told to remove."""

    def __init__(self, inner: PrefixIndex, *, per_worker: int = DEFAULT_PER_WORKER) -> None:
        if type(per_worker) is not int or per_worker < 1:
            raise ConfigError(
                f"per_worker must be a positive number of keys, got {per_worker!r}",
                field="per_worker",
            )
        self.inner = inner
        self.per_worker = per_worker
        self.backend = getattr(inner, "backend", type(inner).__name__)
        self._removed: dict[str, OrderedDict[int, Removal]] = {}
        self._cleared: dict[str, BatchMark] = {}
        # One key per worker whose next store is awaited (``watch``).
        self._watched: dict[str, int] = {}

    def removal(self, worker: str, key: int) -> Removal | None:
        """The last removal of ``key`` at ``worker`` still remembered, or None."""
        removed = self._removed.get(worker)
        return removed.get(key) if removed is not None else None

    def cleared(self, worker: str) -> BatchMark | None:
        """When ``worker`` was last cleared (None: not since this router started)."""
        return self._cleared.get(worker)

    def watch(self, worker: str, key: int) -> None:
        """Remember until it is stored (or the worker cleared) that ``key`` of ``worker`` was
        found missing at the engine; one key per worker, the last one watched."""
        self._watched[worker] = key

    def watching(self, worker: str, key: int) -> bool:
        """``key`` is watched at ``worker`` and no event stored it since."""
        return self._watched.get(worker) == key

    @staticmethod
    def _mark(worker: str) -> BatchMark:
        mark = applying.get()
        if mark is None or mark.worker != worker:
            return BatchMark(worker, None, None, time.time())
        return mark

    async def add(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Forwarded; the keys are held again, so their removals are forgotten."""
        await self.inner.add(worker, keys, tier)
        watched = self._watched.get(worker)
        if watched is not None and watched in keys:
            del self._watched[worker]
        removed = self._removed.get(worker)
        if removed:
            for key in keys:
                removed.pop(key, None)

    async def remove(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Forwarded, then each key's removal recorded (the oldest dropped past the bound)."""
        await self.inner.remove(worker, keys, tier)
        removal = Removal(tier, self._mark(worker))
        removed = self._removed.setdefault(worker, OrderedDict())
        for key in keys[-self.per_worker :]:
            removed[key] = removal
            removed.move_to_end(key)
        while len(removed) > self.per_worker:
            removed.popitem(last=False)

    async def clear(self, worker: str) -> None:
        """Forwarded; the clear is recorded and the worker's removals forgotten (a clear says
        nothing of which keys the worker held)."""
        await self.inner.clear(worker)
        self._removed.pop(worker, None)
        self._watched.pop(worker, None)
        self._cleared[worker] = self._mark(worker)

    async def lookup(
        self, keys: Sequence[int], workers: Collection[str] | None = None
    ) -> dict[str, PrefixMatch]:
        """Forwarded."""
        return await self.inner.lookup(keys, workers)

    async def workers(self) -> frozenset[str]:
        """Forwarded."""
        return await self.inner.workers()

    async def close(self) -> None:
        """Closes the wrapped index."""
        await self.inner.close()
