"""NVIDIA Dynamo KV-router block hashes: XXH3-64 per block, sequence hashes chained.

Matched against ``ai-dynamo/dynamo`` ``lib/kv-router/src/protocols.rs`` @038eab2
(``compute_block_hash_for_seq``, ``hash_mm_identifier``, ``compute_next_seq_hash``),
``lib/kv-hashing/src/salt.rs`` (``compute_salt_hash``) and ``lib/tokens/src/lib.rs``
(``compute_next_sequence_hash``), and checked against the compiled
``dynamo._core.compute_block_hash_for_seq`` of ``ai-dynamo-runtime`` 1.6.1 (live, by
``tests/peers/test_peers_dynamo.py``; the wheel exposes the local hashes, not the chain):

* seed = 1337 (+ XXH3-64(adapter name, seed 0)) (+ XXH3-64(cache namespace, seed 1)), wrapping
  u64 additions, empty strings count as absent;
* local hash i = XXH3-64(u32-LE tokens of block i || u64-LE of the sorted mm hashes of the
  items overlapping block i, seed);
* sequence hash 0 = local hash 0; sequence hash i = XXH3-64(u64-LE(seq i-1) || u64-LE(local i),
  seed 1337).

The key of a block is its sequence hash (digest = 8 bytes big-endian, event form = the u64).
The cache salt is Dynamo's ``cache_namespace``. An mm identifier of 64 hex digits maps to the u64
of its first 16 hex digits, any other identifier to XXH3-64(identifier, seed 0).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from typing import Any

import xxhash

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys import native
from tokenkeys.keys.context import KeyContext, items_overlapping
from tokenkeys.keys.profile import (
    Profile,
    RootlessProfile,
    le_bytes,
    refuse_unsupported,
)
from tokenkeys.keys.spec import BlockKey, CacheKeySpec

XXH3_SEED = 1337
_MASK64 = (1 << 64) - 1
_HEX = frozenset("0123456789abcdefABCDEF")
_PAIR = struct.Struct("<QQ")


def block_seed(adapter_name: str | None, namespace: str | None) -> int:
    """``compute_salt_hash(cache_namespace, lora_name)`` of dynamo-kv-hashing."""
    seed = XXH3_SEED
    if adapter_name:
        seed = (seed + xxhash.xxh3_64_intdigest(adapter_name.encode("utf-8"), 0)) & _MASK64
    if namespace:
        seed = (seed + xxhash.xxh3_64_intdigest(namespace.encode("utf-8"), 1)) & _MASK64
    return seed


def mm_hash(identifier: str) -> int:
    """``hash_mm_identifier``: vLLM 64-hex ids keep their first 16 hex digits, others XXH3."""
    if len(identifier) == 64 and all(c in _HEX for c in identifier):
        return int(identifier[:16], 16)
    return xxhash.xxh3_64_intdigest(identifier.encode("utf-8"), 0)


def next_sequence_hash(parent: int, local: int) -> int:
    """``compute_next_sequence_hash``."""
    return xxhash.xxh3_64_intdigest(_PAIR.pack(parent, local), XXH3_SEED)


class DynamoProfile(RootlessProfile):
    """Dynamo kv-router sequence hashes."""

    engine = "dynamo"
    algorithm = "xxh3"
    engine_version = "1.6"
    id = "dynamo/xxh3@1.6"
    client_computable = True
    description = (
        "Dynamo 1.6 KV router: XXH3-64 block hashes (seed 1337 + adapter/namespace), chained"
    )
    sources = (
        "ai-dynamo/dynamo @038eab2: lib/kv-router/src/protocols.rs",
        "ai-dynamo/dynamo: lib/kv-hashing/src/salt.rs, lib/tokens/src/lib.rs",
        "ai-dynamo-runtime 1.6.1: dynamo._core.compute_block_hash_for_seq (values cross-checked)",
    )
    chain_start = "the chain starts at the first block hash"
    serialization = "u32_le_tokens+u64_le_sorted_mm"
    digest = "xxh3_64"
    event_encoding = "u64"
    extra_keys = "dynamo_seed_mix"

    def parameters(self) -> dict[str, Any]:
        """Deployment parameters and supported context."""
        return {
            "block_size": "kv_block_size",
            "root": ["none"],
            "supports": ["adapter", "cache_salt", "mm_items"],
            "cache_salt": "Dynamo cache_namespace",
            "digest_bytes": 8,
        }

    def check_context(self, spec: CacheKeySpec, ctx: KeyContext, n_blocks: int) -> None:
        """Adapter, namespace (cache salt) and multimodal items are supported."""
        refuse_unsupported(self.id, ctx, n_blocks, adapter=True, salt=True, mm=True)
        if ctx.parent is not None and len(ctx.parent) != 8:
            raise InvalidArgument(
                f"parent must be an 8-byte Dynamo sequence hash, got {len(ctx.parent)} bytes",
                field="parent",
            )

    def _block_mm(self, ctx: KeyContext, start: int, end: int) -> bytes:
        hashes = sorted(mm_hash(m.identifier) for m in items_overlapping(ctx.mm_items, start, end))
        return struct.pack(f"<{len(hashes)}Q", *hashes)

    def _seed(self, ctx: KeyContext) -> int:
        return block_seed(ctx.adapter.name if ctx.adapter else None, ctx.cache_salt)

    def compiled_chain(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """``_chains.dynamo``: the seed, the parent if any, each block's multimodal hashes."""
        core = native.chains(xxhash=True)
        if core is None:
            return None
        bs = spec.hash_unit
        mm = (
            {b: self._block_mm(ctx, b * bs, (b + 1) * bs) for b in range(len(tokens) // bs)}
            if ctx.mm_items
            else None
        )
        seq = int.from_bytes(ctx.parent, "big") if ctx.parent is not None else None
        return core.dynamo, (self._seed(ctx), seq is not None, seq or 0, mm)

    def unit_keys(self, tokens: array, spec: CacheKeySpec, ctx: KeyContext) -> list[BlockKey]:
        """Fast path: one little-endian buffer, one XXH3 call per block and per chain step."""
        if (keys := self.compiled_keys(tokens, spec, ctx)) is not None:
            return keys
        bs = spec.hash_unit
        n = len(tokens) // bs
        data = le_bytes(tokens[: n * bs])
        step = bs * 4
        seed = self._seed(ctx)
        h64 = xxhash.xxh3_64_intdigest
        pack = _PAIR.pack
        seq = int.from_bytes(ctx.parent, "big") if ctx.parent is not None else None
        out = []
        for b in range(n):
            chunk = data[b * step : (b + 1) * step]
            if ctx.mm_items:
                chunk += self._block_mm(ctx, b * bs, (b + 1) * bs)
            local = h64(chunk, seed)
            seq = local if seq is None else h64(pack(seq, local), XXH3_SEED)
            out.append(BlockKey(seq.to_bytes(8, "big"), seq))
        return out

    def reference_unit_keys(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> list[BlockKey]:
        """Local hashes for every block first, then the rolling sequence hashes, as Dynamo does."""
        bs = spec.hash_unit
        token_list = tokens.tolist()
        seed = self._seed(ctx)
        local_hashes = []
        for b in range(len(token_list) // bs):
            raw = b"".join(t.to_bytes(4, "little") for t in token_list[b * bs : (b + 1) * bs])
            raw += self._block_mm(ctx, b * bs, (b + 1) * bs)
            local_hashes.append(xxhash.xxh3_64_intdigest(raw, seed))
        out = []
        seq = int.from_bytes(ctx.parent, "big") if ctx.parent is not None else None
        for local in local_hashes:
            seq = local if seq is None else next_sequence_hash(seq, local)
            out.append(BlockKey(seq.to_bytes(8, "big"), seq))
        return out


def profiles() -> dict[str, Callable[[], Profile]]:
    """Constructor table of the Dynamo profiles."""
    return {DynamoProfile.id: DynamoProfile}
