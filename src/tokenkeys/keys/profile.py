"""The interface every cache-key profile implements, and the checks they share.

A profile is one engine family's key algorithm at one engine version. It builds deployment specs
(:meth:`Profile.make_spec`), computes full-block keys at the spec's hash unit
(:meth:`Profile.unit_keys`, the fast path) and has a straightforward per-block reference of the
same algorithm (:meth:`Profile.reference_unit_keys`, serialize / hash / chain as the engine does)
that tests and benchmarks compare against byte for byte.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.keys import native
from tokenkeys.keys.context import KeyContext
from tokenkeys.keys.spec import SLIDING_WINDOW, BlockKey, CacheKeySpec, KeyArray, KeyGroup

MAX_BLOCK_SIZE = 1 << 20


@dataclass(frozen=True)
class ProfileInfo:
    """What ``list_profiles()`` reports for one profile."""

    id: str
    engine: str
    algorithm: str
    engine_version: str
    client_computable: bool
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the fields in their order, ``sources`` as a list."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["sources"] = list(self.sources)
        return out


_ZERO = array("I", [0])


def check_tokens(tokens: Sequence[int]) -> array:
    """Token ids as an unsigned 32-bit array; anything else is :class:`InvalidArgument`."""
    if isinstance(tokens, array) and tokens.typecode == "I" and tokens.itemsize == 4:
        return tokens
    core = native.chains()
    if core is not None and type(tokens) in (list, tuple):
        # A list's ints read in C: array("I", list) costs more than the chain it feeds. Into
        # one array of the right size: bytes then a copy took two large allocations, whose
        # page faults cost several times the reading (2-3 ms for 128k tokens here).
        arr = _ZERO * len(tokens)
        if core.u32_into(tokens, arr):
            return arr
    try:
        arr = array("I", tokens)
    except (OverflowError, TypeError, ValueError):
        bad = next(
            (
                (i, t)
                for i, t in enumerate(tokens)
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 1 << 32
            ),
            None,
        )
        where = f" (token {bad[0]} is {bad[1]!r})" if bad else ""
        raise InvalidArgument(
            f"token ids must be integers in [0, 2**32){where}", field="tokens"
        ) from None
    if arr.itemsize != 4:  # pragma: no cover - platforms where C unsigned int is not 32 bits
        raise Unsupported("this platform's array('I') is not 32-bit")
    return arr


def le_bytes(tokens: array) -> bytes:
    """Token ids as consecutive u32 little-endian bytes."""
    if sys.byteorder == "little":
        return tokens.tobytes()
    swapped = array("I", tokens)  # pragma: no cover - big-endian hosts
    swapped.byteswap()  # pragma: no cover
    return swapped.tobytes()  # pragma: no cover


def event_keys_of(digests: list[bytes], *, last: bool, signed: bool = False) -> list[int]:
    """The 8-byte big-endian integer at the end (``last``) or start of each equal-size digest.

    One vectorized read instead of an ``int.from_bytes`` per block.
    """
    if not digests:
        return []
    words = len(digests[0]) // 8
    values = np.frombuffer(b"".join(digests), dtype=">i8" if signed else ">u8")
    return values[words - 1 :: words].tolist() if last else values[::words].tolist()


def check_block_size(value: object, name: str = "block_size") -> int:
    """A positive block size within bounds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}", field=name)
    if not 0 < value <= MAX_BLOCK_SIZE:
        raise InvalidArgument(
            f"{name} must be greater than 0 and at most {MAX_BLOCK_SIZE}, got {value}", field=name
        )
    return value


def single_group(block_size: int, groups: object) -> tuple[KeyGroup, ...]:
    """The one group of profiles that have no hybrid-group support; refuses any other layout."""
    if groups:
        parsed = parse_groups(groups)
        if len(parsed) != 1 or parsed[0].block_size != block_size:
            raise Unsupported(
                f"this profile keys one KV-cache group at the block size; got groups "
                f"{[g.block_size for g in parsed]} with block_size {block_size}",
                field="groups",
            )
        return parsed
    return (KeyGroup(0, block_size),)


