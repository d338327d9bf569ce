"""Conversions between the cache-key core and the ``openengine.v1`` cache-key messages.

One module for both sides of the wire: the server turns requests into :class:`KeyContext` values
and keys into ``BlockKeys`` here, the client does the reverse, so the two cannot drift. Errors
raised while reading a message name the message's own field names (``adapter_name``,
``mm_items[1].length``), which the server prefixes with the request's position.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as pb
from tokenkeys.errors import FailedPrecondition, InvalidArgument, TokenkeysError
from tokenkeys.keys.context import Adapter, KeyContext, MMItem
from tokenkeys.keys.profile import check_tokens
from tokenkeys.keys.spec import BlockKey, CacheKeySpec, canonical_json, make_block_keys

# Core field names (as KeyContext validation reports them) -> KeyContext message field names.
_CONTEXT_FIELDS = {
    "adapter.name": "adapter_name",
    "adapter.path": "adapter_path",
    "adapter": "adapter_name",
    "mm.identifier": "mm_items",
    "mm.offset": "mm_items",
    "mm.length": "mm_items",
    "prompt_embeds": "prompt_embeds_digests",
}


def message_field(core_field: str | None) -> str | None:
    """The KeyContext message field a core validation error is about."""
    if core_field is None:
        return None
    return _CONTEXT_FIELDS.get(core_field, core_field)


def signed_events(spec: CacheKeySpec) -> bool:
    """True when the spec's events carry signed integers (``i64_*`` encodings)."""
    return spec.event_encoding.startswith("i64")


# -- spec ---------------------------------------------------------------------------------------


def spec_to_message(spec: CacheKeySpec, *, include_vectors: bool = True) -> pb.CacheKeySpec:
    """The ``CacheKeySpec`` message of a sealed spec (``spec_json`` with or without vectors)."""
    return pb.CacheKeySpec(
        profile_id=spec.profile_id,
        profile_version=spec.engine_version,
        hash_unit=spec.hash_unit,
        groups=[
            pb.KeyGroup(
                index=g.index,
                kind=g.kind,
                block_size=g.block_size,
                derivation=g.derivation,
                sliding_window=g.sliding_window,
            )
            for g in spec.groups
        ],
        root=spec.root,
        root_derivation=spec.root_derivation,
        serialization=spec.serialization,
        digest=spec.digest,
        event_encoding=spec.event_encoding,
        extra_keys=spec.extra_keys,
        partial_block=spec.partial_block,
        client_computable=spec.client_computable,
        required_context=list(spec.required_context),
        spec_json=canonical_json(spec.to_dict(include_vectors=include_vectors)).decode("utf-8"),
        fingerprint=spec.fingerprint,
        engine=spec.engine,
        algorithm=spec.algorithm,
        vectors_digest=spec.vectors_digest,
    )


def spec_ref(spec: CacheKeySpec) -> pb.CacheKeySpecRef:
    """The short reference (profile, version, fingerprint) that discovery messages carry."""
    return pb.CacheKeySpecRef(
        profile_id=spec.profile_id,
        profile_version=spec.engine_version,
        spec_fingerprint=spec.fingerprint,
        client_computable=spec.client_computable,
    )


def spec_from_message(message: pb.CacheKeySpec) -> CacheKeySpec:
    """The spec a ``GetCacheKeySpec`` answer carries, read from its ``spec_json``.

    Raises :class:`FailedPrecondition` when the document cannot be read or when a field of the
    message disagrees with it (a server bug or a tampered answer). Whether the fingerprint
    recomputes is left to :class:`~tokenkeys.keys.strategy.KeyStrategy`, which then refuses to
    compute locally and says so.
    """
    try:
        data = json.loads(message.spec_json)
        if not isinstance(data, dict):
            raise ValueError("spec_json is not a JSON object")
        spec = CacheKeySpec.from_dict(data)
    except (ValueError, TypeError, KeyError, TokenkeysError) as exc:
        reason = exc.message if isinstance(exc, TokenkeysError) else str(exc)
        raise FailedPrecondition(
            f"the served cache-key spec cannot be read: {reason}", field="spec_json"
        ) from None
    expected = spec_to_message(spec, include_vectors=bool(spec.vectors))
    for name in (
        "profile_id",
        "profile_version",
        "hash_unit",
        "root",
        "root_derivation",
        "serialization",
        "digest",
        "event_encoding",
        "extra_keys",
        "partial_block",
        "client_computable",
        "fingerprint",
        "engine",
        "algorithm",
        "vectors_digest",
    ):
        if getattr(message, name) != getattr(expected, name):
            raise FailedPrecondition(
                f"the served cache-key spec says {name}={getattr(message, name)!r} but its "
                f"spec_json says {getattr(expected, name)!r}; the answer is inconsistent, do "
                "not trust it",
                field=name,
            )
    if list(message.groups) != list(expected.groups) or list(message.required_context) != list(
        expected.required_context
    ):
        raise FailedPrecondition(
            "the served cache-key spec's groups or required_context disagree with its spec_json",
            field="groups",
        )
    return spec


