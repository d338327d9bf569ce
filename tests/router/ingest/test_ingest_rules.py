"""Ingestion rules: events to index operations, per worker, in order; spec and group filters.

Rules from llm-d's ``kvevents/pool.go`` (llm-d-router ``ebab687``) and vLLM 0.33's event
semantics (../shared/reference/engines/vllm.md §4, §8).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys.errors import Unavailable
from tokenkeys.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    SpecRef,
)
from tokenkeys.router.index.hybrid import GroupLayout, WindowGroup, group_key
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.ingest.ingestor import EventIngestor, IngestMetrics

SPEC = SpecRef("vllm/sha256_cbor@0.31", "a" * 64)
OTHER = SpecRef("vllm/sha256_cbor@0.31", "b" * 64)


def stored(*hashes, medium="GPU", **kw) -> BlockStored:
    return BlockStored(hashes, None, tuple(range(16 * len(hashes))), 16, medium=medium, **kw)


def batch(*events, spec=SPEC) -> EventBatch:
    return EventBatch(1.0, events, 0, spec)


class CountingIndex(MemoryPrefixIndex):
    """The memory index, recording each call it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    async def add(self, worker, keys, tier="gpu"):
        self.calls.append(("add", worker, tuple(keys), tier))
        await super().add(worker, keys, tier)

    async def remove(self, worker, keys, tier="gpu"):
        self.calls.append(("remove", worker, tuple(keys), tier))
        await super().remove(worker, keys, tier)

    async def clear(self, worker):
        self.calls.append(("clear", worker))
        await super().clear(worker)


def sample(ingestor: EventIngestor, name: str, **labels) -> float:
    return ingestor.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_stored_removed_cleared_become_add_remove_clear_with_tiers():
    index = MemoryPrefixIndex()
    ing = EventIngestor(index, SPEC)
    assert await ing.apply("w", batch(stored(1, 2, 3), stored(1, 2, medium="CPU")))
    assert (await index.lookup([1, 2, 3]))["w"].segments == ((2, ("cpu", "gpu")), (1, ("gpu",)))
    await ing.apply("w", batch(BlockRemoved((2,), "GPU")))
    assert (await index.lookup([1, 2, 3]))["w"].segments == (
        (1, ("cpu", "gpu")),
        (1, ("cpu",)),
        (1, ("gpu",)),
    )
    await ing.apply("v", batch(stored(1, medium=None)))  # no medium: GPU
    await ing.apply("w", batch(AllBlocksCleared()))
    assert await index.workers() == {"v"}
    assert (
        sample(ing, "tokenkeys_router_worker_clears_total", worker="w", reason="all_blocks_cleared")
        == 1
    )
    assert sample(ing, "tokenkeys_router_kv_events_total", worker="w", type="BlockStored") == 2
    assert sample(ing, "tokenkeys_router_kv_batches_total", worker="w", outcome="applied") == 3


async def test_order_within_and_across_batches_is_kept():
    index = MemoryPrefixIndex()
    ing = EventIngestor(index, SPEC)
    await ing.apply("w", batch(stored(1, 2), BlockRemoved((2,), "GPU"), stored(2)))
    await ing.apply("w", batch(stored(3), AllBlocksCleared(), stored(7)))
    await ing.apply("w", batch(stored(8), BlockRemoved((8,), "GPU")))
    assert await index.lookup([1]) == {} and await index.lookup([8]) == {}
    assert (await index.lookup([7]))["w"].blocks == 1


async def test_consecutive_events_of_one_kind_and_tier_make_one_index_call():
    index = CountingIndex()
    ing = EventIngestor(index, SPEC)
    # vLLM sends one BlockRemoved per evicted hash.
    removes = [BlockRemoved((h,), "GPU") for h in (10, 11, 12)]
    await ing.apply("w", batch(stored(1, 2), stored(3), *removes, stored(4, medium="CPU")))
    assert index.calls == [
        ("add", "w", (1, 2, 3), "gpu"),
        ("remove", "w", (10, 11, 12), "gpu"),
        ("add", "w", (4,), "cpu"),
    ]


async def test_hashes_are_converted_to_u64_index_keys():
    index = MemoryPrefixIndex()
    await EventIngestor(index, SPEC).apply(
        "w", batch(stored(-1, b"\x00" * 24 + b"\x00" * 7 + b"\x05"))
    )
    assert (await index.lookup([(1 << 64) - 1, 5]))["w"].blocks == 2


