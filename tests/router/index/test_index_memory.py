"""What only the in-memory index does: its LRU bound (as llm-d's ``in_memory.go`` evicts), and its
shared holder sets answering exactly as one dict per key would."""

from __future__ import annotations

import gc
from array import array
from collections import OrderedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkeys.errors import ConfigError, InvalidArgument
from tokenkeys.router.index import memory as index_memory
from tokenkeys.router.index import table as index_table
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.index.model import MAX_WORKER_LEN, PrefixMatch

# Every test here runs on the compiled key table and on the pure-Python one (conftest.py).
pytestmark = pytest.mark.usefixtures("table_core")
# The table choice is made once per test, the same for each example.
FIXTURED = [HealthCheck.function_scoped_fixture]


async def test_capacity_bounds_the_key_count_evicting_the_least_recently_used():
    index = MemoryPrefixIndex(capacity=4)
    await index.add("w1", [1, 2, 3])
    await index.add("w2", [4])
    await index.lookup([1, 2])  # 1 and 2 are now more recent than 3 and 4
    await index.add("w2", [5, 6])  # evicts 3, then 4
    assert len(index) == 4 and index.evictions == 2
    assert (await index.lookup([1, 2, 3]))["w1"].blocks == 2
    assert await index.lookup([4]) == {}
    assert await index.workers() == {"w1", "w2"}
    await index.add("w3", [7, 8, 9, 10])  # evicts everything else
    assert await index.workers() == {"w3"} and len(index) == 4
    assert index.evictions == 6


async def test_adding_more_keys_than_capacity_keeps_the_newest():
    index = MemoryPrefixIndex(capacity=3)
    await index.add("w", list(range(10)))
    assert len(index) == 3 and index.evictions == 7
    assert (await index.lookup([7, 8, 9]))["w"].blocks == 3
    assert await index.workers() == {"w"}
    await index.clear("w")
    assert len(index) == 0 and await index.workers() == frozenset()


async def test_re_adding_a_key_refreshes_it_and_eviction_drops_every_workers_entry():
    index = MemoryPrefixIndex(capacity=2)
    await index.add("a", [1])
    await index.add("b", [1])
    await index.add("a", [2])
    await index.add("a", [1], "cpu")  # touch 1: 2 is now the oldest
    assert set(await index.lookup([1])) == {"a", "b"}
    await index.add("c", [3])  # evicts 2
    assert await index.lookup([2]) == {}
    await index.add("c", [4])  # evicts 1, held by a and b
    assert await index.workers() == {"c"} and await index.lookup([1]) == {}


@pytest.mark.parametrize("capacity", [0, -1, 1.5, "10", True])
def test_capacity_must_be_a_positive_integer(capacity):
    with pytest.raises(ConfigError, match="capacity"):
        MemoryPrefixIndex(capacity=capacity)


# ------------------------------------------- shared holder sets against a dict-per-key reference


