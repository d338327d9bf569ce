"""A paged KV prefix cache that behaves, and reports events, like vLLM's block pool.

Modelled on vLLM 0.33 `vllm/v1/core/block_pool.py` (``BlockPool``) for one KV-cache group:

- A fixed pool of blocks; a block is *free* when no running request references it. Free blocks
  wait in an LRU queue; a free block that still holds a cached prefix stays findable until it
  is reallocated.
- Allocation takes the least recently freed block. If it held a cached key, the key is evicted
  and a ``BlockRemoved`` with that one hash is queued (vLLM emits one event per removed hash).
- Finished blocks are cached by key; each call to :meth:`PagedPrefixCache.cache_blocks` queues
  one ``BlockStored`` for the newly cached blocks. Like vLLM, identical blocks are not
  de-duplicated (block tables are append-only): a recomputed block is stored again and each copy
  is removed on its own.
- :meth:`reset` succeeds only when no block is in use and then queues ``AllBlocksCleared``.

The cache never computes keys; it is handed keys that expose ``digest`` (the lookup identity)
and ``event_key`` (what events carry).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from tokenkeys.errors import ConfigError, FailedPrecondition
from tokenkeys.events.model import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
)


class BlockKeyLike(Protocol):
    """What the cache needs of a block key (``tokenkeys.keys`` ``BlockKey`` satisfies it)."""

    @property
    def digest(self) -> bytes: ...

    @property
    def event_key(self) -> int: ...


@dataclass(eq=False)
class Block:
    """One physical KV block: its id, reference count and the key it is cached under."""

    block_id: int
    ref_cnt: int = 0
    key: BlockKeyLike | None = None


class PagedPrefixCache:
    """Fixed pool of ``num_blocks`` blocks with reference counts, prefix reuse and LRU eviction.

    Events accumulate in order until :meth:`take_events`. ``group_idx``, ``medium`` and
    ``kv_cache_spec_kind`` are copied into every event, as vLLM's ``KVCacheManager`` does.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        group_idx: int = 0,
        medium: str = MEDIUM_GPU,
        kv_cache_spec_kind: str = "full_attention",
        sliding_window: int | None = None,
    ) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}", field=name)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.group_idx = group_idx
        self.medium = medium
        self.kv_cache_spec_kind = kv_cache_spec_kind
        self.sliding_window = sliding_window
        self._blocks = [Block(i) for i in range(num_blocks)]
        # LRU order of free blocks: first = next to be reallocated.
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self._blocks)
        # digest -> {block_id: block}; several blocks may hold the same key (no de-duplication).
        self._cached: dict[bytes, dict[int, Block]] = {}
        self._events: list[KvEvent] = []
        self.evictions = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request references (cached or empty): what allocation can use."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks currently findable by key."""
        return sum(len(v) for v in self._cached.values())

    def count_free(self, blocks: Sequence[Block]) -> int:
        """How many of ``blocks`` wait in the free queue (reference count 0), counted in C."""
        return list(map(attrgetter("ref_cnt"), blocks)).count(0)

    def match_prefix(self, keys: Sequence[BlockKeyLike]) -> list[Block]:
        """Return the cached blocks of the longest prefix of ``keys`` (not yet referenced)."""
        hits: list[Block] = []
        get, append = self._cached.get, hits.append
        for key in keys:
            holders = get(key.digest)
            if not holders:
                break
            append(next(iter(holders.values())))
        return hits

    def cached(self, key: BlockKeyLike) -> Block | None:
        """A block cached under ``key``, or None."""
        holders = self._cached.get(key.digest)
        return next(iter(holders.values())) if holders else None

    def touch(self, blocks: Sequence[Block]) -> None:
        """Reference ``blocks`` for a request, taking free ones out of the eviction queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self._free.pop(block.block_id, None)
            block.ref_cnt += 1

    def allocate(self, count: int) -> list[Block]:
        """Take ``count`` free blocks in LRU order, evicting the keys they held."""
        if count > len(self._free):
            raise FailedPrecondition(
                f"cannot allocate {count} KV blocks: {len(self._free)} of {self.num_blocks} "
                "are free; wait for running requests to finish"
            )
        out = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: Block) -> None:
        key = block.key
        if key is None:
            return
        holders = self._cached.get(key.digest)
        if holders is not None:
            holders.pop(block.block_id, None)
            if not holders:
                del self._cached[key.digest]
        block.key = None
        self.evictions += 1
        self._events.append(
            BlockRemoved(
                block_hashes=(key.event_key,), medium=self.medium, group_idx=self.group_idx
            )
        )

    def cache_blocks(
        self,
        blocks: Sequence[Block],
        keys: Sequence[BlockKeyLike],
        token_ids: Sequence[int],
        parent: BlockKeyLike | None,
        *,
        lora_id: int | None = None,
        lora_name: str | None = None,
        extra_keys: Sequence[tuple[Any, ...] | None] | None = None,
        span: bool = False,
    ) -> None:
        """Register newly filled ``blocks`` under ``keys`` and queue one BlockStored for them.

        ``token_ids`` are the tokens of exactly these blocks; ``parent`` is the key of the block
        before the first one (None when the first block starts at token 0). With ``span`` the
        tokens may cover more blocks before them, which the group did not keep (a sliding
        window's layout, ``events.model.hashed_offset``) and ``parent`` is the block before the
        tokens.
        """
        if not blocks:
            return
        whole = len(token_ids) == len(blocks) * self.block_size
        fits = span and len(token_ids) % self.block_size == 0
        fits = fits and len(token_ids) >= len(blocks) * self.block_size
        if len(blocks) != len(keys) or not (whole or fits):
            raise ValueError(
                f"cache_blocks got {len(blocks)} blocks, {len(keys)} keys and "
                f"{len(token_ids)} tokens (block size {self.block_size})"
            )
        for block, key in zip(blocks, keys, strict=True):
            block.key = key
            self._cached.setdefault(key.digest, {})[block.block_id] = block
        self._events.append(
            BlockStored(
                block_hashes=tuple(k.event_key for k in keys),
                parent_block_hash=None if parent is None else parent.event_key,
                token_ids=tuple(token_ids),
                block_size=self.block_size,
                lora_id=lora_id,
                medium=self.medium,
                lora_name=lora_name,
                extra_keys=tuple(extra_keys) if extra_keys is not None else (None,) * len(keys),
                group_idx=self.group_idx,
                kv_cache_spec_kind=self.kv_cache_spec_kind,
                kv_cache_spec_sliding_window=self.sliding_window,
            )
        )

    def free(self, blocks: Sequence[Block]) -> None:
        """Release a request's references; ``blocks`` in eviction order (first evicted first).

        vLLM frees a request's blocks tail first, so its deepest prefix blocks go first.
        """
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def reset(self) -> bool:
        """Drop every cached key if no block is in use; queue AllBlocksCleared. False if busy."""
        if len(self._free) != self.num_blocks:
            return False
        for block in self._blocks:
            block.key = None
        self._cached.clear()
        self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KvEvent]:
        """Return and forget the events queued since the last call, oldest first."""
        events, self._events = self._events, []
        return events
