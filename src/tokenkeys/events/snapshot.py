"""The blocks an event stream says are cached now, and the sequence number they are valid at.

A consumer that joins a stream late (a router started after the engine served for hours)
learns from a live subscription only what is published from then on, and from a replay only
what the publisher still buffers. :class:`BlockLedger` is kept beside the stream
(``events.stream.EventStream`` applies every batch it emits): every block stored and not yet
removed, with the fields its ``BlockStored`` carried. :meth:`BlockLedger.snapshot` gives them
as one batch (``AllBlocksCleared`` first, then one ``BlockStored`` per block, parents before
children as they were stored) together with ``next_seq``: the snapshot holds the effect of
every batch numbered below it and of none after, so a consumer that applies it and then
follows the stream from ``next_seq`` misses nothing and applies nothing twice.

What the ledger knows is what the stream carried. An engine whose cache starts empty with
its stream (the simulated engine) is ``complete`` from the start. A stream that relays
another publisher (the vLLM sidecar) knows only what it relayed: :meth:`BlockLedger.joined`
records where its knowledge starts; blocks vLLM stored before that and still holds are not in
the snapshot, which is then not ``complete`` and says why (never a false "cached": every
block in it is one the engine stored and has not reported removed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tokenkeys.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ExternalBlockHash,
)

#: The medium of an event without one: vLLM's default (GPU).
_GPU = "GPU"

_Key = tuple[ExternalBlockHash, str, int | None]


@dataclass(frozen=True)
class Snapshot:
    """A stream's cached blocks at ``next_seq`` (see the module doc).

    ``complete`` False: the blocks are true but some may be missing, ``reason`` says which.
    """

    next_seq: int
    batch: EventBatch
    complete: bool
    reason: str = ""

    @property
    def blocks(self) -> int:
        """The number of blocks in the snapshot."""
        return len(self.batch.events) - 1


class BlockLedger:
    """Every block stored and not removed, by (hash, medium, group); see the module doc."""

    def __init__(self, *, complete: bool = True, reason: str = "") -> None:
        # Each block as (the event that stored it, its position there): cheap on the stream's
        # hot path; the per-block events are built only when a snapshot is asked for.
        self._blocks: dict[_Key, tuple[BlockStored, int]] = {}
        self.complete = complete
        self.reason = reason

    def __len__(self) -> int:
        return len(self._blocks)

    def joined(self, complete: bool, reason: str = "") -> None:
        """Where the relayed knowledge starts: ``complete`` if it starts with the upstream
        publisher's first batch, else ``reason`` says what is missing."""
        self.complete, self.reason = complete, reason

    def apply_clear(self) -> None:
        """Forget every block (what a relay does when it may have missed removals)."""
        self._blocks.clear()

    def apply(self, batch: EventBatch) -> None:
        """Apply one batch's events in order."""
        blocks = self._blocks
        for event in batch.events:
            if isinstance(event, BlockStored):
                medium = (event.medium or _GPU).upper()
                for i, block_hash in enumerate(event.block_hashes):
                    key = (block_hash, medium, event.group_idx)
                    blocks.pop(key, None)  # a block stored again moves to the end (store order)
                    blocks[key] = (event, i)
            elif isinstance(event, BlockRemoved):
                medium = (event.medium or _GPU).upper()
                for block_hash in event.block_hashes:
                    blocks.pop((block_hash, medium, event.group_idx), None)
            elif isinstance(event, AllBlocksCleared):
                blocks.clear()

    def snapshot(self, next_seq: int) -> Snapshot:
        """The blocks now, valid at ``next_seq`` (the stream's next sequence number)."""
        events = (AllBlocksCleared(), *(_block(e, i) for e, i in self._blocks.values()))
        return Snapshot(next_seq, EventBatch(time.time(), events), self.complete, self.reason)


def _block(event: BlockStored, i: int) -> BlockStored:
    """Block ``i`` of ``event`` as a ``BlockStored`` of its own: its parent the previous
    block's hash, its tokens its own slice (when the event's tokens are whole blocks), its own
    extra keys."""
    if len(event.block_hashes) == 1:
        return event
    tokens, size = event.token_ids, event.block_size
    whole = size > 0 and len(tokens) == len(event.block_hashes) * size
    extra = event.extra_keys
    return BlockStored(
        (event.block_hashes[i],),
        event.block_hashes[i - 1] if i else event.parent_block_hash,
        tokens[i * size : (i + 1) * size] if whole else (),
        size,
        lora_id=event.lora_id,
        medium=event.medium,
        lora_name=event.lora_name,
        extra_keys=None if extra is None else (extra[i],),
        group_idx=event.group_idx,
        kv_cache_spec_kind=event.kv_cache_spec_kind,
        kv_cache_spec_sliding_window=event.kv_cache_spec_sliding_window,
    )
