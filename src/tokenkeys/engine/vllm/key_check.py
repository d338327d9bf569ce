"""Live key verification: the engine's own BlockStored hashes against the keys tokenkeys computes.

For every prompt the sidecar forwards, :meth:`KeyCheck.expect` records the blocks the prompt
fills and the key tokenkeys computes for each. vLLM then publishes ``BlockStored`` for the
blocks it newly caches; :meth:`KeyCheck.observe` finds each stored block among the expected
ones by its tokens and position-free content (the block's tokens, and its parent being either
the engine's hash of the previous prompt block or none for the first) and counts it as a match
when the published hash is the expected key, a mismatch otherwise. Blocks the engine stores for
generated tokens, or for prompts no longer remembered, are not checked (nothing was expected).

The first mismatch is logged once with the likely cause, and :attr:`KeyCheck.verified` turns
False for good: from then on the sidecar advertises its keys as unverified.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from tokenkeys.events.model import BlockStored, EventBatch
from tokenkeys.keys import BlockKey, CacheKeySpec, KeyContext, block_keys

log = logging.getLogger(__name__)

#: Prompts remembered for matching (their events arrive shortly after their prefill).
REMEMBERED_PROMPTS = 1024


@dataclass(frozen=True)
class _Expected:
    """One expected block: its key in both published forms, and the request it came from."""

    event_key: int
    digest: bytes
    first: bool

    def matches(self, published: int | bytes) -> bool:
        return published == (self.event_key if isinstance(published, int) else self.digest)


class KeyCheck:
    """Expected keys of recent prompts, matched with the engine's BlockStored events."""

    def __init__(self, spec: CacheKeySpec, model: str, checked: Counter) -> None:
        self.spec = spec
        self.model = model
        self.block_size = spec.groups[0].block_size
        #: Expected blocks by their tokens (a block's tokens may repeat: keep every candidate).
        self._by_tokens: OrderedDict[tuple[int, ...], list[_Expected]] = OrderedDict()
        self.verified = True
        self.first_mismatch: str | None = None
        #: ``tokenkeys_engine_keys_checked_total{model, result}`` (see :func:`keys_checked`).
        self.checked = checked

    def expect(self, prompt: Sequence[int], context: KeyContext | None) -> int:
        """Record the keys of ``prompt``'s full blocks; return how many were recorded."""
        keys: list[BlockKey] = block_keys(prompt, self.spec, context)
        bs = self.block_size
        for i, key in enumerate(keys):
            tokens = tuple(prompt[i * bs : (i + 1) * bs])
            entry = _Expected(key.event_key, key.digest, i == 0)
            candidates = self._by_tokens.pop(tokens, [])
            if entry not in candidates:
                candidates.append(entry)
            self._by_tokens[tokens] = candidates[-8:]
        while len(self._by_tokens) > REMEMBERED_PROMPTS * 4:
            self._by_tokens.popitem(last=False)
        return len(keys)

    def observe(self, batch: EventBatch) -> None:
        """Check every stored block of ``batch`` that a recent prompt was expected to fill."""
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._check(event)

    def _check(self, event: BlockStored) -> None:
        bs = event.block_size or self.block_size
        for i, published in enumerate(event.block_hashes):
            tokens = tuple(event.token_ids[i * bs : (i + 1) * bs])
            candidates = self._by_tokens.get(tokens)
            if not candidates:
                continue  # generated tokens, or a prompt no longer remembered
            first = i == 0 and event.parent_block_hash is None
            if any(c.matches(published) for c in candidates):
                self.checked.labels(self.model, "match").inc()
            elif any(c.first == first for c in candidates):
                self.checked.labels(self.model, "mismatch").inc()
                self._mismatch(published, candidates[0], event, first)

    def _mismatch(
        self, published: int | bytes, expected: _Expected, event: BlockStored, first: bool
    ) -> None:
        if not self.verified:
            return
        self.verified = False
        self.first_mismatch = likely_cause(self.spec, published, event, first)
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


def likely_cause(
    spec: CacheKeySpec, published: int | bytes, event: BlockStored, first: bool
) -> str:
    """One phrase naming the most likely reason a stored block's hash differs."""
    if event.block_size and event.block_size != spec.groups[0].block_size:
        return (
            f"block size: the engine stores {event.block_size}-token blocks, "
            f"--block-size is {spec.groups[0].block_size}"
        )
    if event.lora_name is not None:
        return f"adapter handling: the block was stored under LoRA adapter {event.lora_name!r}"
    if event.extra_keys and any(event.extra_keys):
        return "adapter or cache_salt handling: the engine hashed extra keys for this block"
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
