"""SGLang radix/HiCache page hashes: SHA-256 chained over little-endian u32 token ids.

Matched against SGLang 0.5.23 (PyPI wheel): ``sglang/srt/mem_cache/utils.py`` (``get_hash_str``,
``hash_str_to_int64``, ``compute_node_event_hash_values``), ``sglang/srt/mem_cache/events.py``
(``record_store``) and ``sglang/srt/mem_cache/cpp_utils/hash_binding.cpp`` (the native page
hash), and the older pure-Python ``get_hash_str`` of ``hicache_storage.py``, which computes the
same bytes: page ``i`` digest = SHA-256(previous page digest (32 raw bytes, absent for the first
page) || u32-LE(token) for each token). Events carry the first 8 digest bytes as a signed
big-endian int64.

A cache salt (SGLang 0.5.23, default event format) seeds the event chain: the first page's
prior is SHA-256(b"sglang-cache-salt-v1\\0" || UTF-8 salt). LoRA adapters are refused: SGLang
namespaces a LoRA request's event hashes with its ``extra_key``, which ends in the adapter's
``lora_id``, a uuid5 of name and path for ``--lora-paths`` adapters but a random uuid4 for
adapters loaded at run time (``sglang/srt/lora/lora_registry.py``); nothing in a request says
which, so no client can know it. Multimodal inputs are already in the token ids (pad values), so
separate items are refused too.

Checked live against the sglang 0.5.23 wheel by ``tests/peers/test_peers_sglang.py``.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable
from typing import Any

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys import native
from tokenkeys.keys.context import KeyContext
from tokenkeys.keys.profile import (
    Profile,
    RootlessProfile,
    event_keys_of,
    le_bytes,
    refuse_unsupported,
)
from tokenkeys.keys.spec import BlockKey, CacheKeySpec, make_block_keys

# sglang 0.5.23 sglang/srt/mem_cache/utils.py compute_node_event_hash_values.
SALT_SEED_TAG = b"sglang-cache-salt-v1\x00"


def int64_of(digest: bytes) -> int:
    """``hash_str_to_int64``: first 16 hex digits as a signed 64-bit integer."""
    return int.from_bytes(digest[:8], "big", signed=True)


class SglangProfile(RootlessProfile):
    """SGLang page hashes as published in KV events."""

    engine = "sglang"
    algorithm = "sha256"
    engine_version = "0.5.23"
    id = "sglang/sha256@0.5.23"
    client_computable = True
    description = "SGLang 0.5.23 radix-cache page hash (SHA-256 chain over u32-LE token ids)"
    sources = (
        "sglang 0.5.23 wheel: sglang/srt/mem_cache/utils.py, sglang/srt/mem_cache/events.py, "
        "sglang/srt/mem_cache/cpp_utils/hash_binding.cpp",
        "sgl-project/sglang: python/sglang/srt/mem_cache/hicache_storage.py get_hash_str",
    )
    chain_start = "the first page is hashed without a prior digest"
    serialization = "u32_le_tokens"
    digest = "sha256"
    event_encoding = "i64_be_first8"
    extra_keys = "sglang_salt_seed"

    def parameters(self) -> dict[str, Any]:
        """Deployment parameters and supported context."""
        return {
            "block_size": "page_size",
            "root": ["none"],
            "supports": ["cache_salt"],
            "digest_bytes": 32,
        }

    def check_context(self, spec: CacheKeySpec, ctx: KeyContext, n_blocks: int) -> None:
        """Only the cache salt is supported."""
        refuse_unsupported(self.id, ctx, n_blocks, salt=True)

    def _prior(self, ctx: KeyContext) -> bytes:
        if ctx.parent is not None:
            if len(ctx.parent) != 32:
                raise InvalidArgument(
                    f"parent must be a 32-byte SGLang page digest, got {len(ctx.parent)} bytes",
                    field="parent",
                )
            return ctx.parent
        if ctx.cache_salt is not None:
            return hashlib.sha256(SALT_SEED_TAG + ctx.cache_salt.encode("utf-8")).digest()
        return b""

    signed_events = True

    def compiled_chain(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """``_chains.sglang``: the prior (empty, a parent, or the salt's seed)."""
        core = native.chains()
        return None if core is None else (core.sglang, (self._prior(ctx),))

    def unit_keys(self, tokens: array, spec: CacheKeySpec, ctx: KeyContext) -> list[BlockKey]:
        """Fast path: one little-endian buffer for all tokens, one SHA-256 call per page."""
        bs = spec.hash_unit
        n = len(tokens) // bs
        if n == 0:
            return []
        if (keys := self.compiled_keys(tokens, spec, ctx)) is not None:
            return keys
        prior = self._prior(ctx)
        step = bs * 4
        data = le_bytes(tokens[: n * bs])
        sha = hashlib.sha256
        digests = []
        append = digests.append
        for start in range(0, n * step, step):
            prior = sha(prior + data[start : start + step]).digest()
            append(prior)
        return make_block_keys(digests, event_keys_of(digests, last=False, signed=True))

    def reference_unit_keys(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> list[BlockKey]:
        """Per page, as the pure-Python ``get_hash_str`` does: hex prior, one update per token."""
        bs = spec.hash_unit
        token_list = tokens.tolist()
        prior_hex = self._prior(ctx).hex() or None
        out = []
        for b in range(len(token_list) // bs):
            hasher = hashlib.sha256()
            if prior_hex:
                hasher.update(bytes.fromhex(prior_hex))
            for t in token_list[b * bs : (b + 1) * bs]:
                hasher.update(t.to_bytes(4, byteorder="little", signed=False))
            prior_hex = hasher.hexdigest()
            value = int(prior_hex[:16], 16)
            out.append(
                BlockKey(bytes.fromhex(prior_hex), value - 2**64 if value >= 2**63 else value)
            )
        return out


def profiles() -> dict[str, Callable[[], Profile]]:
    """Constructor table of the SGLang profiles."""
    return {SglangProfile.id: SglangProfile}
