"""A sliding-window KV-cache group beside the simulated engine's full-attention cache.

With ``--kv-groups`` naming a sliding window (``sliding_window@64:32,full_attention:32``) the
simulated engine keeps a hybrid model's layout as vLLM 0.32 does, so the router's hybrid rule
is exercised without a vLLM:

- which blocks the group keeps: after a prefill, the blocks the window of the last prompt token
  still reaches (``SlidingWindowManager.remove_skipped_blocks``: blocks wholly before token
  ``prompt_len - window + 1`` are freed before the step's blocks are cached), so its
  ``BlockStored`` carries the tokens of the whole new span and the hashes of its last blocks
  (``BlockPool.cache_full_blocks`` skips the nulled ones);
- what a request resumes: the full-attention hit, cut where the group finds
  ``cdiv(window - 1, block_size)`` consecutive cached blocks scanning right to left, else its
  cached blocks from block 0 (``SlidingWindowManager.find_longest_cache_hit``), repeated until
  no group shortens it (``HybridKVCacheCoordinator.find_longest_cache_hit``).

Simplifications, stated: each group has a pool of its own of the engine's ``num_blocks`` (vLLM
shares one pool between groups), and blocks filled while decoding are kept by full attention
only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenkeys.engine.simulated.paged_cache import Block, BlockKeyLike, PagedPrefixCache


class SimulatedWindow:
    """One sliding-window group: its blocks, and the hit vLLM's sliding-window manager finds."""

    def __init__(
        self, index: int, window: int, block_size: int, num_blocks: int, medium: str
    ) -> None:
        self.window = window
        self.block_size = block_size
        self.need = max(1, -(-(window - 1) // block_size))
        self.cache = PagedPrefixCache(
            num_blocks,
            block_size,
            group_idx=index,
            medium=medium,
            kv_cache_spec_kind="sliding_window",
            sliding_window=window,
        )

    def hit(self, keys: Sequence[BlockKeyLike], limit: int) -> tuple[int, list[Block]]:
        """The group's hit within ``limit`` blocks, and the cached blocks it resumes from."""
        run: list[Block] = []
        for i in range(limit - 1, -1, -1):
            block = self.cache.cached(keys[i])
            if block is None:
                run = []
                continue
            run.insert(0, block)
            if len(run) >= self.need:
                return i + self.need, run
        return len(run), run  # no full window: the cached run from block 0

    def store(
        self,
        keys: Sequence[BlockKeyLike],
        tokens: Sequence[int],
        first: int,
        stop: int,
        prompt_len: int,
        extra_keys: Sequence[tuple[Any, ...] | None] | None,
        lora_id: int | None,
        lora_name: str | None,
    ) -> list[Block]:
        """Cache the blocks ``first..stop-1`` the window still reaches; the blocks taken.

        ``extra_keys`` are those of blocks ``first..stop-1`` (the event carries the kept ones').
        """
        bs = self.block_size
        kept = max(first, max(0, prompt_len - self.window + 1) // bs)
        if kept >= stop:
            return []
        blocks = self.cache.allocate(stop - kept)
        self.cache.cache_blocks(
            blocks,
            keys[kept:stop],
            tokens[first * bs : stop * bs],
            keys[first - 1] if first > 0 else None,
            lora_id=lora_id,
            lora_name=lora_name,
            extra_keys=None if extra_keys is None else extra_keys[kept - first :],
            span=True,
        )
        return blocks


def resumable(
    windows: Sequence[SimulatedWindow], keys: Sequence[BlockKeyLike], hits: list[Block]
) -> tuple[list[Block], list[list[Block]]]:
    """The full-attention ``hits`` every group resumes (vLLM's hybrid fixed point), and the
    blocks each window group resumes from."""
    held: list[list[Block]] = [[] for _ in windows]
    limit = len(hits)
    while windows:
        before = limit
        for n, window in enumerate(windows):
            limit, held[n] = window.hit(keys, limit)
        if limit == before:
            break
    return hits[:limit], held
