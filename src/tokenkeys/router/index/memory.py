"""The in-memory prefix index: one router process, bounded by a key count with LRU eviction.

Like llm-d's ``InMemoryIndex`` (llm-d-router ``pkg/kvcache/kvblock/in_memory.go``), the bound
is a number of block keys and the least recently used key goes first; adding a key and finding
it in a lookup both count as use. A per-worker reverse map makes :meth:`clear` proportional to
that worker's blocks instead of a scan of the whole index (llm-d's ``Clear`` scans).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from tokenkeys.errors import ConfigError
from tokenkeys.router.index.model import (
    DEFAULT_TIER,
    PrefixMatch,
    check_filter,
    check_keys,
    check_tier,
    check_worker,
)

#: Default bound, in block keys (about 300-400 bytes each in CPython with a few workers per key).
DEFAULT_CAPACITY = 1_000_000


class MemoryPrefixIndex:
    """A :class:`~tokenkeys.router.index.model.PrefixIndex` in this process's memory.

    ``capacity`` is the most block keys kept; beyond it the least recently used key (with every
    worker's entry for it) is evicted and counted in :attr:`evictions`. Not shared between
    processes: use :class:`~tokenkeys.router.index.redis.RedisPrefixIndex` for that. All
    methods run synchronously inside the coroutine (no awaits), so concurrent tasks of one event
    loop never see a half-applied update.
    """

    #: Label of this backend in metrics.
    backend = "memory"

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ConfigError(
                f"capacity must be a positive number of block keys, got {capacity!r}",
                field="capacity",
            )
        self.capacity = capacity
        self.evictions = 0
        # key -> {worker: sorted tiers}; insertion order is recency order (oldest first).
        self._entries: OrderedDict[int, dict[str, tuple[str, ...]]] = OrderedDict()
        self._by_worker: dict[str, set[int]] = {}
        # One shared tuple per distinct tier set: lookups compare them by identity first.
        self._tier_sets: dict[tuple[str, ...], tuple[str, ...]] = {}

    def __len__(self) -> int:
        """The number of block keys held."""
        return len(self._entries)

    def _tiers(self, tiers: tuple[str, ...]) -> tuple[str, ...]:
        return self._tier_sets.setdefault(tiers, tiers)

    async def add(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` holds ``keys`` on ``tier``; may evict the oldest keys."""
        check_worker(worker)
        check_tier(tier)
        check_keys(keys)
        entries, single = self._entries, self._tiers((tier,))
        held = self._by_worker.setdefault(worker, set())
        for key in keys:
            held.add(key)
            entry = entries.get(key)
            if entry is None:
                entries[key] = {worker: single}
                # The key just added is the newest, so eviction never takes it (capacity >= 1)
                # and `held` never empties here.
                if len(entries) > self.capacity:
                    self._evict_oldest()
            else:
                entries.move_to_end(key)
                tiers = entry.get(worker)
                if tiers is None:
                    entry[worker] = single
                elif tier not in tiers:
                    entry[worker] = self._tiers(tuple(sorted((*tiers, tier))))
        if not held:  # an add of no keys
            del self._by_worker[worker]

    def _evict_oldest(self) -> None:
        key, entry = self._entries.popitem(last=False)
        for worker in entry:
            held = self._by_worker.get(worker)
            if held is not None:
                held.discard(key)
                if not held:
                    del self._by_worker[worker]
        self.evictions += 1

    async def remove(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` dropped ``keys`` from ``tier``; unknown keys are ignored."""
        check_worker(worker)
        check_tier(tier)
        check_keys(keys)
        held = self._by_worker.get(worker)
        if held is None:
            return
        entries = self._entries
        for key in keys:
            entry = entries.get(key)
            tiers = None if entry is None else entry.get(worker)
            if tiers is None or tier not in tiers:
                continue
            if len(tiers) > 1:
                entry[worker] = self._tiers(tuple(t for t in tiers if t != tier))
                continue
            del entry[worker]
            held.discard(key)
            if not entry:
                del entries[key]
        if not held:
            del self._by_worker[worker]

    async def clear(self, worker: str) -> None:
        """Forget all of ``worker``'s blocks."""
        check_worker(worker)
        entries = self._entries
        for key in self._by_worker.pop(worker, ()):
            entry = entries[key]
            del entry[worker]
            if not entry:
                del entries[key]

    async def lookup(
        self, keys: Sequence[int], workers: Collection[str] | None = None
    ) -> dict[str, PrefixMatch]:
        """Each worker's consecutive run over ``keys``; stops when no worker continues."""
        check_keys(keys)
        allowed = check_filter(workers)
        if not keys:
            return {}
        entries = self._entries
        first = entries.get(keys[0])
        if not first:
            return {}
        candidates = [(w, t) for w, t in first.items() if allowed is None or w in allowed]
        if not candidates:
            return {}
        # The prompt's entries up to the first key nobody holds, fetched once for all workers.
        rows = []
        for key in keys[1:]:
            entry = entries.get(key)
            if entry is None:
                break
            rows.append(entry)
        out, longest = {}, 0
        for worker, tiers in candidates:
            segments, count, current, blocks = [], 1, tiers, 1
            for entry in rows:
                tiers = entry.get(worker)
                if tiers is None:
                    break
                if tiers is current or tiers == current:  # usually shared (see _tiers)
                    count += 1
                else:
                    segments.append((count, current))
                    count, current = 1, tiers
                blocks += 1
            segments.append((count, current))
            out[worker] = PrefixMatch(worker, tuple(segments))
            longest = max(longest, blocks)
        for key in keys[:longest]:  # what a lookup used is recently used
            entries.move_to_end(key)
        return out

    async def workers(self) -> frozenset[str]:
        """The workers holding at least one block."""
        return frozenset(self._by_worker)

    async def close(self) -> None:
        """Nothing to release."""