class LruModel:
    """The plain layout the shared holder sets replaced: one {worker: tiers} dict per key."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[int, dict[str, set[str]]] = OrderedDict()

    def add(self, worker: str, keys: list[int], tier: str) -> None:
        for key in keys:
            self.entries.setdefault(key, {}).setdefault(worker, set()).add(tier)
            self.entries.move_to_end(key)
            if len(self.entries) > self.capacity:
                self.entries.popitem(last=False)

    def remove(self, worker: str, keys: list[int], tier: str) -> None:
        for key in keys:
            tiers = self.entries.get(key, {}).get(worker)
            if tiers is not None:
                tiers.discard(tier)
                if not tiers:
                    del self.entries[key][worker]
                    if not self.entries[key]:
                        del self.entries[key]

    def clear(self, worker: str, keys: list[int], tier: str) -> None:
        for key in list(self.entries):
            self.entries[key].pop(worker, None)
            if not self.entries[key]:
                del self.entries[key]

    def lookup(self, keys: list[int], allowed: set[str] | None) -> dict[str, PrefixMatch]:
        out, longest = {}, 0
        for worker in self.entries.get(keys[0], {}):
            if allowed is not None and worker not in allowed:
                continue
            segments: list[list] = []
            for key in keys:
                tiers = tuple(sorted(self.entries.get(key, {}).get(worker, ())))
                if not tiers:
                    break
                if segments and segments[-1][1] == tiers:
                    segments[-1][0] += 1
                else:
                    segments.append([1, tiers])
            out[worker] = PrefixMatch(worker, tuple((c, t) for c, t in segments))
            longest = max(longest, sum(c for c, _ in segments))
        for key in keys[:longest]:
            self.entries.move_to_end(key)
        return out


NAMES = st.sampled_from(["w1", "w2", "w3", "w4"])
UPDATES = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "remove", "clear"]),
        NAMES,
        st.lists(st.integers(0, 11), max_size=8),
        st.sampled_from(["gpu", "cpu"]),
    ),
    max_size=30,
)
LOOKUPS = st.lists(
    st.tuples(
        st.lists(st.integers(0, 11), min_size=1, max_size=10),
        st.none() | st.sets(NAMES, max_size=3),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURED)
@given(capacity=st.integers(1, 14), updates=UPDATES, lookups=LOOKUPS)
async def test_lookups_and_evictions_match_a_dict_per_key_index(capacity, updates, lookups):
    # A sweep floor of 1 drops unused holder sets on almost every update, so rebuilt (equal but
    # not identical) sets are exercised too; a first chunk of 1 puts a lookup's chunk bounds
    # (after keys 1, 3, 7) inside these short prompts; no log slack compacts a worker's key log
    # whenever it holds more than twice its keys (stale or repeated ones).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(index_memory, "_SWEEP_FLOOR", 1)
        patch.setattr(index_memory, "_LOG_SLACK", 0)
        patch.setattr(index_table, "_FIRST_CHUNK", 1)
        index, model = MemoryPrefixIndex(capacity=capacity), LruModel(capacity)
        index._sweep_at = 1
        for kind, worker, keys, tier in updates:
            if kind == "clear":
                await index.clear(worker)
            else:
                await getattr(index, kind)(worker, keys, tier)
            getattr(model, kind)(worker, keys, tier)
            for prompt, allowed in lookups:
                assert await index.lookup(prompt, allowed) == model.lookup(prompt, allowed)
            assert list(index._entries) == list(model.entries)  # same recency order
        expected = {w for holders in model.entries.values() for w in holders}
        assert await index.workers() == expected


# ------------------------------------------------------------- a lookup's touch, right away


async def test_a_lookup_touches_what_it_used_at_once_in_order():
    index = MemoryPrefixIndex(capacity=4)
    await index.add("w", [1, 2, 3, 4])  # recency, oldest first: 1 2 3 4
    await index.lookup([1])  # 2 3 4 1
    await index.lookup([2])  # 3 4 1 2
    assert list(index._table) == [3, 4, 1, 2]
    await index.lookup([3, 1, 9])  # the held prefix 3 1: 4 2 3 1
    assert list(index._table) == [4, 2, 3, 1]
    await index.lookup([3, 1], workers={"other"})  # nothing used, nothing touched
    assert list(index._table) == [4, 2, 3, 1]
    await index.add("w", [5, 6])  # evicts 4, then 2
    assert list(index._table) == [3, 1, 5, 6] and index.evictions == 2


async def test_touch_found_refuses_after_the_table_changed(table_core):
    index = MemoryPrefixIndex()
    await index.add("w", [1, 2, 3])
    table = index._table
    assert table.runs([1, 2, 5]) is not None
    table.touch_found(2)
    assert list(table) == [3, 1, 2]
    if table_core == "C":  # the compiled table kept slot numbers, which an insertion may move
        await index.add("w", [7])
        with pytest.raises(RuntimeError, match="change"):
            table.touch_found(1)


async def test_a_lookup_reads_a_buffer_of_u64_keys(table_core):
    # A KeyArray's index keys (array('Q')) go to the table as they are: the same answer.
    index = MemoryPrefixIndex()
    await index.add("w", [1, 2, 3])
    await index.add("v", [1, 2])
    assert await index.lookup(array("Q", [1, 2, 3, 4])) == await index.lookup([1, 2, 3, 4])


# --------------------------------------------------- the worker filter, checked in one C pass


class Name(str):
    """A str subclass: a worker id check_worker accepts (isinstance), past the C fast path."""


@pytest.mark.parametrize(
    "workers", [[""], ["ok", "x" * 257], ["ok", 5], [["unhashable"]], ("ok", None)]
)
async def test_a_filter_with_any_bad_id_is_refused_as_check_worker_refuses_it(workers):
    index = MemoryPrefixIndex()
    await index.add("ok", [1])
    with pytest.raises(InvalidArgument) as info:
        await index.lookup([1], workers)
    assert info.value.field == "worker"


async def test_a_filter_of_str_subclasses_and_of_the_longest_ids_is_accepted():
    index = MemoryPrefixIndex()
    longest = "w" * MAX_WORKER_LEN
    await index.add(longest, [1])
    assert set(await index.lookup([1], [Name(longest)])) == {longest}
    assert set(await index.lookup([1], frozenset({longest, "other"}))) == {longest}


def _walked(index: MemoryPrefixIndex) -> int:
    """The references a full collection follows among the collector-tracked objects of
    ``index`` (``gc.get_referents`` is each object's traverse, what the pass walks), its table
    left out."""
    # A collection first: it untracks the tuples of untracked items (CPython does so lazily, at
    # a pass), so both indexes are counted as any later full pass sees them.
    gc.collect()
    seen, edges = set(), 0
    todo = [v for v in vars(index).values() if v is not index._table]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not gc.is_tracked(obj) or isinstance(obj, type):
            continue
        seen.add(id(obj))
        refs = gc.get_referents(obj)
        edges += len(refs)
        todo += refs
    return edges


async def _served(n: int) -> MemoryPrefixIndex:
    """An index through every update path (adds within and past capacity, removes, clears, a
    lookup's touches applied): the same holder sets and transitions for every ``n``."""
    index = MemoryPrefixIndex(capacity=3 * n)
    await index.add("a", list(range(n)))
    await index.add("b", list(range(n // 2, 2 * n)))
    await index.add("c", list(range(2 * n, 4 * n)))  # past capacity: the evicting path
    await index.remove("b", list(range(n, n + n // 4)))
    assert await index.lookup(list(range(2 * n, 3 * n)))
    await index.clear("a")
    await index.add("a", [4 * n])  # applies the lookup's pending touches
    assert index.evictions == n
    return index


async def test_a_full_collection_walks_no_more_of_a_larger_index_but_its_table():
    # The per-worker maps hold ints only, so the collector never tracks them; sets would be
    # walked entry by entry (module doc). The table is left to a process freeze.
    small, large = await _served(1_000), await _served(20_000)
    assert len(large) - 1 == 20 * (len(small) - 1)  # 2.75 n keys, and the last add's one
    assert _walked(large) == _walked(small)


# ------------------------------------------------- the compiled table against the pure-Python one

KEYS = st.integers(0, 40) | st.sampled_from([0, (1 << 64) - 1, 1 << 63])
OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "remove", "clear", "lookup", "lookup"]),
        NAMES,
        st.lists(KEYS, max_size=40),
        st.sampled_from(["gpu", "cpu", "disk"]),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURED)
@given(capacity=st.integers(1, 60), operations=OPERATIONS)
async def test_the_compiled_table_answers_as_the_pure_python_one(table_core, capacity, operations):
    # Batches longer than the C table's prefetch batch (16 keys), evictions inside one add, and
    # table growth (its array starts at 16 slots): the same answers, order, evictions, workers.
    if table_core == "python":
        return  # the comparison below is made once, from the C run
    indexes = [MemoryPrefixIndex(capacity=capacity)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(index_table, "CORE", None)
        indexes.append(MemoryPrefixIndex(capacity=capacity))
    compiled, pure = indexes
    assert type(compiled._table) is not type(pure._table)
    for kind, worker, keys, tier in operations:
        if kind == "lookup":
            assert await compiled.lookup(keys) == await pure.lookup(keys)
        elif kind == "clear":
            await compiled.clear(worker)
            await pure.clear(worker)
        else:
            await getattr(compiled, kind)(worker, keys, tier)
            await getattr(pure, kind)(worker, keys, tier)
        assert list(compiled._entries) == list(pure._entries)
        assert compiled.evictions == pure.evictions
        assert compiled._held == pure._held and compiled._logs == pure._logs
    assert await compiled.workers() == await pure.workers()


async def test_the_compiled_table_is_never_walked_by_the_collector(table_core):
    # It holds its holder sets, which never refer back to it: no cycle can run through it.
    index = MemoryPrefixIndex()
    await index.add("w", list(range(1000)))
    assert gc.is_tracked(index._table) is (table_core == "python")
