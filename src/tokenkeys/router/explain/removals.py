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

It also keeps the **order** of each worker's index updates, which the repair of a stale worker
reads (``router.explain.repair``): every ``add``, ``remove`` and ``clear`` of a worker is one
tick of its clock, and for at least the last ``history`` keys stored (default 4,096; at most
twice that are kept, about 100 bytes each) the tick of their last store, likewise for
removals. A question about ticks the bound may have forgotten is unanswerable
(``Since.known`` is False), never answered wrong. A caller may await a key's next store
(:meth:`RemovalLog.await_store`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from tokenkeys.errors import ConfigError
from tokenkeys.router.index.model import DEFAULT_TIER, PrefixIndex, PrefixMatch
from tokenkeys.router.ingest.ingestor import BatchMark, applying

#: Default number of removed keys remembered per worker.
DEFAULT_PER_WORKER = 1024
#: Default number of keys whose last store and removal ticks are remembered per worker.
DEFAULT_HISTORY = 4096


@dataclass(frozen=True)
class Removal:
    """One key's removal: the tier it left and the batch that removed it (``mark.seq`` None:
    not applied from an event batch, e.g. a caller's direct index call)."""

    tier: str
    mark: BatchMark


class _Ticks:
    """The last tick each key was touched, for at least the ``bound`` keys touched last.

    Two generations of plain dicts, written with C-speed bulk updates (this is on the path of
    every batch): when the current one passes ``bound`` keys, it becomes the previous one and
    the one before is forgotten, its newest tick becoming ``floor``. A key without an entry was
    not touched after ``floor``.
    """

    __slots__ = ("bound", "current", "previous", "floor", "_closed")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.current: dict[int, int] = {}
        self.previous: dict[int, int] = {}
        self.floor = 0
        self._closed = 0  # the tick at which ``previous`` stopped receiving keys

    def note(self, keys: Sequence[int], tick: int) -> None:
        self.current.update(dict.fromkeys(keys, tick))
        if len(self.current) > self.bound:
            self.floor = self._closed
            self.previous, self.current, self._closed = self.current, {}, tick

    def last(self, key: int) -> int:
        """The last tick ``key`` was touched, or 0 (not since ``floor``)."""
        tick = self.current.get(key)
        return tick if tick is not None else self.previous.get(key, 0)


@dataclass(frozen=True)
class Since:
    """What a worker's index updates did to one key after a tick (:meth:`RemovalLog.since`).

    ``known`` is False when the history forgot what it would need (then nothing else may be
    read from it); ``stored`` and ``removed``: the key was stored, removed after the tick (the
    last of each is kept, so ``removed`` also covers a removal before a later store);
    ``cleared``: the worker was cleared after it; ``any_removal``: some key was removed after it.
    """

    known: bool
    stored: bool = False
    removed: bool = False
    cleared: bool = False
    any_removal: bool = False


class RemovalLog:
    """A :class:`PrefixIndex` recording what the index it wraps was told to remove."""

    def __init__(
        self,
        inner: PrefixIndex,
        *,
        per_worker: int = DEFAULT_PER_WORKER,
        history: int = DEFAULT_HISTORY,
    ) -> None:
        for name, value in (("per_worker", per_worker), ("history", history)):
            if type(value) is not int or value < 1:
                raise ConfigError(
                    f"{name} must be a positive number of keys, got {value!r}", field=name
                )
        self.inner = inner
        self.per_worker = per_worker
        self.backend = getattr(inner, "backend", type(inner).__name__)
        self._removed: dict[str, OrderedDict[int, Removal]] = {}
        self._cleared: dict[str, BatchMark] = {}
        # One key per worker whose next store is awaited (``watch``).
        self._watched: dict[str, int] = {}
        self.history = history
        # Per worker: its clock, the last store and the last removal tick of its keys, its
        # last removal and clear ticks.
        self._tick: dict[str, int] = {}
        self._stores: dict[str, _Ticks] = {}
        self._removals: dict[str, _Ticks] = {}
        self._last_removal: dict[str, int] = {}
        self._last_clear: dict[str, int] = {}
        self._awaited: dict[str, dict[int, Callable[[], None]]] = {}

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

    def tick(self, worker: str) -> int:
        """``worker``'s clock now: the number of its index updates so far."""
        return self._tick.get(worker, 0)

    def since(self, worker: str, key: int, tick: int) -> Since:
        """What ``worker``'s updates after ``tick`` did to ``key``; see :class:`Since`."""
        stores, removals = self._stores.get(worker), self._removals.get(worker)
        if (stores is not None and tick < stores.floor) or (
            removals is not None and tick < removals.floor
        ):
            return Since(known=False)
        return Since(
            known=True,
            stored=stores is not None and stores.last(key) > tick,
            removed=removals is not None and removals.last(key) > tick,
            cleared=self.cleared_since(worker, tick),
            any_removal=self._last_removal.get(worker, 0) > tick,
        )

    def cleared_since(self, worker: str, tick: int) -> bool:
        """``worker`` was cleared after ``tick``."""
        return self._last_clear.get(worker, 0) > tick

    def await_store(self, worker: str, key: int, callback: Callable[[], None]) -> bool:
        """Call ``callback`` once, after ``key`` is next stored at ``worker`` or the worker is
        cleared; False (and nothing awaited) when that key is awaited already."""
        awaited = self._awaited.setdefault(worker, {})
        if key in awaited:
            return False
        awaited[key] = callback
        return True

    def awaited(self, worker: str) -> int:
        """How many keys of ``worker`` are awaited."""
        return len(self._awaited.get(worker, ()))

    def forget_awaited(self, worker: str, key: int) -> None:
        """Stop awaiting ``key`` at ``worker``."""
        self._awaited.get(worker, {}).pop(key, None)

    def _advance(self, worker: str, keys: Sequence[int], kind: str) -> int:
        """One tick of ``worker``'s clock for an update of ``keys`` (``kind``: ``stored``,
        ``removed`` or ``cleared``)."""
        tick = self._tick[worker] = self._tick.get(worker, 0) + 1
        if kind != "cleared":
            ticks = self._stores if kind == "stored" else self._removals
            found = ticks.get(worker)
            if found is None:
                found = ticks[worker] = _Ticks(self.history)
            found.note(keys, tick)
        return tick

    def _release(self, worker: str, keys: Sequence[int] | None) -> None:
        """Call the callbacks awaiting ``keys`` (None: every key) of ``worker``."""
        awaited = self._awaited.get(worker)
        if not awaited:
            return
        found = list(awaited) if keys is None else [k for k in keys if k in awaited]
        for key in found:
            awaited.pop(key)()

    @staticmethod
    def _mark(worker: str) -> BatchMark:
        mark = applying.get()
        if mark is None or mark.worker != worker:
            return BatchMark(worker, None, None, time.time())
        return mark

    async def add(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Forwarded; the keys are held again, so their removals are forgotten."""
        await self.inner.add(worker, keys, tier)
        self._advance(worker, keys, "stored")
        self._release(worker, keys)
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
        self._last_removal[worker] = self._advance(worker, keys, "removed")
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
        self._last_clear[worker] = self._advance(worker, (), "cleared")
        self._release(worker, None)

    def lookup(
        self, keys: Sequence[int], workers: Collection[str] | None = None
    ) -> Awaitable[dict[str, PrefixMatch]]:
        """Forwarded: the wrapped index's own awaitable (no coroutine of this log's on every
        routing decision's path)."""
        return self.inner.lookup(keys, workers)

    async def workers(self) -> frozenset[str]:
        """Forwarded."""
        return await self.inner.workers()

    async def close(self) -> None:
        """Closes the wrapped index."""
        await self.inner.close()
