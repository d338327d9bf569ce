"""The in-memory prefix index: one router process, bounded by a key count with LRU eviction.

Like llm-d's ``InMemoryIndex`` (llm-d-router ``pkg/kvcache/kvblock/in_memory.go``), the bound
is a number of block keys and the least recently used key goes first; adding a key and finding
it in a lookup both count as use.

Per worker: a log of every key it was given, as u64 words (``array('Q')``, appended by the
table's ``add_keys`` from the keys it already converted), and how many keys it holds. The log
makes :meth:`clear` proportional to that worker's blocks instead of a scan of the whole index
(llm-d's ``Clear`` scans); it may carry keys the worker no longer holds (evicted, removed,
given twice), which :meth:`clear` skips by asking the table, and it is compacted when it grows
past twice the held count. So an eviction changes counts only, and an add costs one append of
8 bytes per key: a dict of ints per worker, as this index kept before, cost a dict insert and a
Python int kept alive per key (about half of an ingest, and 48 of the 88 bytes per entry).

Each key maps to an immutable, shared :class:`_Holders` (which workers hold it, on which tiers)
rather than to a dict of its own. A prompt's consecutive keys are mostly held by the same
workers, so they share one object, and a lookup finds where the holders change by comparing
identities in C (the table's ``runs``) instead of asking every worker about every key in Python:
the work per key no longer grows with the number of workers.

A lookup's LRU touch is eager and cheap: the table's ``runs`` keeps the slots it found, and
``touch_found`` moves the ones the lookup used (a copy of nothing, no second probe) while they
are still in cache. (Deferring the touch to the next update, as this index once did, only moved
its cost: each touch was still paid, after a second probe of keys no longer in cache.)

Garbage collection: a full pass of CPython's cycle collector walks every entry of every
container it tracks, so an index of millions of keys in tracked containers stalls its process
for as long on each full pass (10M keys held by 200 workers: 744 ms here with a set of keys per
worker, growing with the keys). The per-worker logs are arrays, which CPython never tracks (an
earlier dict of ints per worker was not tracked either: 292 ms, the table alone). The compiled
key table (``index/table.py``)
is never tracked; the pure-Python one, an ``OrderedDict``, always is, but it is built with the
index: a process that freezes what it holds once started
(``gc.freeze``, as the serving commands do in :func:`tokenkeys.process.run.freeze_started`)
takes it out of those passes for good, however far it grows.
"""

from __future__ import annotations

from array import array
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
from tokenkeys.router.index.table import PyKeyTable, new_table

# Stale entries a worker's key log may carry beyond twice what it holds before it is compacted.
_LOG_SLACK = 4096

#: Default bound, in block keys (on the C table some 35-70 bytes each with one holder: its slot at
#: 35-70% load and 8 per holder in the worker's log; the pure-Python table's dict entry and int
#: cost about 100; one dict per key took about 380).
DEFAULT_CAPACITY = 1_000_000

# Distinct holder sets kept before unused ones are dropped (the sweep also runs when the table
# doubles since the last one, so its cost stays proportional to the growth).
_SWEEP_FLOOR = 4096


