"""The removal record beside the index: bounded per worker, marked with the applying batch."""

from __future__ import annotations

from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, SpecRef
from tokenkeys.router.explain.removals import RemovalLog
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.ingest.ingestor import EventIngestor

SPEC = SpecRef("vllm/sha256_cbor@0.31", "f" * 64)


def stored(*hashes: int) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=(), block_size=16)


async def test_a_removal_is_marked_with_its_batch_and_forgotten_once_stored_again():
    log = RemovalLog(MemoryPrefixIndex())
    ingestor = EventIngestor(log, SPEC)
    await ingestor.apply("w", EventBatch(10.0, (stored(1, 2, 3),), spec=SPEC), seq=7)
    await ingestor.apply(
        "w", EventBatch(11.0, (BlockRemoved(block_hashes=(2,)),), spec=SPEC), seq=8
    )
    removal = log.removal("w", 2)
    assert removal is not None
    assert (removal.tier, removal.mark.seq, removal.mark.engine_ts) == ("gpu", 8, 11.0)
    assert log.removal("w", 1) is None and log.removal("other", 2) is None
    await ingestor.apply("w", EventBatch(12.0, (stored(2),), spec=SPEC), seq=9)
    assert log.removal("w", 2) is None  # held again
    await ingestor.apply("w", EventBatch(13.0, (AllBlocksCleared(),), spec=SPEC), seq=10)
    cleared = log.cleared("w")
    assert cleared is not None and cleared.seq == 10
    # A call made outside a batch is marked without a sequence number.
    await log.remove("w", [5])
    assert log.removal("w", 5).mark.seq is None


async def test_the_record_is_bounded_per_worker_oldest_first():
    log = RemovalLog(MemoryPrefixIndex(), per_worker=3)
    await log.remove("w", [1, 2, 3])
    await log.remove("w", [1])  # removed again: the newest
    await log.remove("w", [4])
    assert [k for k in (1, 2, 3, 4) if log.removal("w", k)] == [1, 3, 4]
    await log.remove("w", list(range(100, 110)))
    assert [k for k in range(100, 110) if log.removal("w", k)] == [107, 108, 109]


async def test_a_watched_key_is_released_by_its_store_or_a_clear():
    log = RemovalLog(MemoryPrefixIndex())
    log.watch("w", 9)
    await log.add("w", [8])
    assert log.watching("w", 9)
    await log.add("w", [9])
    assert not log.watching("w", 9)
    log.watch("w", 9)
    await log.clear("w")
    assert not log.watching("w", 9)
