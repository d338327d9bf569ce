"""Live key verification: the engine's own BlockStored hashes against the keys tokenkeys computes.

A stored block is identified as the engine hashes it: by its parent and its tokens (and the
extra keys vLLM hashes with them: adapter name, the first block's cache salt), never by its
tokens alone. For every prompt the sidecar forwards, :meth:`KeyCheck.expect` records each full
block under ``(parent, tokens, extra keys)`` -> the key tokenkeys computes, where the parent is
tokenkeys' key of the previous block (or none for the first). :meth:`KeyCheck.observe` places
each stored block of a ``BlockStored`` event: its parent is the event's ``parent_block_hash``
for the first block and the previous block of the same event after that; an engine hash is
resolved to the block it was placed at (every placed block's published hash is remembered,
so a prefix cached by an earlier request places the new tail vLLM stores). A placed block is a
match when its published hash is the expected key and a mismatch otherwise: the engine hashed a
block placed exactly and got another key. A block that cannot be placed (generated tokens, a
parent stored before the sidecar joined, a prompt no longer remembered) counts neither way.

Every KV-cache group is checked. A hybrid model's groups key their blocks with the same
chain, so one table of expected blocks serves all of them; what differs is which blocks an event
hashes: a sliding-window group publishes the tokens of the whole span after its parent but the
hashes of only its last blocks (``events.model.hashed_offset``). The span's head is walked from
the parent by tokens (it carries no extra keys: the one expected block with that parent and
those tokens, else the event is not placed), and each hash is checked at its block. A hash that
is another block's of the same span is not counted either way (the engine kept other blocks
than the span's tail, a layout this check does not place); only a hash that is no expected
block's there is a mismatch. An event of a group the spec does not have is one too: the engine's
layout is not the spec's.

An image block is placed like any other, by its parent, tokens and extra keys, and those extra
keys hold the image's identifier: a block whose identifier is not the one tokenkeys computed is
not placed (another client's image of the same size has the same placeholder tokens, so it
cannot be told from a wrong identifier). Only a prompt known to be the sidecar's alone (the start
probe's: random text, then a fresh random image) records its blocks after a random one as
*owned*, placed by parent and tokens alone: nobody else can store a block under that parent, so
another hash or other published extra keys there are a wrong identifier, proven
(``expect(owned_from=...)``).

The first mismatch is logged once with the likely cause, and :attr:`KeyCheck.verified` turns
False for good: from then on the sidecar advertises its keys as unverified.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from tokenkeys.engine.simulated.event_extra_keys import VllmEventExtraKeys
from tokenkeys.events.model import BlockStored, EventBatch, hashed_offset
from tokenkeys.keys import BlockKey, CacheKeySpec, KeyContext, block_keys

log = logging.getLogger(__name__)

#: Expected blocks and placed engine hashes remembered (least recently used dropped first).
REMEMBERED_BLOCKS = 1 << 17

#: The parent of a request's first block.
_ROOT = b""

Published = int | bytes


class _Lru(OrderedDict[Hashable, Any]):
    """A bounded map that forgets its least recently written entries."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: Hashable, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


