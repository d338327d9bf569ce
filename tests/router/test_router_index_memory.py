"""What only the in-memory index does: its LRU bound (as llm-d's ``in_memory.go`` evicts)."""

from __future__ import annotations

import pytest

from tokenkeys.errors import ConfigError
from tokenkeys.router.index.memory import MemoryPrefixIndex


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
