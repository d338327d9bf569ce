"""llm-d router request keys: ``cbor-fnv`` (FNV-1a-64 over canonical CBOR) and ``xxh64``.

Matched against ``llm-d/llm-d-router`` ``pkg/kvcache/kvblock/token_processor.go``
(``NewChunkedTokenDatabase``, ``getInitHash``, ``hash``, ``hashXXH64``, ``prefixHashes``,
``chunkTokens``), ``extra_keys.go`` (``ComputeBlockExtraFeatures``) and the precise-prefix-cache
scorer's ``foldCacheSalt`` (``blockkeys.go``). ``cbor-fnv`` is the default since llm-d-kv-cache
PR #202 and is what llm-d-router v0.10.0 and llm-d-inference-sim compute; ``xxh64`` was added by
llm-d-router #2237 (commit c027acf).

* initHash = FNV-1a-64(UTF-8 seed) (cbor-fnv) or XXH64(seed, 0) (xxh64);
* root = H(initHash, no tokens, model) where model is the adapter name when there is one;
* key i = H(key i-1, tokens of block i, extras i), full blocks only;
* extras i = identifiers of the multimodal items overlapping block i (offset order), then the
  cache salt on block 0 only.

cbor-fnv: H = FNV-1a-64(CBOR canonical [parent uint, tokens array or null, extra]) where extra is
null, the model string (root), or an array of one-key maps ``{"Hash": id}``.
xxh64: H = XXH64(u64-LE parent || u32-LE tokens || for each extra: u64-LE byte length || bytes).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import xxhash

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys import cbor, native
from tokenkeys.keys.context import KeyContext, items_overlapping
from tokenkeys.keys.profile import (
    Profile,
    check_block_size,
    le_bytes,
    refuse_unsupported,
    single_group,
)
from tokenkeys.keys.spec import BlockKey, CacheKeySpec

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64-bit (Go ``hash/fnv`` New64a)."""
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & _MASK64
    return h