def parse_groups(groups: object) -> tuple[KeyGroup, ...]:
    """Groups given as block sizes, dicts or :class:`KeyGroup` values, indexed in order."""
    if not isinstance(groups, (list, tuple)) or not groups:
        raise InvalidArgument("groups must be a non-empty list", field="groups")
    out = []
    for i, g in enumerate(groups):
        if isinstance(g, KeyGroup):
            group = g
        elif isinstance(g, int) and not isinstance(g, bool):
            group = KeyGroup(i, g)
        elif isinstance(g, dict):
            group = KeyGroup.from_dict({"index": i, **g})
        else:
            raise InvalidArgument(
                f"groups[{i}] must be a block size, a dict or a KeyGroup, got {g!r}",
                field="groups",
            )
        check_block_size(group.block_size, f"groups[{i}].block_size")
        if group.index != i:
            raise InvalidArgument(
                f"groups[{i}] has index {group.index}; indexes must be 0, 1, ... in order",
                field="groups",
            )
        _check_window(group, i)
        if group.derivation != "last_hash_unit":
            raise Unsupported(
                f"group derivation {group.derivation!r} is not supported; use 'last_hash_unit'",
                field="groups",
            )
        out.append(group)
    return tuple(out)


def _check_window(group: KeyGroup, i: int) -> None:
    """A sliding-window group names its window (a positive token count); no other kind has one."""
    window = group.sliding_window
    if group.kind == SLIDING_WINDOW:
        if type(window) is not int or window < 1:
            raise InvalidArgument(
                f"groups[{i}] is a sliding_window group without a window: give sliding_window "
                f"as a positive number of tokens (vLLM's kv_cache_spec_sliding_window), got "
                f"{window!r}",
                field="groups",
            )
    elif window is not None:
        raise InvalidArgument(
            f"groups[{i}] of kind {group.kind!r} has sliding_window {window}; only "
            "sliding_window groups have a window",
            field="groups",
        )


