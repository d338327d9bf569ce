"""The block ledger behind snapshots: what it keeps, and that a snapshot joins a stream exactly.

The joining property: for any batches and any point k of the stream, a consumer that applies
the snapshot taken at k and then the batches from k on ends where one that applied every batch
ends (no gap, nothing applied twice).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from tokenkeys.events.snapshot import BlockLedger


def stored(hashes, parent=None, tokens=(), size=2, **kw) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), size, **kw)


def batch(*events) -> EventBatch:
    return EventBatch(0.0, events)


def held(ledger: BlockLedger) -> list[tuple]:
    snap = ledger.snapshot(0)
    assert isinstance(snap.batch.events[0], AllBlocksCleared)
    return [(e.block_hashes, e.parent_block_hash, e.medium) for e in snap.batch.events[1:]]


def test_a_multi_block_event_becomes_one_block_each_with_its_parent_tokens_and_extra_keys():
    ledger = BlockLedger()
    ledger.apply(
        batch(stored([1, 2, 3], parent=9, tokens=range(6), extra_keys=(None, ("a",), None)))
    )
    snap = ledger.snapshot(5)
    assert snap.next_seq == 5 and snap.complete and snap.blocks == 3
    one, two, three = snap.batch.events[1:]
    assert (one.block_hashes, one.parent_block_hash, one.token_ids) == ((1,), 9, (0, 1))
    assert (two.block_hashes, two.parent_block_hash, two.token_ids) == ((2,), 1, (2, 3))
    assert two.extra_keys == (("a",),) and three.parent_block_hash == 2


def test_removal_is_per_medium_and_a_clear_forgets_everything():
    ledger = BlockLedger()
    ledger.apply(batch(stored([1, 2]), stored([1], medium="CPU")))
    ledger.apply(batch(BlockRemoved((1,), medium="GPU"), BlockRemoved((7,))))  # 7: unknown
    assert held(ledger) == [((2,), 1, None), ((1,), None, "CPU")]
    ledger.apply(batch(AllBlocksCleared()))
    assert held(ledger) == [] and len(ledger) == 0


def test_tokens_that_are_not_whole_blocks_are_left_out_not_guessed():
    ledger = BlockLedger()
    ledger.apply(batch(stored([1, 2], tokens=range(3))))
    assert [e.token_ids for e in ledger.snapshot(0).batch.events[1:]] == [(), ()]


def test_a_relayed_stream_says_what_it_does_not_know():
    ledger = BlockLedger(complete=False, reason="nothing relayed yet")
    assert not ledger.snapshot(0).complete
    ledger.joined(False, "vLLM's batches 0-4 were no longer buffered")
    snap = ledger.snapshot(0)
    assert (snap.complete, snap.reason) == (False, "vLLM's batches 0-4 were no longer buffered")


hashes = st.lists(st.integers(0, 12), min_size=1, max_size=4)
events = st.one_of(
    st.builds(lambda h, m: stored(h, medium=m), hashes, st.sampled_from([None, "CPU"])),
    st.builds(
        lambda h, m: BlockRemoved(tuple(h), medium=m), hashes, st.sampled_from([None, "CPU"])
    ),
    st.just(AllBlocksCleared()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(events, max_size=4), max_size=12), st.data())
def test_a_snapshot_then_the_stream_from_its_sequence_number_equals_the_whole_stream(runs, data):
    batches = [batch(*run) for run in runs]
    k = data.draw(st.integers(0, len(batches)))
    whole, early = BlockLedger(), BlockLedger()
    for b in batches:
        whole.apply(b)
    for b in batches[:k]:
        early.apply(b)
    joined = BlockLedger()
    joined.apply(early.snapshot(k).batch)
    for b in batches[k:]:
        joined.apply(b)
    assert held(joined) == held(whole)


def test_hybrid_groups_are_kept_apart_with_their_spec_fields():
    # vLLM's hybrid layout (tests/realengine/test_vllm_hybrid.py): the same block hashes in a
    # sliding-window group and a full-attention group; the window group evicts blocks alone.
    window = {"group_idx": 0, "kv_cache_spec_kind": "sliding_window"}
    window["kv_cache_spec_sliding_window"] = 64
    full = {"group_idx": 1, "kv_cache_spec_kind": "full_attention"}
    ledger = BlockLedger()
    ledger.apply(batch(stored([1, 2, 3, 4], parent=9, **window), stored([1, 2, 3, 4], **full)))
    ledger.apply(batch(BlockRemoved((1, 2), group_idx=0)))
    events = ledger.snapshot(0).batch.events[1:]
    by_group = {
        g: [(e.block_hashes[0], e.parent_block_hash) for e in events if e.group_idx == g]
        for g in (0, 1)
    }
    # The first kept window block names its chain's parent (block 2, evicted from the window
    # group, kept in the full one), as vLLM named it when it stored the block.
    assert by_group == {0: [(3, 2), (4, 3)], 1: [(1, None), (2, 1), (3, 2), (4, 3)]}
    for e in events:
        kind = window if e.group_idx == 0 else full
        assert e.kv_cache_spec_kind == kind["kv_cache_spec_kind"]
        assert e.kv_cache_spec_sliding_window == kind.get("kv_cache_spec_sliding_window")
