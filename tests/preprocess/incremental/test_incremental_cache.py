"""The piece cache: exact prefixes, the byte budget, leaves evicted before their roots."""

from __future__ import annotations

from tokenkeys.preprocess.incremental.cache import SegmentCache


def test_a_chain_is_found_only_for_the_same_pieces_from_the_start() -> None:
    cache = SegmentCache(1 << 20)
    cache.store([], ["a", "b", "c"], [[1], [2], [3]])
    assert [list(n.ids) for n in cache.lookup(["a", "b", "x"])] == [[1], [2]]
    assert cache.lookup(["b", "c"]) == []  # "b" after the root is another prefix
    assert [list(n.ids) for n in cache.lookup(["a", "b", "c", "d"])] == [[1], [2], [3]]


def test_storing_after_a_chain_extends_it() -> None:
    cache = SegmentCache(1 << 20)
    cache.store([], ["a"], [[1]])
    chain = cache.lookup(["a", "b"])
    cache.store(chain, ["b"], [[2, 2]])
    assert [list(n.ids) for n in cache.lookup(["a", "b"])] == [[1], [2, 2]]
    assert len(cache) == 2


def test_the_budget_evicts_least_recent_leaves_first() -> None:
    cache = SegmentCache(1 << 20)
    cache.store([], ["root", "leaf1"], [[1], [2]])
    cache.store(cache.lookup(["root"]), ["leaf2"], [[3]])
    per_node = cache.bytes // 3
    cache.max_bytes = cache.bytes  # full: the next store evicts
    cache.store(cache.lookup(["root"]), ["leaf3"], [[4]])
    assert cache.evictions >= 1 and cache.bytes <= cache.max_bytes
    assert cache.lookup(["root"])  # the root, touched by every chain, survives
    assert [list(n.ids) for n in cache.lookup(["root", "leaf3"])] == [[1], [4]]
    assert per_node > 0


def test_a_piece_larger_than_the_budget_is_not_kept() -> None:
    cache = SegmentCache(300)
    cache.store([], ["x" * 1000], [[1] * 10])
    assert len(cache) == 0 and cache.bytes == 0


def test_clear_empties_it() -> None:
    cache = SegmentCache(1 << 20)
    cache.store([], ["a"], [[1]])
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0 and cache.lookup(["a"]) == []