@pytest.mark.parametrize(("spec", "reason"), [(OTHER, "foreign_spec"), (None, "no_spec")])
async def test_a_batch_of_another_spec_is_ignored_and_counted(spec, reason):
    index = CountingIndex()
    ing = EventIngestor(index, SPEC)
    assert not await ing.apply("w", batch(stored(1, 2), AllBlocksCleared(), spec=spec))
    assert index.calls == [] and await index.workers() == frozenset()
    assert sample(ing, "tokenkeys_router_kv_events_ignored_total", worker="w", reason=reason) == 2
    assert sample(ing, "tokenkeys_router_kv_batches_total", worker="w", outcome="ignored") == 1


async def test_restart_and_lost_batches_clear_the_worker_first():
    index = MemoryPrefixIndex()
    ing = EventIngestor(index, SPEC)
    await ing.apply("w", batch(stored(1, 2)))
    await ing.apply("v", batch(stored(1, 2)))
    await ing.apply("w", batch(stored(5)), restarted=True)
    assert set(await index.lookup([1])) == {"v"}
    assert (await index.lookup([5]))["w"].blocks == 1
    await ing.apply("v", batch(stored(6)), lost_before=3)
    assert set(await index.lookup([1])) == set() and set(await index.lookup([6])) == {"v"}
    for worker, reason in (("w", "publisher_restart"), ("v", "events_lost")):
        assert (
            sample(ing, "tokenkeys_router_worker_clears_total", worker=worker, reason=reason) == 1
        )


async def test_group_kind_and_medium_filters():
    index = MemoryPrefixIndex()
    ing = EventIngestor(index, SPEC, group_idx=0)
    await ing.apply(
        "w",
        batch(
            stored(1, 2, group_idx=0, kv_cache_spec_kind="full_attention"),
            stored(3, group_idx=1, kv_cache_spec_kind="full_attention"),
            stored(4, group_idx=0, kv_cache_spec_kind="sliding_window"),
            stored(5, medium="GPU,CPU"),
            BlockRemoved((2,), "GPU", group_idx=1),  # another group's eviction: not ours
        ),
    )
    assert (await index.lookup([1, 2]))["w"].blocks == 2
    for key in (3, 4, 5):
        assert await index.lookup([key]) == {}
    for reason in ("other_group", "not_prefix_kind", "bad_medium"):
        want = 2 if reason == "other_group" else 1
        assert (
            sample(ing, "tokenkeys_router_kv_events_ignored_total", worker="w", reason=reason)
            == want
        )


async def test_a_hybrid_models_window_group_is_indexed_under_its_own_keys():
    # vLLM 0.32's Gemma 3 layout: group 0 a 64-token window, group 1 full attention; the window
    # group publishes the same hashes as full attention for the blocks it keeps.
    layout = GroupLayout(1, 16, (WindowGroup(0, 64, 16),))
    index = MemoryPrefixIndex()
    ing = EventIngestor(index, SPEC, layout=layout)
    window = {"group_idx": 0, "kv_cache_spec_kind": "sliding_window"}
    full = {"group_idx": 1, "kv_cache_spec_kind": "full_attention"}
    await ing.apply("w", batch(stored(1, 2, 3, **full), stored(2, 3, **window)))
    assert (await index.lookup([1, 2, 3]))["w"].blocks == 3
    assert (await index.lookup([group_key(k, 0, 1) for k in (2, 3)]))["w"].blocks == 2
    # The window group evicts block 2: full attention keeps it.
    await ing.apply("w", batch(BlockRemoved((2,), "GPU", group_idx=0)))
    assert (await index.lookup([1, 2, 3]))["w"].blocks == 3
    assert await index.lookup([group_key(2, 0, 1)]) == {}
    assert (
        sample(ing, "tokenkeys_router_kv_events_ignored_total", worker="w", reason="other_group")
        == 0
    )


async def test_index_errors_propagate_and_are_counted():
    class DownIndex(MemoryPrefixIndex):
        async def add(self, worker, keys, tier="gpu"):
            raise Unavailable("down")

    ing = EventIngestor(DownIndex(), SPEC, metrics=IngestMetrics())
    with pytest.raises(Unavailable):
        await ing.apply("w", batch(stored(1)))
    assert sample(ing, "tokenkeys_router_kv_batches_total", worker="w", outcome="failed") == 1


# ----------------------------------------------------------------------------- properties

HASHES = st.lists(st.integers(0, 5), min_size=1, max_size=4).map(tuple)
MEDIA = st.sampled_from(["GPU", "CPU", None])
EVENTS = st.lists(
    st.one_of(
        st.builds(lambda h, m: stored(*h, medium=m), HASHES, MEDIA),
        st.builds(BlockRemoved, HASHES, MEDIA),
        st.just(AllBlocksCleared()),
    ),
    max_size=12,
)


