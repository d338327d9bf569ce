"""The one pure entry point for keys: :func:`block_keys` (specs come from
:func:`tokenkeys.keys.make.make_spec`, which sits above this module and the vectors).

``block_keys`` validates the inputs, lets the spec's profile refuse what it does not support,
computes every full hash unit and, for a group whose block spans several hash units, keeps the
key at each group block's last hash unit (vLLM >= 0.24). Nothing here holds state: the root,
seed and block size all come from the spec.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from tokenkeys.errors import FailedPrecondition, InvalidArgument, TokenkeysError
from tokenkeys.keys.context import KeyContext
from tokenkeys.keys.profile import Profile, check_tokens
from tokenkeys.keys.registry import get_profile
from tokenkeys.keys.spec import BlockKey, CacheKeySpec, KeyArray

# The context of a request without extras (frozen, so one instance serves every call).
_EMPTY = KeyContext()


def profile_for(spec: CacheKeySpec) -> Profile:
    """The registered profile a spec names, checked against the spec's own description."""
    if not isinstance(spec, CacheKeySpec):
        raise InvalidArgument(
            f"spec must be a CacheKeySpec, got {type(spec).__name__}", field="spec"
        )
    profile = get_profile(spec.profile_id)
    if (spec.engine, spec.algorithm, spec.engine_version) != (
        profile.engine,
        profile.algorithm,
        profile.engine_version,
    ):
        raise FailedPrecondition(
            f"spec {spec.profile_id} says engine={spec.engine} algorithm={spec.algorithm} "
            f"version={spec.engine_version}, which is not what that profile pins",
            field="spec",
        )
    return profile


def check_spec(spec: CacheKeySpec) -> Profile:
    """The spec's profile, once every field is what that profile builds from the spec's own
    parameters (hash unit, groups, root derivation); else :class:`FailedPrecondition`.

    This is the check a client makes before it trusts a spec it received: the root bytes must
    be ``H(seed)`` for a ``seed:`` or ``default_seed`` derivation (vLLM) or the seed's initHash
    (llm-d), empty for profiles without a root, and every descriptive field (serialization,
    digest, event encoding, extra-key rule, required context, ...) must be the profile's.
    """
    profile = profile_for(spec)
    derivation = spec.root_derivation
    root: dict[str, str] = {}
    if derivation.startswith("seed:"):
        root["root_seed"] = derivation[len("seed:") :]
    elif derivation == "explicit":
        root["root_hex"] = spec.root_hex
    elif derivation not in ("default_seed", "none"):
        raise FailedPrecondition(
            f"spec {spec.profile_id} has root_derivation {derivation!r}; known: 'default_seed', "
            "'seed:<s>', 'explicit', 'none'",
            field="root_derivation",
        )
    try:
        expected = profile.make_spec(
            spec.hash_unit, groups=[g.to_dict() for g in spec.groups], **root
        )
    except TokenkeysError as exc:
        raise FailedPrecondition(
            f"spec {spec.profile_id} cannot be rebuilt from its own parameters: {exc.message}",
            field="spec",
        ) from None
    have = spec.to_dict(include_vectors=False)
    want = expected.to_dict(include_vectors=False)
    differ = sorted(
        k for k in want if k not in ("vectors_digest", "fingerprint") and have.get(k) != want[k]
    )
    if differ:
        raise FailedPrecondition(
            f"spec {spec.profile_id} disagrees with its profile in {', '.join(differ)}: "
            + "; ".join(f"{k} is {have.get(k)!r}, the profile gives {want[k]!r}" for k in differ),
            field="spec",
        )
    return profile


def block_keys(
    tokens: Sequence[int],
    spec: CacheKeySpec,
    context: KeyContext | None = None,
    parent: object = None,
) -> list[BlockKey]:
    """Keys of every full block of ``tokens`` under ``spec``; the partial tail gets none.

    ``parent`` (a :class:`BlockKey` or digest bytes) continues a chain, overriding
    ``context.parent``. ``context.group`` selects a KV-cache group; without it the keys are at
    the hash unit. An empty prompt has no keys.
    """
    profile, arr, ctx, step = _prepared(tokens, spec, context, parent)
    if len(arr) < spec.hash_unit:
        return []
    keys = profile.unit_keys(arr, spec, ctx)
    return keys if step == 1 else keys[step - 1 :: step]


def block_key_array(
    tokens: Sequence[int],
    spec: CacheKeySpec,
    context: KeyContext | None = None,
    parent: object = None,
) -> KeyArray:
    """:func:`block_keys` as a :class:`KeyArray`: the same keys, the same checks and errors, in
    two flat buffers (digests, event keys) that the compiled chains write without a Python
    object per block; what a router needs per prompt (:attr:`KeyArray.index_keys`)."""
    profile, arr, ctx, step = _prepared(tokens, spec, context, parent)
    if len(arr) < spec.hash_unit:
        return KeyArray(b"", b"", 0, signed=profile.signed_events)
    keys = profile.unit_key_array(arr, spec, ctx)
    return keys if step == 1 else keys[step - 1 :: step]


def _prepared(
    tokens: Sequence[int], spec: CacheKeySpec, context: KeyContext | None, parent: object
) -> tuple[Profile, array, KeyContext, int]:
    """The checked inputs of a key computation: profile, tokens, context and the group step."""
    profile = profile_for(spec)
    ctx = context if context is not None else _EMPTY
    if not isinstance(ctx, KeyContext):
        raise InvalidArgument(
            f"context must be a KeyContext, got {type(ctx).__name__}", field="context"
        )
    if parent is not None:
        ctx = KeyContext(**{**_fields(ctx), "parent": getattr(parent, "digest", parent)})
    arr = check_tokens(tokens)
    unit = spec.hash_unit
    profile.check_context(spec, ctx, len(arr) // unit)
    step = 1
    if ctx.group is not None:
        step = spec.group(ctx.group).block_size // unit
    return profile, arr, ctx, step


def reference_block_keys(
    tokens: Sequence[int], spec: CacheKeySpec, context: KeyContext | None = None
) -> list[BlockKey]:
    """The same keys as :func:`block_keys` through the profile's straightforward reference."""
    profile = profile_for(spec)
    ctx = context if context is not None else _EMPTY
    arr = check_tokens(tokens)
    profile.check_context(spec, ctx, len(arr) // spec.hash_unit)
    keys = profile.reference_unit_keys(arr, spec, ctx)
    if ctx.group is None:
        return keys
    step = spec.group(ctx.group).block_size // spec.hash_unit
    return keys[step - 1 :: step]


def _fields(ctx: KeyContext) -> dict:
    return {name: getattr(ctx, name) for name in ctx.__dataclass_fields__}
