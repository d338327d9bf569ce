"""The ``extra_keys`` entry of a BlockStored event, as vLLM publishes it for one block.

vLLM 0.31+ (`vllm/v1/core/kv_cache_utils.py` ``generate_block_hash_extra_keys`` then
`vllm/distributed/kv_events.py` ``to_event_extra_keys``, unchanged through 0.33) computes the
block's hashing extra keys over the *group block* window and publishes them untagged:
``("lora", name, path)`` becomes the adapter name (the path is dropped), ``("mm", id, offset)``
becomes ``(id, offset)``, ``("cache_salt", salt)`` the salt (first block of a request only),
``("prompt_embeds", digest)`` the digest. The order stays LoRA, multimodal, salt, embeds; an empty
list is published as None. The untagged tuple equals what vLLM 0.19-0.30 hashed and published
(bare keys), so one rule serves both eras. See ../shared/reference/engines/vllm.md §2 and §4.5.
"""

from __future__ import annotations

from typing import Any

from tokenkeys.errors import Unsupported
from tokenkeys.keys.context import KeyContext, items_overlapping

EventExtraKeys = tuple[Any, ...] | None


class VllmEventExtraKeys:
    """``(context, start, end) -> extra_keys entry`` for blocks of ``hash_unit``-token units.

    Usable as the engine's ``event_extra_keys``; ``context`` is the request's
    :class:`~tokenkeys.keys.KeyContext` (None: no extra keys).
    """

    def __init__(self, hash_unit: int) -> None:
        self.hash_unit = hash_unit

    def __call__(self, context: KeyContext | None, start: int, end: int) -> EventExtraKeys:
        """The untagged extra keys of the block covering tokens ``[start, end)``."""
        if context is None:
            return None
        keys: list[Any] = []
        if context.adapter is not None:
            keys.append(context.adapter.name)
        for item in items_overlapping(context.mm_items, start, end):
            keys.append((item.identifier, item.offset - start))
        # vLLM salts only the request's first block (start == 0); a context continuing a chain
        # (parent set) does not start at the request's token 0.
        if start == 0 and context.parent is None and context.cache_salt:
            keys.append(context.cache_salt)
        if context.prompt_embeds_digests:
            if end - start != self.hash_unit:
                # vLLM hashes the embeddings of the whole group block; only per-hash-unit
                # digests are known here, and they cannot be combined into that digest.
                raise Unsupported(
                    f"prompt embeddings with a KV-cache group block of {end - start} tokens "
                    f"(hash unit {self.hash_unit}) cannot be reported in events exactly",
                    field="prompt_embeds",
                )
            keys.append(context.prompt_embeds_digests[start // self.hash_unit])
        return tuple(keys) if keys else None