class _Holders:
    """The workers holding one key and their tiers; never mutated once built, shared by keys.

    ``tiers`` maps worker to its sorted tier tuple. The three caches remember the result of
    adding a (worker, tier), removing one, or clearing a worker, so an update of a key costs one
    dict probe once its transition has been seen; ``None`` in them means "no holder left".
    """

    __slots__ = ("tiers", "added", "removed", "cleared")

    def __init__(self, tiers: dict[str, tuple[str, ...]]) -> None:
        self.tiers = tiers
        self.added: dict[tuple[str, str], _Holders] = {}
        self.removed: dict[tuple[str, str], _Holders | None] = {}
        self.cleared: dict[str, _Holders | None] = {}


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
        # key -> its holders; insertion order is recency order (oldest first). The C table
        # where built, else a PyKeyTable: the same methods (index/table.py).
        self._table: PyKeyTable = new_table()
        # The C table grows straight to room for `capacity` keys once it holds an eighth of
        # them: doublings re-insert every key each time, most of an ingest's cost.
        self._table.reserve(capacity)
        # worker -> every key it was given, as u64 words (module doc, "Per worker"): a key may
        # be there twice or be held no more; compacted when it outgrows what the worker holds.
        self._logs: dict[str, array] = {}
        # worker -> how many keys it holds (a worker holding none has no entry in either).
        self._held: dict[str, int] = {}
        # One shared tuple per distinct tier set, one shared _Holders per distinct holder set.
        self._tier_sets: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._holder_sets: dict[frozenset[tuple[str, tuple[str, ...]]], _Holders] = {}
        # (worker, tier) -> the holder set of that worker alone on that tier (dropped by sweeps).
        self._singles: dict[tuple[str, str], _Holders] = {}
        self._sweep_at = _SWEEP_FLOOR

    def __len__(self) -> int:
        """The number of block keys held."""
        return len(self._table)

    @property
    def _entries(self) -> PyKeyTable:
        """The table, in recency order (oldest first)."""
        return self._table

    def _tiers(self, tiers: tuple[str, ...]) -> tuple[str, ...]:
        return self._tier_sets.setdefault(tiers, tiers)

    def _holders(self, tiers: dict[str, tuple[str, ...]]) -> _Holders | None:
        """The shared holder set equal to ``tiers`` (``None`` when empty)."""
        if not tiers:
            return None
        token = frozenset(tiers.items())
        found = self._holder_sets.get(token)
        if found is None:
            found = self._holder_sets[token] = _Holders(tiers)
        return found

    def _sweep(self) -> None:
        """Drop holder sets no key uses any more (and every cached transition, which may name
        them). Equal sets built later are new objects: lookups stay correct either way, they
        only compare more.
        """
        if len(self._holder_sets) <= self._sweep_at:
            return
        live = set(self._table.values())
        self._holder_sets = {t: h for t, h in self._holder_sets.items() if h in live}
        for holders in self._holder_sets.values():
            holders.added.clear()
            holders.removed.clear()
            holders.cleared.clear()
        self._singles.clear()
        self._sweep_at = max(_SWEEP_FLOOR, 2 * len(self._holder_sets))

    def _with(self, holders: _Holders, worker: str, tier: str) -> _Holders:
        tiers = holders.tiers.get(worker, ())
        if tier in tiers:
            return holders
        return self._holders({**holders.tiers, worker: self._tiers(tuple(sorted((*tiers, tier))))})

    def _without(self, holders: _Holders, worker: str, tier: str) -> _Holders | None:
        table = dict(holders.tiers)
        left = tuple(t for t in table[worker] if t != tier)
        if left:
            table[worker] = self._tiers(left)
        else:
            del table[worker]
        return self._holders(table)

    async def add(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` holds ``keys`` on ``tier``; may evict the oldest keys."""
        if len(self._holder_sets) > self._sweep_at:  # (the sweep's own test, without its call)
            self._sweep()
        entries, change = self._table, (worker, tier)
        try:
            single = self._singles.get(change)
        except TypeError:  # an unhashable worker or tier: refused below
            single = None
        if single is None:  # a pair not seen since the last sweep: checked once, here
            check_worker(worker)
            check_tier(tier)
            single = self._singles[change] = self._holders({worker: self._tiers((tier,))})
        # Absent keys are inserted as `single`, present ones made newest, the oldest evicted past
        # capacity, the keys appended to the worker's log: one loop in C where built, which
        # checks every key first (None: a bad key, nothing changed). Only the present keys'
        # holders change here.
        done = None
        log = self._logs.get(worker)
        if log is None:
            log = array("Q")
        if type(keys) is list or not isinstance(keys, (str, bytes)) and isinstance(keys, Sequence):
            done = entries.add_keys(keys, single, self.capacity, log)
        if done is None:
            check_keys(keys)  # raises: the rule the table applied, naming the first bad key
        present, evicted = done
        held = self._held
        # Every key is inserted or present; a present one is gained if this worker did not
        # hold it (its holders change here, after any eviction of this call).
        gained = len(keys) - len(present)
        if evicted:
            self._forget(evicted)
        for key in present:
            holders = entries.get(key)
            if holders is not None:  # unless evicted since in this call
                gained += worker not in holders.tiers
                self._change(holders, key, change)
        count = held.get(worker, 0) + gained
        if count:
            held[worker] = count
            self._logs[worker] = log
            if len(log) > 2 * count + _LOG_SLACK:
                self._compact(worker)
        else:  # an add of no keys, or of keys all evicted again in it
            held.pop(worker, None)
            self._logs.pop(worker, None)

    def _forget(self, evicted: list[tuple[int, _Holders]]) -> None:
        """Count evicted keys out of their holders; a worker left with none is dropped (the
        adding worker's count may pass below zero here: its gain is added after)."""
        held = self._held
        for _, holders in evicted:
            for other in holders.tiers:
                left = held[other] = held.get(other, 0) - 1
                if not left:
                    del held[other]
                    self._logs.pop(other, None)
        self.evictions += len(evicted)

    def _compact(self, worker: str) -> None:
        """Keep in ``worker``'s log only the keys it holds, once each (first place kept)."""
        get = self._table.get
        kept = dict.fromkeys(
            k for k in self._logs[worker] if (h := get(k)) is not None and worker in h.tiers
        )
        self._logs[worker] = array("Q", kept)

    def _change(self, holders: _Holders, key: int, change: tuple[str, str]) -> None:
        """A key held already is added again: held by ``change`` too (its place is kept)."""
        after = holders.added.get(change)
        if after is None:
            after = holders.added[change] = self._with(holders, *change)
        if after is not holders:
            self._table[key] = after

    async def remove(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` dropped ``keys`` from ``tier``; unknown keys are ignored."""
        check_worker(worker)
        check_tier(tier)
        check_keys(keys)
        count = self._held.get(worker)
        if count is None:
            return
        self._sweep()
        entries, change = self._table, (worker, tier)
        for key in keys:
            holders = entries.get(key)
            tiers = None if holders is None else holders.tiers.get(worker)
            if tiers is None or tier not in tiers:
                continue
            try:
                after = holders.removed[change]
            except KeyError:
                after = holders.removed[change] = self._without(holders, worker, tier)
            count -= len(tiers) == 1
            if after is None:
                del entries[key]
            else:
                entries[key] = after
        if count:
            self._held[worker] = count
        else:
            del self._held[worker], self._logs[worker]

    async def clear(self, worker: str) -> None:
        """Forget all of ``worker``'s blocks."""
        check_worker(worker)
        entries = self._table
        self._held.pop(worker, None)
        for key in self._logs.pop(worker, ()):
            holders = entries.get(key)
            if holders is None or worker not in holders.tiers:
                continue  # no longer held (evicted, removed), or met before in the log
            try:
                after = holders.cleared[worker]
            except KeyError:
                table = {w: t for w, t in holders.tiers.items() if w != worker}
                after = holders.cleared[worker] = self._holders(table)
            if after is None:
                del entries[key]
            else:
                entries[key] = after

    async def lookup(
        self, keys: Sequence[int], workers: Collection[str] | None = None
    ) -> dict[str, PrefixMatch]:
        """Each worker's consecutive run over ``keys``; stops when no worker continues."""
        entries = self._table
        groups = None
        # A list (what routing passes) without the ABC check's walk.
        if type(keys) is list or (
            isinstance(keys, Sequence) and not isinstance(keys, (str, bytes))
        ):
            groups = entries.runs(keys)
        if groups is None:  # a key that is not an int in [0, 2**64): named here
            check_keys(keys)
        end = sum(count for _, count in groups)
        allowed = check_filter(workers)
        if not groups:
            return {}
        # Per candidate: [tiers of its current segment, where that segment began, segments].
        first = groups[0][0].tiers
        runs = {w: [t, 0, []] for w, t in first.items() if allowed is None or w in allowed}
        if not runs:
            return {}
        # Only where the holder set changes can a run end or change tiers: the table's runs
        # are those places (by identity), `at` is where each run starts.
        out, longest, at = {}, 0, 0
        for holders, count in groups:
            if at:
                table = holders.tiers
                for worker, run in list(runs.items()):
                    tiers = table.get(worker)
                    if tiers is run[0] or tiers == run[0]:
                        continue
                    run[2].append((at - run[1], run[0]))
                    if tiers is None:
                        out[worker] = PrefixMatch(worker, tuple(run[2]))
                        longest = at
                        del runs[worker]
                    else:
                        run[0], run[1] = tiers, at
                if not runs:
                    break
            at += count
        for worker, (tiers, start, segments) in runs.items():
            segments.append((end - start, tiers))
            out[worker] = PrefixMatch(worker, tuple(segments))
            longest = end
        # What a lookup used is recently used: the slots runs() found, moved while in cache.
        if longest:
            entries.touch_found(longest)
        return out

    async def workers(self) -> frozenset[str]:
        """The workers holding at least one block."""
        return frozenset(self._held)

    async def close(self) -> None:
        """Nothing to release."""
