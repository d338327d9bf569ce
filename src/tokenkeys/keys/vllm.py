"""vLLM v1 prefix-cache block hashes: ``sha256``, ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``.

Matched against the vLLM sources (``vllm/v1/core/kv_cache_utils.py``, ``vllm/utils/hashing.py``):

* tagged era, profile version 0.31: release wheels 0.31.0 and 0.33.0 (identical hashing code);
* bare era, profile version 0.29: a 0.29/0.30 copy of ``vllm-project/vllm``.

Block ``i`` hashes ``(parent, tuple(tokens_i), extra_keys_i or None)`` with the algorithm's
serializer (``cbor2.dumps(obj, canonical=True)`` or ``pickle.dumps(obj, protocol=5)``) and digest
(SHA-256, or ``xxh3_128``); ``parent`` is the previous block's full digest, or the root
(``NONE_HASH``) for block 0. Extra keys are, in order, LoRA + multimodal + cache salt (block 0
only) + prompt-embeds digest. Only full blocks are hashed. KV events carry
``int.from_bytes(digest, "big") & (2**64 - 1)`` (``maybe_convert_block_hash``).
"""

from __future__ import annotations

import hashlib
import pickle
from array import array
from collections.abc import Callable
from dataclasses import replace
from math import gcd
from typing import Any

import cbor2
import xxhash

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys import cbor, native
from tokenkeys.keys.context import KeyContext, items_overlapping
from tokenkeys.keys.profile import (
    Profile,
    check_block_size,
    event_keys_of,
    parse_groups,
    refuse_unsupported,
)
from tokenkeys.keys.spec import BlockKey, CacheKeySpec, KeyGroup, make_block_keys

# vllm/v1/core/kv_cache_utils.py (0.29+): DEFAULT_NONE_HASH_SEED.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_MASK64 = (1 << 64) - 1

_SOURCES_TAGGED = (
    "vllm 0.31.0 and 0.33.0 wheels: vllm/v1/core/kv_cache_utils.py "
    "(hash_block_tokens, generate_block_hash_extra_keys, init_none_hash, "
    "BlockHashListWithBlockSize, maybe_convert_block_hash)",
    "vllm 0.31.0 and 0.33.0 wheels: vllm/utils/hashing.py",
)
_SOURCES_BARE = (
    "vllm-project/vllm (0.29/0.30): vllm/v1/core/kv_cache_utils.py",
    "vllm 0.31.0 wheel: vllm/utils/hashing.py (unchanged since xxhash was added in 0.13)",
)


def _digest_fn(algorithm: str) -> Callable[[bytes], bytes]:
    if algorithm.startswith("sha256"):
        return lambda data: hashlib.sha256(data).digest()
    return xxhash.xxh3_128_digest


def _fresh(text: str) -> str:
    # A new str object with the same value. vLLM's strings come from request decoding, so two
    # equal names are distinct objects there; pickle's memo works by identity, so a Python-side
    # reconstruction must not let one object stand for two fields. (CPython shares 0- and
    # 1-character strings everywhere, so those stay shared, as in the engine.)
    return text.encode("utf-8").decode("utf-8")


