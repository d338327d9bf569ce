"""A bounded memo of block-key chains: :class:`ChainMemo`.

A block's key depends on the request context, its parent's key and its own tokens, so a trie
whose root is the exact context and whose edges are each block's exact token bytes returns the
keys :func:`~tokenkeys.keys.compute.block_keys` computed before for the same prefix: exact by
construction. Blocks past the longest known prefix are computed by ``block_keys`` continuing the
chain from the last known key (its ``parent`` argument) and then remembered.

Contexts whose extra keys depend on a block's position (multimodal items, prompt-embedding
digests) or that select a KV-cache group are not memoized: they go to ``block_keys`` whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenkeys.errors import ConfigError
from tokenkeys.keys.compute import block_keys, profile_for
from tokenkeys.keys.context import KeyContext
from tokenkeys.keys.profile import check_tokens, le_bytes
from tokenkeys.keys.spec import BlockKey, CacheKeySpec

_EMPTY = KeyContext()
# A trie node: block token bytes -> (that block's key, the node of its children).
_Node = dict[bytes, "tuple[BlockKey, _Node]"]


class ChainMemo:
    """Block keys of ``spec`` with the chains of earlier prompts remembered.

    At most ``max_entries`` blocks are remembered; inserting past that forgets every chain
    (the next prompts are computed in full and remembered again), so memory stays bounded.
    """

    def __init__(self, spec: CacheKeySpec, max_entries: int) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigError(
                f"max_entries must be a positive integer, got {max_entries!r}",
                field="max_entries",
            )
        self.spec = spec
        self.max_entries = max_entries
        self._profile = profile_for(spec)
        self._roots: dict[KeyContext, _Node] = {}
        self.entries = 0
        self.hits = 0
        self.resets = 0

    def block_keys(
        self, tokens: Sequence[int], context: KeyContext | None = None
    ) -> list[BlockKey]:
        """The keys ``block_keys(tokens, spec, context)`` returns (same validation, same errors)."""
        ctx = context if context is not None else _EMPTY
        if (
            not isinstance(ctx, KeyContext)
            or ctx.mm_items
            or ctx.prompt_embeds_digests
            or ctx.group is not None
        ):
            return block_keys(tokens, self.spec, ctx)
        arr = check_tokens(tokens)
        unit = self.spec.hash_unit
        n = len(arr) // unit
        self._profile.check_context(self.spec, ctx, n)
        data = le_bytes(arr)
        width = 4 * unit
        node = self._roots.get(ctx)
        keys: list[BlockKey] = []
        while node is not None and len(keys) < n:
            start = len(keys) * width
            known = node.get(data[start : start + width])
            if known is None:
                break
            keys.append(known[0])
            node = known[1]
        self.hits += len(keys)
        if len(keys) == n:
            return keys
        h = len(keys)
        rest = block_keys(arr[h * unit :], self.spec, ctx, keys[-1] if keys else None)
        if self.entries + len(rest) > self.max_entries:
            # Over budget: forget every chain and remember this prompt's alone.
            self._roots.clear()
            self.entries, self.resets = 0, self.resets + 1
            node, h, new = None, 0, keys + rest
        else:
            new = rest
        if len(new) <= self.max_entries:
            if node is None:
                node = self._roots.setdefault(ctx, {})
            for i, key in enumerate(new, h):
                child: _Node = {}
                node[data[i * width : (i + 1) * width]] = (key, child)
                node = child
            self.entries += len(new)
        return keys + rest