class KeyCheck:
    """Expected keys of recent prompts, placed and matched with the engine's BlockStored events."""

    def __init__(
        self, spec: CacheKeySpec, model: str, checked: Counter, *, limit: int = REMEMBERED_BLOCKS
    ) -> None:
        self.spec = spec
        self.model = model
        self.block_size = spec.groups[0].block_size
        self._extra = VllmEventExtraKeys(spec.hash_unit)
        #: (parent digest or _ROOT, tokens, extra keys) -> the expected key of that block.
        self._expected: _Lru = _Lru(limit)
        #: (parent digest or _ROOT, tokens) -> the expected key, or None when several blocks
        #: (other extra keys) share them: walks a window group's unhashed head.
        self._children: _Lru = _Lru(limit)
        self._groups = {g.index: g for g in spec.groups}
        #: A published hash -> tokenkeys' digest of the block it was placed at (or, for an
        #: expected block, its event key -> its digest: a right key places its children).
        self._placed: _Lru = _Lru(limit)
        self.verified = True
        self.first_mismatch: str | None = None
        #: (parent digest, tokens) -> (expected key, expected extra keys) of blocks only the
        #: sidecar's own probe can store (see the module doc).
        self._owned: _Lru = _Lru(limit)
        #: Blocks placed and counted so far (either way).
        self.counted = 0
        #: ``tokenkeys_engine_keys_checked_total{model, result}`` (see :func:`keys_checked`).
        self.checked = checked

    def expect(
        self, prompt: Sequence[int], context: KeyContext | None, *, owned_from: int | None = None
    ) -> int:
        """Record the keys of ``prompt``'s full blocks; return how many were recorded.

        ``owned_from``: the index of the first block no other request can store (its parent is
        a block of random tokens only this prompt has); those blocks are placed by parent and
        tokens alone, so other extra keys there are a mismatch too.
        """
        keys: list[BlockKey] = block_keys(prompt, self.spec, context)
        bs = self.block_size
        parent = _ROOT
        for i, key in enumerate(keys):
            start = i * bs
            tokens = tuple(prompt[start : start + bs])
            extra = self._extra(context, start, start + bs)
            self._expected.put((parent, tokens, extra), key)
            if owned_from is not None and i >= owned_from:
                self._owned.put((parent, tokens), (key, extra))
            known = self._children.get((parent, tokens), key)
            self._children.put((parent, tokens), key if known == key else None)
            self._placed.put(key.event_key, key.digest)
            self._placed.put(key.digest, key.digest)
            parent = key.digest
        return len(keys)

    def observe(self, batch: EventBatch) -> None:
        """Check every stored block of ``batch`` that can be placed among the expected ones."""
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._check(event)

    def _check(self, event: BlockStored) -> None:
        if event.group_idx is not None and event.group_idx not in self._groups:
            self._group_unknown(event)
            return
        bs = event.block_size or self.block_size
        offset = hashed_offset(event) if event.block_size else 0
        if offset is None:
            return  # not vLLM's shape: nothing can be placed
        extras = event.extra_keys or ()
        parent: bytes | None = (
            _ROOT if event.parent_block_hash is None else self._placed.get(event.parent_block_hash)
        )
        tokens_of = event.token_ids
        # A window group: the span's blocks by parent and tokens place its unhashed head and
        # tell a hash of another block of the span from a wrong one.
        walk = self._walk(parent, tokens_of, bs) if offset else []
        if offset:
            if len(walk) < offset:
                return
            parent = walk[offset - 1].digest
        whole = len(walk) * bs == len(tokens_of)
        for i, published in enumerate(event.block_hashes):
            if parent is None:
                return  # an unplaced parent places none of its descendants
            at = offset + i
            tokens = tuple(tokens_of[at * bs : (at + 1) * bs])
            extra = extras[i] if i < len(extras) else None
            expected: BlockKey | None = self._expected.get((parent, tokens, extra))
            wrong_extra, owned_extra = False, None
            if expected is None and (parent, tokens) in self._owned:
                expected, owned_extra = self._owned[(parent, tokens)]
                wrong_extra = owned_extra != extra
            if expected is None:
                return  # generated tokens, or a prompt no longer remembered
            first = at == 0 and event.parent_block_hash is None
            self.counted += 1
            if _same(published, expected) and not wrong_extra:
                self.checked.labels(self.model, "match").inc()
            elif offset and (not whole or any(_same(published, k) for k in walk)):
                return  # another block of the span: the engine kept blocks not placed here
            else:
                self.checked.labels(self.model, "mismatch").inc()
                cause = _image_cause(extra, owned_extra) if wrong_extra else None
                self._mismatch(published, expected, event, first, cause)
            self._placed.put(published, expected.digest)
            parent = expected.digest

    def _walk(self, parent: bytes | None, tokens: Sequence[int], bs: int) -> list[BlockKey]:
        """The expected blocks of ``tokens`` from ``parent`` on, as far as they are known."""
        out: list[BlockKey] = []
        for start in range(0, len(tokens) - bs + 1, bs):
            if parent is None:
                break
            key: BlockKey | None = self._children.get((parent, tuple(tokens[start : start + bs])))
            if key is None:
                break
            out.append(key)
            parent = key.digest
        return out

    def _group_unknown(self, event: BlockStored) -> None:
        self.checked.labels(self.model, "mismatch").inc()
        if not self.verified:
            return
        self.verified = False
        self.first_mismatch = (
            f"KV-cache groups: the engine stored blocks of group {event.group_idx} "
            f"({event.kv_cache_spec_kind}), the spec has groups {sorted(self._groups)}"
        )
        log.error(
            "keys of model %s: %s; from now on this engine's keys are advertised as unverified",
            self.model,
            self.first_mismatch,
        )

    def _mismatch(
        self,
        published: Published,
        expected: BlockKey,
        event: BlockStored,
        first: bool,
        cause: str | None = None,
    ) -> None:
        if not self.verified:
            return
        self.verified = False
        self.first_mismatch = cause or likely_cause(self.spec, published, event, first)
        shown = expected.event_key if isinstance(published, int) else expected.digest.hex()
        got = published if isinstance(published, int) else published.hex()
        log.error(
            "keys of model %s do not match the engine's: expected %s, vLLM stored %s (%s); "
            "from now on this engine's keys are advertised as unverified",
            self.model,
            shown,
            got,
            self.first_mismatch,
        )