# -- context and requests -----------------------------------------------------------------------


def context_to_message(ctx: KeyContext | None) -> pb.KeyContext:
    """The ``KeyContext`` message of a core context (unset fields stay unset)."""
    msg = pb.KeyContext()
    if ctx is None:
        return msg
    if ctx.model is not None:
        msg.model = ctx.model
    if ctx.tokenizer_fingerprint is not None:
        msg.tokenizer_fingerprint = ctx.tokenizer_fingerprint
    if ctx.adapter is not None:
        msg.adapter_name = ctx.adapter.name
        if ctx.adapter.path is not None:
            msg.adapter_path = ctx.adapter.path
    if ctx.cache_salt is not None:
        msg.cache_salt = ctx.cache_salt
    msg.mm_items.extend(
        pb.MultimodalItem(identifier=m.identifier, offset=m.offset, length=m.length)
        for m in ctx.mm_items
    )
    msg.prompt_embeds_digests.extend(ctx.prompt_embeds_digests)
    if ctx.group is not None:
        msg.group = ctx.group
    if ctx.parent is not None:
        msg.parent = ctx.parent
    return msg


def context_from_message(msg: pb.KeyContext) -> KeyContext:
    """A validated core context; errors name the message field (``mm_items[1]: ...``)."""
    has = msg.HasField
    if has("adapter_path") and not has("adapter_name"):
        raise InvalidArgument(
            "adapter_path is set without adapter_name; give the adapter's name too, or neither",
            field="adapter_path",
        )
    items = []
    for j, item in enumerate(msg.mm_items):
        try:
            items.append(MMItem(item.identifier, item.offset, item.length))
        except TokenkeysError as exc:
            raise type(exc)(f"mm_items[{j}]: {exc.message}", field="mm_items") from None
    try:
        return KeyContext(
            model=msg.model if has("model") else None,
            tokenizer_fingerprint=(
                msg.tokenizer_fingerprint if has("tokenizer_fingerprint") else None
            ),
            adapter=(
                Adapter(msg.adapter_name, msg.adapter_path if has("adapter_path") else None)
                if has("adapter_name")
                else None
            ),
            cache_salt=msg.cache_salt if has("cache_salt") else None,
            mm_items=tuple(items),
            prompt_embeds_digests=tuple(msg.prompt_embeds_digests),
            group=msg.group if has("group") else None,
            parent=msg.parent if has("parent") else None,
        )
    except TokenkeysError as exc:
        raise type(exc)(exc.message, field=message_field(exc.field), **exc.details) from None


def request_to_message(tokens: Sequence[int], ctx: KeyContext | None = None) -> pb.KeyRequest:
    """One ``KeyRequest``; token ids outside ``[0, 2**32)`` are InvalidArgument."""
    request = pb.KeyRequest(token_ids=check_tokens(tokens))
    if ctx is not None:
        request.context.CopyFrom(context_to_message(ctx))
    return request


# -- keys ---------------------------------------------------------------------------------------


def keys_to_message(keys: Sequence[BlockKey], *, signed: bool) -> pb.BlockKeys:
    """``BlockKeys`` with full digests and the event form in the field the encoding needs."""
    msg = pb.BlockKeys(keys=[k.digest for k in keys])
    events = [k.event_key for k in keys]
    if signed:
        msg.signed_event_keys.extend(events)
    else:
        msg.event_keys.extend(events)
    return msg


def keys_from_message(msg: pb.BlockKeys, *, signed: bool) -> list[BlockKey]:
    """Core block keys from one ``BlockKeys`` result; a malformed result is refused."""
    events = list(msg.signed_event_keys if signed else msg.event_keys)
    other = msg.event_keys if signed else msg.signed_event_keys
    if len(events) != len(msg.keys) or len(other):
        raise FailedPrecondition(
            f"ComputeCacheKeys answered {len(msg.keys)} keys with {len(msg.event_keys)} unsigned "
            f"and {len(msg.signed_event_keys)} signed event keys; expected one "
            f"{'signed' if signed else 'unsigned'} event key per key",
            field="results",
        )
    return make_block_keys(list(msg.keys), events)