class LlmdProfile(Profile):
    """One llm-d request-key algorithm."""

    engine = "llmd"
    client_computable = True

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self.xxh = algorithm == "xxh64"
        self.engine_version = "c027acf" if self.xxh else "0.10"
        self.id = f"llmd/{algorithm}@{self.engine_version}"
        self.description = (
            "llm-d router request keys, hashAlgorithm=xxh64"
            if self.xxh
            else "llm-d router request keys, hashAlgorithm=cbor-fnv (default)"
        )
        self.sources = (
            "llm-d/llm-d-router: pkg/kvcache/kvblock/token_processor.go, extra_keys.go",
            "llm-d/llm-d-router: preciseprefixcache blockkeys.go foldCacheSalt",
        )

    def parameters(self) -> dict[str, Any]:
        """Deployment parameters and supported context."""
        return {
            "block_size": "blockSizeTokens",
            "root": ["root_seed (hashSeed, default '')"],
            "required_context": ["model"],
            "supports": ["adapter", "cache_salt", "mm_items"],
            "adapter": "the adapter name replaces the model name in the root",
            "digest_bytes": 8,
        }

    def _init_hash(self, seed: str) -> int:
        raw = seed.encode("utf-8")
        return xxhash.xxh64_intdigest(raw, 0) if self.xxh else fnv1a64(raw)

    def make_spec(
        self,
        block_size: int | None,
        *,
        root_seed: str | None = None,
        root_hex: str | None = None,
        groups: object = None,
    ) -> CacheKeySpec:
        """A spec; ``root_seed`` is llm-d's ``hashSeed`` (default ``""``)."""
        if root_hex is not None:
            raise InvalidArgument(
                f"{self.id} derives its root from hashSeed and the model name per request; "
                "pass root_seed=<hashSeed> instead of root_hex",
                field="root_hex",
            )
        seed = "" if root_seed is None else root_seed
        if not isinstance(seed, str):
            raise InvalidArgument("root_seed must be a string", field="root_seed")
        unit = check_block_size(block_size)
        return CacheKeySpec(
            profile_id=self.id,
            engine=self.engine,
            algorithm=self.algorithm,
            engine_version=self.engine_version,
            hash_unit=unit,
            groups=single_group(unit, groups),
            # The seed's init hash; the actual first parent also mixes in the model name.
            root_hex=self._init_hash(seed).to_bytes(8, "big").hex(),
            root_derivation=f"seed:{seed}",
            serialization="u64_le+u32_le_tokens+len_prefixed_extras"
            if self.xxh
            else "cbor_canonical",
            digest="xxh64" if self.xxh else "fnv1a64",
            event_encoding="u64",
            extra_keys="llmd_mm_ids_salt_block0",
            partial_block="never_hashed",
            client_computable=True,
            required_context=("model",),
        )

    def check_context(self, spec: CacheKeySpec, ctx: KeyContext, n_blocks: int) -> None:
        """Adapter, salt and multimodal items are supported; the model name is required."""
        refuse_unsupported(self.id, ctx, n_blocks, adapter=True, salt=True, mm=True)
        # required_context is ["model"] without conditions, so the rule is the same for every
        # call (with an adapter, whose name replaces the model in the root, and after a parent,
        # where no root is hashed): a client can check required_context alone.
        if ctx.model is None:
            raise InvalidArgument(
                f"{self.id} mixes the model name into the root: set context.model to the "
                "request's model (required even with an adapter or a parent)",
                field="model",
            )
        if ctx.parent is not None and len(ctx.parent) != 8:
            raise InvalidArgument(
                f"parent must be an 8-byte llm-d key, got {len(ctx.parent)} bytes", field="parent"
            )

    def _extras(self, ctx: KeyContext, b: int, bs: int) -> list[str]:
        ids = [m.identifier for m in items_overlapping(ctx.mm_items, b * bs, (b + 1) * bs)]
        if b == 0 and ctx.parent is None and ctx.cache_salt:
            ids.append(ctx.cache_salt)
        return ids

    def _root(self, spec: CacheKeySpec, ctx: KeyContext) -> int:
        if ctx.parent is not None:
            return int.from_bytes(ctx.parent, "big")
        init = int.from_bytes(spec.root, "big")
        model = ctx.adapter.name if ctx.adapter is not None else ctx.model or ""
        if self.xxh:
            return self._xxh(init, b"", [model])
        return fnv1a64(b"\x83" + cbor.encode_int(init) + cbor.NULL + cbor.encode(model))

    def _encoded_extras(self, ctx: KeyContext, n: int, bs: int) -> dict[int, bytes] | None:
        """Each block's extras as the bytes its payload ends with, for blocks that have any."""
        if not ctx.mm_items and not (ctx.parent is None and ctx.cache_salt):
            return None
        out = {}
        for b in range(n):
            extras = self._extras(ctx, b, bs)
            if not extras:
                continue
            if self.xxh:
                raws = [s.encode("utf-8") for s in extras]
                out[b] = b"".join(len(r).to_bytes(8, "little") + r for r in raws)
            else:
                out[b] = cbor.encode([{"Hash": s} for s in extras])
        return out

    @staticmethod
    def _xxh(parent: int, token_bytes: bytes, extras: list[str]) -> int:
        parts = [parent.to_bytes(8, "little"), token_bytes]
        for s in extras:
            raw = s.encode("utf-8")
            parts.append(len(raw).to_bytes(8, "little"))
            parts.append(raw)
        return xxhash.xxh64_intdigest(b"".join(parts), 0)

    def compiled_chain(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """``_chains.llmd_xxh64`` or ``llmd_cbor``: the root and each block's encoded extras."""
        core = native.chains(xxhash=self.xxh)
        if core is None:
            return None
        chain = core.llmd_xxh64 if self.xxh else core.llmd_cbor
        bs = spec.hash_unit
        return chain, (self._root(spec, ctx), self._encoded_extras(ctx, len(tokens) // bs, bs))

    def unit_keys(self, tokens: array, spec: CacheKeySpec, ctx: KeyContext) -> list[BlockKey]:
        """Fast path: token bytes encoded once, per-block concatenation."""
        bs = spec.hash_unit
        n = len(tokens) // bs
        if n == 0:
            return []
        if (keys := self.compiled_keys(tokens, spec, ctx)) is not None:
            return keys
        key = self._root(spec, ctx)
        out = []
        if self.xxh:
            data = le_bytes(tokens[: n * bs])
            step = bs * 4
            for b in range(n):
                key = self._xxh(key, data[b * step : (b + 1) * step], self._extras(ctx, b, bs))
                out.append(BlockKey(key.to_bytes(8, "big"), key))
            return out
        data, offs = cbor.token_blocks(tokens[: n * bs], bs)
        arr_head = cbor.head(4, bs)
        for b in range(n):
            extras = self._extras(ctx, b, bs)
            extra = cbor.encode([{"Hash": s} for s in extras]) if extras else cbor.NULL
            payload = (
                b"\x83" + cbor.encode_int(key) + arr_head + data[offs[b] : offs[b + 1]] + extra
            )
            key = fnv1a64(payload)
            out.append(BlockKey(key.to_bytes(8, "big"), key))
        return out

    def reference_unit_keys(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> list[BlockKey]:
        """Per block with the generic encoder (``cbor2.dumps(..., canonical=True)``)."""
        import cbor2

        bs = spec.hash_unit
        token_list = tokens.tolist()
        if ctx.parent is not None:
            key = int.from_bytes(ctx.parent, "big")
        else:
            init = int.from_bytes(spec.root, "big")
            model = ctx.adapter.name if ctx.adapter is not None else ctx.model or ""
            if self.xxh:
                key = self._xxh(init, b"", [model])
            else:
                key = fnv1a64(cbor2.dumps([init, None, model], canonical=True))
        out = []
        for b in range(len(token_list) // bs):
            chunk = token_list[b * bs : (b + 1) * bs]
            extras = self._extras(ctx, b, bs)
            if self.xxh:
                raw = b"".join(t.to_bytes(4, "little") for t in chunk)
                key = self._xxh(key, raw, extras)
            else:
                extra = [{"Hash": s} for s in extras] if extras else None
                key = fnv1a64(cbor2.dumps([key, chunk, extra], canonical=True))
            out.append(BlockKey(key.to_bytes(8, "big"), key))
        return out


def profiles() -> dict[str, Callable[[], Profile]]:
    """Constructor table of the llm-d profiles."""
    return {
        "llmd/cbor-fnv64@0.10": lambda: LlmdProfile("cbor-fnv64"),
        "llmd/xxh64@c027acf": lambda: LlmdProfile("xxh64"),
    }
