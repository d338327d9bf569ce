"""What a hybrid engine can resume: per-group residency combined as vLLM's coordinator does.

A hybrid model (sliding-window and full-attention layers, e.g. Gemma 2 and 3, gpt-oss) keeps one
KV-cache group per attention kind, and every group keys its blocks with the same chained hashes.
A prefix is reusable only as far as *every* group can resume it, which vLLM 0.32 decides in
``HybridKVCacheCoordinator.find_longest_cache_hit`` (``vllm/v1/core/kv_cache_coordinator.py``):

- full attention first: the consecutive run of cached blocks from block 0
  (``FullAttentionManager.find_longest_cache_hit``), at most ``(num_tokens - 1) // block_size``
  blocks (``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length = num_tokens - 1``,
  the last token is always recomputed for its logits);
- then each sliding-window group, looking no further than that: scanning from the right, the
  first run of ``cdiv(window - 1, block_size)`` consecutive cached blocks ends the hit
  (``SlidingWindowManager._contiguous_blocks_for_hit`` and ``find_longest_cache_hit``: the
  layers attend to no token before the window, so older blocks may be gone); without such a run
  only the cached blocks from block 0 count;
- a group that shortens the hit makes the others look again (the fixed point of the
  coordinator's ``while True`` loop; full attention is downward-closed, so it only trims).

:func:`resumable_matches` applies that rule to a :class:`~tokenkeys.router.index.model.PrefixIndex`
in which each group's blocks are held under their own keys (:func:`group_key`), using nothing
but ``lookup``: a window's residency is the run over its keys. The answer has the shape of
``lookup``'s, truncated to the resumable blocks, so the scorer's ``matched_blocks`` is what vLLM
reports as ``cached_tokens`` (in blocks). Not modelled, because tokenkeys refuses such layouts
before routing them (``router.workers.pool.routing_layout``): groups of another block size than
the routing group, EAGLE's dropped block, Mamba and chunked-local groups.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tokenkeys.keys.spec import SLIDING_WINDOW
from tokenkeys.router.index.model import U64_MASK, PrefixIndex, PrefixMatch, Segment

# Per group index g > 0, its keys are the block keys XOR a 64-bit constant of g (the golden-ratio
# multiplier of splitmix64): a bijection of the key space, so no two blocks of one group share a
# key, and a group's key equals another group's only where two block hashes differ by exactly
# that constant (as likely as any 64-bit collision).
_GROUP_MIX = 0x9E3779B97F4A7C15


def group_key(key: int, group: int, routing_group: int) -> int:
    """The index key of block ``key`` (an event key, u64) held by KV-cache group ``group``.

    The routing group (full attention) keeps the event key itself, so a model of one group is
    indexed as before; every other group's blocks get keys of their own, because vLLM publishes
    the same hash for a block in each group that stores it.
    """
    if group == routing_group:
        return key
    return key ^ ((_GROUP_MIX * (group + 1)) & U64_MASK)


@dataclass(frozen=True)
class WindowGroup:
    """A sliding-window group as the hit rule needs it: its index and the blocks a hit needs."""

    index: int
    window: int
    block_size: int

    @property
    def need(self) -> int:
        """Consecutive blocks ending a hit: ``cdiv(window - 1, block_size)`` (vLLM 0.32)."""
        return max(1, -(-(self.window - 1) // self.block_size))


@dataclass(frozen=True)
class GroupLayout:
    """The KV-cache groups of a served model, as routing uses them.

    ``routing_group`` is the full-attention group whose keys the router computes and looks up
    first; ``windows`` are the sliding-window groups (same block size) that bound the hit.
    """

    routing_group: int
    block_size: int
    windows: tuple[WindowGroup, ...] = ()

    @property
    def hybrid(self) -> bool:
        """Whether another group than the routing one limits what is reusable."""
        return bool(self.windows)


def layout_of(groups: Sequence, routing_group: int, block_size: int) -> GroupLayout:
    """The :class:`GroupLayout` of a spec's ``KeyGroup`` values around ``routing_group``."""
    windows = tuple(
        WindowGroup(g.index, g.sliding_window, g.block_size)
        for g in groups
        if g.kind == SLIDING_WINDOW and g.index != routing_group
    )
    return GroupLayout(routing_group, block_size, windows)


def _truncated(match: PrefixMatch, blocks: int) -> PrefixMatch | None:
    """``match`` cut to its first ``blocks`` blocks (None when nothing is left)."""
    if blocks <= 0:
        return None
    segments: list[Segment] = []
    left = blocks
    for count, tiers in match.segments:
        segments.append((min(count, left), tiers))
        left -= count
        if left <= 0:
            break
    return PrefixMatch(match.worker, tuple(segments))


async def _window_hits(
    index: PrefixIndex,
    keys: Sequence[int],
    layout: GroupLayout,
    group: WindowGroup,
    limits: dict[str, int],
) -> dict[str, int]:
    """Per worker, the sliding-window group's hit within its limit (vLLM's right-to-left scan)."""
    own = [group_key(k, group.index, layout.routing_group) for k in keys]
    need = group.need
    hits: dict[str, int] = {}
    open_ = {w: n for w, n in limits.items() if n > 0}
    for end in range(max(open_.values(), default=0), need - 1, -1):
        # Workers whose scan reaches block ``end - 1``: the window ending there decides.
        asked = [w for w, n in open_.items() if n >= end]
        if not asked:
            continue
        found = await index.lookup(own[end - need : end], asked)
        for worker, match in found.items():
            if match.blocks == need:
                hits[worker] = end
                del open_[worker]
        if not open_:
            return hits
    if open_:
        # No full window: only the group's cached blocks from block 0 count.
        found = await index.lookup(own[:need], list(open_))
        for worker, limit in open_.items():
            match = found.get(worker)
            hits[worker] = min(match.blocks if match else 0, limit)
    return hits


async def resumable_matches(
    index: PrefixIndex,
    keys: Sequence[int],
    num_tokens: int,
    layout: GroupLayout,
    workers: Collection[str] | None = None,
) -> dict[str, PrefixMatch]:
    """Each worker's run of blocks the engine resumes for a prompt of ``num_tokens`` tokens.

    ``keys`` are the prompt's block keys in the routing group (what ``lookup`` takes). Without
    sliding-window groups this is ``lookup``'s answer itself (the historical meaning); with them,
    each run is cut to the hit vLLM's hybrid coordinator finds (see the module doc).
    """
    found = await index.lookup(keys, workers)
    if not layout.hybrid or not found:
        return found
    cap = max(0, (num_tokens - 1) // layout.block_size)
    hit = {w: min(m.blocks, cap) for w, m in found.items()}
    while True:
        before = dict(hit)
        for group in layout.windows:
            hit.update(await _window_hits(index, keys, layout, group, hit))
        if hit == before:
            break
    out = {}
    for worker, match in found.items():
        cut = _truncated(match, hit[worker])
        if cut is not None:
            out[worker] = cut
    return out