class Profile(ABC):
    """One engine family's key algorithm at one engine version."""

    id: str
    engine: str
    algorithm: str
    engine_version: str
    client_computable: bool
    description: str
    sources: tuple[str, ...] = ()

    def info(self) -> ProfileInfo:
        """The listing entry for this profile."""
        # Every field but the computed parameters is the profile's attribute of the same name.
        copied = {
            f.name: getattr(self, f.name) for f in fields(ProfileInfo) if f.name != "parameters"
        }
        return ProfileInfo(**copied, parameters=self.parameters())

    @abstractmethod
    def parameters(self) -> dict[str, Any]:
        """Deployment parameters this profile takes, and what it supports."""

    @abstractmethod
    def make_spec(
        self,
        block_size: int | None,
        *,
        root_seed: str | None = None,
        root_hex: str | None = None,
        groups: object = None,
    ) -> CacheKeySpec:
        """An unsealed spec (no vectors, no fingerprint) for one deployment."""

    @abstractmethod
    def unit_keys(self, tokens: array, spec: CacheKeySpec, ctx: KeyContext) -> list[BlockKey]:
        """Keys of every full hash unit (fast path)."""

    #: The event keys are signed 64-bit integers (SGLang's); unsigned otherwise.
    signed_events = False

    def compiled_chain(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """The compiled chain (``keys/_native``) computing :meth:`unit_keys`, and its arguments
        after ``(key_type, tokens, block_size)``; ``None`` where there is none (not built,
        switched off, or none for this profile), and the Python fast path runs."""
        return None

    def compiled_keys(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> list[BlockKey] | None:
        """:meth:`unit_keys` through the compiled chain, or ``None`` where there is none."""
        call = self.compiled_chain(tokens, spec, ctx)
        if call is None:
            return None
        chain, args = call
        return chain(BlockKey, tokens, spec.hash_unit, *args)

    def unit_key_array(self, tokens: array, spec: CacheKeySpec, ctx: KeyContext) -> KeyArray:
        """:meth:`unit_keys` as a :class:`KeyArray`: the compiled chain writes its two buffers
        directly (no object per block); without one, the Python fast path's list is packed."""
        call = self.compiled_chain(tokens, spec, ctx)
        if call is None:
            keys = self.unit_keys(tokens, spec, ctx)
            size = len(keys[0].digest) if keys else 0
            return KeyArray.of(keys, size, signed=self.signed_events)
        chain, args = call
        digests, events = chain(None, tokens, spec.hash_unit, *args)
        n = len(events) // 8
        return KeyArray(digests, events, len(digests) // n if n else 0, signed=self.signed_events)

    @abstractmethod
    def reference_unit_keys(
        self, tokens: array, spec: CacheKeySpec, ctx: KeyContext
    ) -> list[BlockKey]:
        """The same keys computed the straightforward way, one engine-style call per block."""

    def check_context(self, spec: CacheKeySpec, ctx: KeyContext, n_blocks: int) -> None:
        """Refuse context fields this profile does not support (overridden per family)."""
        refuse_unsupported(self.id, ctx, n_blocks)


class RootlessProfile(Profile):
    """A family whose chain has no root (SGLang, Dynamo): one spec builder for all of them.

    Subclasses state the spec's wire facts as class attributes; ``chain_start`` says how the
    chain begins instead of a root, for the refusal of a root option.
    """

    chain_start: str
    serialization: str
    digest: str
    event_encoding: str
    extra_keys: str

    def make_spec(
        self,
        block_size: int | None,
        *,
        root_seed: str | None = None,
        root_hex: str | None = None,
        groups: object = None,
    ) -> CacheKeySpec:
        """A single-group spec; a root option is refused (the family has no root)."""
        if root_seed is not None or root_hex is not None:
            raise InvalidArgument(
                f"{self.id} has no root: {self.chain_start}; drop root_seed/root_hex",
                field="root_seed",
            )
        unit = check_block_size(block_size)
        return CacheKeySpec(
            profile_id=self.id,
            engine=self.engine,
            algorithm=self.algorithm,
            engine_version=self.engine_version,
            hash_unit=unit,
            groups=single_group(unit, groups),
            root_hex="",
            root_derivation="none",
            serialization=self.serialization,
            digest=self.digest,
            event_encoding=self.event_encoding,
            extra_keys=self.extra_keys,
            partial_block="never_hashed",
            client_computable=True,
        )


def refuse_unsupported(
    profile_id: str,
    ctx: KeyContext,
    n_blocks: int,
    *,
    adapter: bool = False,
    salt: bool = False,
    mm: bool = False,
    embeds: bool = False,
) -> None:
    """Raise :class:`Unsupported` for the first context field the profile cannot key.

    Then, for prompt embeddings, :class:`InvalidArgument` when there are fewer digests than
    full blocks. A group index is not checked here: every profile keys each group its spec
    lists, and an index the spec does not list is an :class:`InvalidArgument` (``spec.group``).
    """
    checks = (
        (ctx.adapter is not None and not adapter, "adapter", "LoRA adapters"),
        (ctx.cache_salt is not None and not salt, "cache_salt", "cache salts"),
        (bool(ctx.mm_items) and not mm, "mm_items", "multimodal items"),
        (bool(ctx.prompt_embeds_digests) and not embeds, "prompt_embeds", "prompt embeddings"),
    )
    for refused, name, what in checks:
        if refused:
            raise Unsupported(
                f"profile {profile_id} does not key {what}; the engine it pins either ignores "
                f"{name} in its block hashes or hashes it in a way no client can reproduce. "
                f"Drop {name} or use a profile that supports it (tokenkeys keys --list).",
                field=name,
            )
    if ctx.prompt_embeds_digests and len(ctx.prompt_embeds_digests) < n_blocks:
        raise InvalidArgument(
            f"prompt_embeds_digests has {len(ctx.prompt_embeds_digests)} entries for "
            f"{n_blocks} full blocks; give one SHA-256 digest per hash-unit block (digests past "
            "the last full block are not used)",
            field="prompt_embeds_digests",
        )