def _same(published: Published, key: BlockKey) -> bool:
    return published == (key.event_key if isinstance(published, int) else key.digest)


def _image_cause(published: Any, expected: Any) -> str:
    return (
        f"image identifier: the engine keyed a block of the sidecar's own image prompt with "
        f"extra keys {published!r}, tokenkeys with {expected!r} (--mm-model-id must be "
        "vLLM's --model argument as given, the root of its /v1/models entry, and the image "
        "hash algorithm vLLM's --mm-hasher-algorithm)"
    )


def likely_cause(
    spec: CacheKeySpec, published: int | bytes, event: BlockStored, first: bool
) -> str:
    """One phrase naming the most likely reason a stored block's hash differs."""
    group = next((g for g in spec.groups if g.index == (event.group_idx or 0)), spec.groups[0])
    if event.block_size and event.block_size != group.block_size:
        return (
            f"block size: the engine stores {event.block_size}-token blocks, "
            f"--block-size is {group.block_size}"
        )
    if event.lora_name is not None:
        return f"adapter handling: the block was stored under LoRA adapter {event.lora_name!r}"
    if event.extra_keys and any(event.extra_keys):
        return (
            "adapter, cache_salt, image identifier or prompt-embeds handling: the engine hashed "
            "extra keys for this block"
        )
    if first:
        return (
            "root seed: a first block differs, so the root hash does (vLLM's PYTHONHASHSEED vs "
            f"--root-seed, root {spec.root_derivation}), or the algorithm "
            f"{spec.algorithm!r} or the profile era {spec.engine_version!r} is not the engine's"
        )
    return (
        f"algorithm or era: the hash algorithm {spec.algorithm!r} or profile era "
        f"{spec.engine_version!r} is not the engine's"
    )


def keys_checked(registry: CollectorRegistry) -> Counter:
    """``tokenkeys_engine_keys_checked_total{model, result="match"|"mismatch"}`` in ``registry``."""
    return Counter(
        "tokenkeys_engine_keys_checked",
        "Blocks the engine stored for forwarded prompts, checked against tokenkeys' keys.",
        ("model", "result"),
        registry=registry,
    )