@given(st.lists(EVENTS, min_size=1, max_size=4))
async def test_coalesced_batches_equal_events_applied_one_by_one(batches):
    index = MemoryPrefixIndex()
    ingestor = EventIngestor(index, SPEC)
    facts: set[tuple[str, int]] = set()  # (tier, key) of worker "w"
    for events in batches:
        await ingestor.apply("w", batch(*events))
        for event in events:
            if isinstance(event, AllBlocksCleared):
                facts.clear()
                continue
            tier = (event.medium or "GPU").lower()
            change = {(tier, h) for h in event.block_hashes}
            facts = facts | change if isinstance(event, BlockStored) else facts - change
    for key in range(6):
        got = await index.lookup([key])
        want = tuple(sorted(t for t, k in facts if k == key))
        assert (got["w"].segments[0][1] if got else ()) == want


# ----------------------------------------------------------------------------- metrics, media


def exported(metrics: IngestMetrics) -> set[tuple[str, tuple, float]]:
    """Every counter sample in the registry: (name, sorted labels, value)."""
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }


async def test_only_the_series_ingest_used_are_exported():
    # The counters' children are kept per (worker, label) once used: none exists before.
    ing = EventIngestor(MemoryPrefixIndex(), SPEC)
    await ing.apply("w", batch(stored(1), BlockRemoved((1,), "GPU")))
    await ing.apply("w", batch(stored(2)))
    await ing.apply("v", batch(stored(1), spec=OTHER))
    await ing.apply("v", batch(stored(3, medium="GPU,CPU")))
    assert exported(ing.metrics) == {
        ("tokenkeys_router_kv_batches_total", (("outcome", "applied"), ("worker", "w")), 2.0),
        ("tokenkeys_router_kv_events_total", (("type", "BlockStored"), ("worker", "w")), 2.0),
        ("tokenkeys_router_kv_events_total", (("type", "BlockRemoved"), ("worker", "w")), 1.0),
        ("tokenkeys_router_kv_batches_total", (("outcome", "ignored"), ("worker", "v")), 1.0),
        (
            "tokenkeys_router_kv_events_ignored_total",
            (("reason", "foreign_spec"), ("worker", "v")),
            1.0,
        ),
        ("tokenkeys_router_kv_batches_total", (("outcome", "applied"), ("worker", "v")), 1.0),
        (
            "tokenkeys_router_kv_events_ignored_total",
            (("reason", "bad_medium"), ("worker", "v")),
            1.0,
        ),
    }


async def test_ingestors_sharing_metrics_and_direct_increments_count_into_one_series():
    # One IngestMetrics serves every pool's ingestor, and the consumers count "dropped" and
    # "undecodable" batches through the counters themselves.
    metrics = IngestMetrics()
    first = EventIngestor(MemoryPrefixIndex(), SPEC, metrics=metrics)
    second = EventIngestor(MemoryPrefixIndex(), SPEC, metrics=metrics)
    await first.apply("w", batch(stored(1)))
    metrics.batches.labels("w", "applied").inc()
    await second.apply("w", batch(stored(2), stored(3, medium="CPU")))
    await first.reset("w", "worker_joined")
    await second.reset("w", "worker_joined")
    assert exported(metrics) == {
        ("tokenkeys_router_kv_batches_total", (("outcome", "applied"), ("worker", "w")), 3.0),
        ("tokenkeys_router_kv_events_total", (("type", "BlockStored"), ("worker", "w")), 3.0),
        (
            "tokenkeys_router_worker_clears_total",
            (("reason", "worker_joined"), ("worker", "w")),
            2.0,
        ),
    }


async def test_each_medium_maps_to_its_tier_beyond_the_media_an_ingestor_remembers():
    # An ingestor remembers the tiers of the first media it sees; every other medium, and every
    # invalid one, is still mapped (or refused) on its own, each time.
    index = CountingIndex()
    ing = EventIngestor(index, SPEC)
    media = [f"Tier{i}" for i in range(100)]
    for _ in range(2):
        for i, medium in enumerate(media):
            await ing.apply("w", batch(stored(i, medium=medium), stored(i, medium="GPU|CPU")))
        await ing.apply("w", batch(stored(7, medium="gpu"), stored(8, medium="GPU")))
    want = [("add", "w", (i,), f"tier{i}") for i in range(100)] + [("add", "w", (7, 8), "gpu")]
    assert index.calls == want * 2
    assert (
        sample(ing, "tokenkeys_router_kv_events_ignored_total", worker="w", reason="bad_medium")
        == 200
    )
