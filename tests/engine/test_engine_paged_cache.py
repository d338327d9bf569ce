"""Paged prefix cache: reference counts, LRU eviction order and event timing.

Reference: vLLM 0.33 `vllm/v1/core/block_pool.py` (free queue in eviction order, one
BlockRemoved per evicted hash, no de-duplication of identical blocks, reset only when idle).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.engine.simulated.paged_cache import PagedPrefixCache
from tokenkeys.errors import ConfigError, FailedPrecondition
from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored


@dataclass(frozen=True)
class Key:
    """Test stand-in for a block key: any digest, event key = its last 8 bytes big-endian."""

    digest: bytes

    @property
    def event_key(self) -> int:
        return int.from_bytes(self.digest[-8:], "big")


def key(name: str) -> Key:
    return Key(hashlib.sha256(name.encode()).digest())


def store(cache: PagedPrefixCache, names: list[str], parent: str | None = None) -> list:
    blocks = cache.allocate(len(names))
    tokens = list(range(len(names) * cache.block_size))
    cache.cache_blocks(blocks, [key(n) for n in names], tokens, key(parent) if parent else None)
    return blocks


def removed(events) -> list[int]:
    out = []
    for e in events:
        assert isinstance(e, BlockRemoved) and len(e.block_hashes) == 1
        out.append(e.block_hashes[0])
    return out


def test_stored_event_carries_chain_tokens_and_group_metadata():
    cache = PagedPrefixCache(4, 2, group_idx=1, kv_cache_spec_kind="full_attention")
    store(cache, ["a", "b"], parent="root")
    (event,) = cache.take_events()
    assert event == BlockStored(
        block_hashes=(key("a").event_key, key("b").event_key),
        parent_block_hash=key("root").event_key,
        token_ids=(0, 1, 2, 3),
        block_size=2,
        medium="GPU",
        extra_keys=(None, None),
        group_idx=1,
        kv_cache_spec_kind="full_attention",
    )
    assert cache.take_events() == []


def test_eviction_follows_lru_order_of_freeing():
    cache = PagedPrefixCache(4, 1)
    a = store(cache, ["a0", "a1"])
    b = store(cache, ["b0", "b1"])
    cache.free(list(reversed(a)))  # a1 then a0: tail first, as vLLM frees
    cache.free(list(reversed(b)))
    cache.take_events()
    assert cache.num_free_blocks == 4 and cache.num_cached_blocks == 4
    cache.allocate(3)
    assert removed(cache.take_events()) == [key(n).event_key for n in ("a1", "a0", "b1")]
    assert [b.key for b in cache.match_prefix([key("b0")])] == [key("b0")]
    assert cache.match_prefix([key("a0")]) == []


def test_a_hit_takes_the_block_out_of_the_eviction_queue():
    cache = PagedPrefixCache(3, 1)
    a = store(cache, ["a"])
    b = store(cache, ["b"])
    cache.free(a)
    cache.free(b)
    hit = cache.match_prefix([key("a")])
    cache.touch(hit)
    cache.take_events()
    cache.allocate(2)  # the empty block, then b; a is referenced
    assert removed(cache.take_events()) == [key("b").event_key]
    cache.free(hit)
    cache.allocate(1)
    assert removed(cache.take_events()) == [key("a").event_key]


def test_shared_block_is_freed_only_when_the_last_reference_goes():
    cache = PagedPrefixCache(2, 1)
    a = store(cache, ["a"])
    cache.touch(cache.match_prefix([key("a")]))
    cache.free(a)
    assert cache.num_free_blocks == 1
    cache.free(a)
    assert cache.num_free_blocks == 2


def test_identical_blocks_are_not_deduplicated():
    cache = PagedPrefixCache(3, 1)
    first = store(cache, ["a"])
    second = store(cache, ["a"])
    events = cache.take_events()
    assert [type(e) for e in events] == [BlockStored, BlockStored]
    assert cache.num_cached_blocks == 2
    cache.free(first)
    cache.free(second)
    cache.allocate(3)
    # Each copy is removed on its own (vLLM emits a BlockRemoved per evicted block).
    assert removed(cache.take_events()) == [key("a").event_key] * 2


def test_allocation_beyond_free_blocks_is_refused():
    cache = PagedPrefixCache(2, 4)
    cache.allocate(2)
    with pytest.raises(FailedPrecondition, match="0 of 2 are free"):
        cache.allocate(1)


def test_reset_only_when_idle_and_emits_all_blocks_cleared():
    cache = PagedPrefixCache(2, 1)
    a = store(cache, ["a"])
    cache.take_events()
    assert cache.reset() is False
    assert cache.take_events() == []
    cache.free(a)
    assert cache.reset() is True
    assert cache.take_events() == [AllBlocksCleared()]
    assert cache.match_prefix([key("a")]) == []
    cache.allocate(2)
    assert cache.take_events() == []  # nothing cached any more, nothing to remove


def test_bad_configuration():
    with pytest.raises(ConfigError, match="num_blocks"):
        PagedPrefixCache(0, 16)
    with pytest.raises(ConfigError, match="block_size"):
        PagedPrefixCache(4, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=30))
def test_removed_hashes_were_stored_and_references_balance(ops):
    """Invariant: every removed hash was stored before; free + referenced == capacity."""
    cache = PagedPrefixCache(6, 1)
    live: list[list] = []
    stored: set[int] = set()
    counter = 0
    for size, finish_oldest in ops:
        if finish_oldest and live:
            cache.free(live.pop(0))
        if size <= cache.num_free_blocks:
            names = [f"k{counter + i}" for i in range(size)]
            counter += size
            live.append(store(cache, names))
        for event in cache.take_events():
            if isinstance(event, BlockStored):
                stored.update(event.block_hashes)
            else:
                assert event.block_hashes[0] in stored
        referenced = sum(len(b) for b in live)
        assert cache.num_free_blocks + referenced == cache.num_blocks