class VllmProfile(Profile):
    """One vLLM hash algorithm in one extra-key era."""

    engine = "vllm"

    def __init__(self, algorithm: str, era: str) -> None:
        self.algorithm = algorithm
        self.era = era  # "0.31" tagged, "0.29" bare
        self.engine_version = era
        self.id = f"vllm/{algorithm}@{era}"
        self.cbor = algorithm.endswith("_cbor")
        self.tagged = era == "0.31"
        # Pickle output depends on CPython's object model; other languages cannot reproduce it.
        self.client_computable = self.cbor
        self.crypto = algorithm.startswith("sha256")
        self.digest_size = 32 if self.crypto else 16
        self._digest = _digest_fn(algorithm)
        self.sources = _SOURCES_TAGGED if self.tagged else _SOURCES_BARE
        span = "0.31-0.33" if self.tagged else "0.29-0.30"
        self.description = (
            f"vLLM {span} prefix_caching_hash_algo={algorithm}, "
            f"{'tagged' if self.tagged else 'bare'} extra keys"
        )

    # -- spec -------------------------------------------------------------------------------

    def parameters(self) -> dict[str, Any]:
        """Deployment parameters and supported context."""
        return {
            "block_size": "hash unit (vLLM hash_block_size); with groups, defaults to their gcd",
            "root": (
                ["default_seed", "root_seed", "root_hex"]
                if self.crypto
                else ["root_seed", "root_hex"]
            ),
            "groups": "list of group block sizes (multiples of the hash unit)",
            "supports": ["adapter", "cache_salt", "mm_items", "prompt_embeds", "group"],
            "adapter_path_required": self.tagged,
            "digest_bytes": self.digest_size,
        }

    def hash_object(self, obj: Any) -> bytes:
        """The engine's hash function on one Python object (``sha256_cbor(obj)`` etc.)."""
        if self.cbor:
            return self._digest(cbor2.dumps(obj, canonical=True))
        return self._digest(pickle.dumps(obj, protocol=5))

    def make_spec(
        self,
        block_size: int | None,
        *,
        root_seed: str | None = None,
        root_hex: str | None = None,
        groups: object = None,
    ) -> CacheKeySpec:
        """A spec; the root is ``hash_fn(seed)`` (vLLM ``init_none_hash``) or explicit bytes."""
        if root_seed is not None and root_hex is not None:
            raise InvalidArgument("give root_seed or root_hex, not both", field="root_seed")
        if root_hex is not None:
            try:
                root = bytes.fromhex(root_hex)
            except (TypeError, ValueError):
                raise InvalidArgument(
                    f"root_hex is not valid hex: {root_hex!r}", field="root_hex"
                ) from None
            if not 0 < len(root) <= 64:
                raise InvalidArgument(
                    f"root_hex must decode to 1..64 bytes, got {len(root)}", field="root_hex"
                )
            derivation = "explicit"
        elif root_seed is not None:
            if not isinstance(root_seed, str):
                raise InvalidArgument("root_seed must be a string", field="root_seed")
            root = self.hash_object(root_seed)
            derivation = f"seed:{root_seed}"
        else:
            if not self.crypto:
                # vLLM 0.29+ resolve_none_hash_seed: xxhash* get os.urandom(32).hex() as the seed
                # unless PYTHONHASHSEED is set, so there is no default to reproduce.
                raise InvalidArgument(
                    f"{self.id} has no reproducible default root: vLLM seeds xxhash roots "
                    "randomly per process unless PYTHONHASHSEED is set. Pass root_seed="
                    "<the engine's PYTHONHASHSEED> or root_hex=<the root bytes it publishes>.",
                    field="root_seed",
                )
            root = self.hash_object(DEFAULT_NONE_HASH_SEED)
            derivation = "default_seed"
        spec_groups, unit = self._layout(block_size, groups)
        return CacheKeySpec(
            profile_id=self.id,
            engine=self.engine,
            algorithm=self.algorithm,
            engine_version=self.engine_version,
            hash_unit=unit,
            groups=spec_groups,
            root_hex=root.hex(),
            root_derivation=derivation,
            serialization="cbor_canonical" if self.cbor else "pickle_protocol5",
            digest="sha256" if self.crypto else "xxh3_128",
            event_encoding="u64_be_last8",
            extra_keys="vllm_tagged" if self.tagged else "vllm_bare",
            partial_block="never_hashed",
            client_computable=self.client_computable,
            required_context=("adapter.path",) if self.tagged else (),
        )

    def _layout(self, block_size: int | None, groups: object) -> tuple[tuple[KeyGroup, ...], int]:
        if not groups:
            if block_size is None:
                raise InvalidArgument("block_size is required without groups", field="block_size")
            unit = check_block_size(block_size)
            return (KeyGroup(0, unit),), unit
        parsed = parse_groups(groups)
        # vLLM resolve_kv_cache_block_sizes: hash_block_size = prefix_match_unit or the gcd of the
        # (prefix-cacheable) group block sizes; every group must be a multiple of it.
        unit = gcd(*(g.block_size for g in parsed)) if block_size is None else block_size
        check_block_size(unit)
        for g in parsed:
            if g.block_size % unit:
                raise InvalidArgument(
                    f"group {g.index} block size {g.block_size} is not a multiple of the hash "
                    f"unit {unit}; vLLM requires every group block size to be divisible by it",
                    field="groups",
                )
        return parsed, unit

    # -- extra keys -----------------------------------------------------------------------------

    def check_context(self, spec: CacheKeySpec, ctx: KeyContext, n_blocks: int) -> None:
        """Everything is supported; the tagged era also needs the adapter path."""
        refuse_unsupported(self.id, ctx, n_blocks, adapter=True, salt=True, mm=True, embeds=True)
        if ctx.parent is not None and len(ctx.parent) != self.digest_size:
            raise InvalidArgument(
                f"parent must be a {self.digest_size}-byte {self.algorithm} block digest, got "
                f"{len(ctx.parent)} bytes",
                field="parent",
            )
        if self.tagged and ctx.adapter is not None and ctx.adapter.path is None:
            raise InvalidArgument(
                f"{self.id} hashes ('lora', name, path): give the adapter path exactly as the "
                "engine registered it (--lora-modules name=path or /v1/load_lora_adapter)",
                field="adapter.path",
            )

    def extra_keys(self, ctx: KeyContext, block: int, start: int, end: int) -> tuple | None:
        """``generate_block_hash_extra_keys`` for one block, as Python objects."""
        keys: list[Any] = []
        if ctx.adapter is not None:
            name = _fresh(ctx.adapter.name)
            if self.tagged:
                keys.append(("lora", name, _fresh(ctx.adapter.path or "")))
            else:
                keys.append(name)
        for item in items_overlapping(ctx.mm_items, start, end):
            ident = _fresh(item.identifier)
            offset = item.offset - start
            keys.append(("mm", ident, offset) if self.tagged else (ident, offset))
        if start == 0 and ctx.parent is None and ctx.cache_salt:
            salt = _fresh(ctx.cache_salt)
            keys.append(("cache_salt", salt) if self.tagged else salt)
        if ctx.prompt_embeds_digests:
            digest = bytes(ctx.prompt_embeds_digests[block])
            keys.append(("prompt_embeds", digest) if self.tagged else digest)
        return tuple(keys) if keys else None

    # -- keys ---------------------------------------------------------------------------------

    def _parent(self, spec: CacheKeySpec, ctx: KeyContext) -> bytes:
        # hash_block_tokens: `if not parent_block_hash: parent_block_hash = NONE_HASH`.
        parent = ctx.parent or spec.root
        if not parent:
            raise InvalidArgument(f"spec for {self.id} has no root bytes", field="root_hex")
        return parent

    def _tails(self, ctx: KeyContext, n: int, bs: int) -> tuple[bytes, bytes, dict[int, bytes]]:
        """CBOR of each block's extra keys: (block 0, every other block, exceptions by block).

        Most blocks share one tail (``None``, or the adapter alone); only blocks a multimodal
        item overlaps, or every block with prompt embeddings, get their own.
        """
        if not (ctx.adapter or ctx.mm_items or ctx.prompt_embeds_digests or ctx.cache_salt):
            return cbor.NULL, cbor.NULL, {}
        encode, extra_keys = cbor.encode, self.extra_keys
        first = encode(extra_keys(ctx, 0, 0, bs))
        if ctx.prompt_embeds_digests:
            own = {b: encode(extra_keys(ctx, b, b * bs, b * bs + bs)) for b in range(1, n)}
            return first, cbor.NULL, own
        common = encode(extra_keys(_no_mm(ctx), 1, bs, 2 * bs)) if ctx.adapter else cbor.NULL
        touched: set[int] = set()
        for item in ctx.mm_items:
            touched.update(range(max(item.offset // bs, 1), min((item.end - 1) // bs + 1, n)))
        own = {b: encode(extra_keys(ctx, b, b * bs, b * bs + bs)) for b in sorted(touched)}
        return first, common, own

    def compiled_chain(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """``_chains.vllm_cbor`` for the *_cbor algorithms (pickle has no compiled chain)."""
        core = native.chains(xxhash=not self.crypto) if self.cbor else None
        if core is None:
            return None
        first_tail, common, own = self._tails(ctx, len(tokens) // spec.hash_unit, spec.hash_unit)
        root = self._parent(spec, ctx)
        return core.vllm_cbor, (root, first_tail, common, own or None, self.crypto)

    def unit_keys(self, tokens: array, spec: CacheKeySpec, ctx: KeyContext) -> list[BlockKey]:
        """Fast path for the *_cbor algorithms: every block's bytes encoded in one pass.

        The tokens of all blocks are CBOR-encoded at once (:func:`cbor.token_blocks`, framed by
        the array head and the common extra-keys tail), so the chain loop only feeds the
        parent and a slice of that buffer to a hasher already holding the constant prefix.
        """
        if not self.cbor:
            return self.reference_unit_keys(tokens, spec, ctx)
        bs = spec.hash_unit
        n = len(tokens) // bs
        if n == 0:
            return []
        if (keys := self.compiled_keys(tokens, spec, ctx)) is not None:
            return keys
        first_tail, common, own = self._tails(ctx, n, bs)
        root = self._parent(spec, ctx)
        data, offs = cbor.token_blocks(tokens, bs, cbor.head(4, bs), common)
        body0 = data[: offs[1] - len(common)] + first_tail
        d = self._digest(b"\x83" + cbor.head(2, len(root)) + root + body0)
        digests = [d]
        append = digests.append
        step_head = b"\x83" + cbor.head(2, self.digest_size)
        if own:
            # Blocks with their own tail: body without the common tail, then the block's tail.
            digest = self._digest
            for b in range(1, n):
                body = data[offs[b] : offs[b + 1]]
                tail = own.get(b)
                if tail is not None:
                    body = body[: len(body) - len(common)] + tail
                d = digest(step_head + d + body)
                append(d)
        elif self.crypto:
            # A SHA-256 state holding the constant prefix, copied per block: no concatenation.
            fresh = hashlib.sha256(step_head).copy
            for start, end in zip(offs[1:-1], offs[2:], strict=True):
                h = fresh()
                h.update(d)
                h.update(data[start:end])
                d = h.digest()
                append(d)
        else:
            digest = self._digest
            for start, end in zip(offs[1:-1], offs[2:], strict=True):
                d = digest(step_head + d + data[start:end])
                append(d)
        return make_block_keys(digests, event_keys_of(digests, last=True))

    def reference_unit_keys(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> list[BlockKey]:
        """Per block: build the 3-tuple, serialize it as vLLM does, hash, chain."""
        bs = spec.hash_unit
        token_list = tokens.tolist()
        parent = self._parent(spec, ctx)
        out = []
        for b in range(len(token_list) // bs):
            start, end = b * bs, (b + 1) * bs
            extra = self.extra_keys(ctx, b, start, end)
            parent = self.hash_object((parent, tuple(token_list[start:end]), extra))
            out.append(BlockKey(parent, int.from_bytes(parent, "big") & _MASK64))
        return out


def _no_mm(ctx: KeyContext) -> KeyContext:
    """``ctx`` without multimodal items (the tail of a block no item overlaps)."""
    return replace(ctx, mm_items=()) if ctx.mm_items else ctx


def profiles() -> dict[str, Callable[[], Profile]]:
    """Constructor table of every vLLM profile."""
    table: dict[str, Callable[[], Profile]] = {}
    for era in ("0.29", "0.31"):
        for algorithm in ("sha256_cbor", "sha256", "xxhash_cbor", "xxhash"):
            table[f"vllm/{algorithm}@{era}"] = lambda algorithm=algorithm, era=era: VllmProfile(
                algorithm, era
            )
    return table
