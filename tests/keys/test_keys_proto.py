"""Core values <-> openengine.v1 cache-key messages: lossless both ways, malformed refused."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as kpb
from tokenkeys.errors import FailedPrecondition, InvalidArgument
from tokenkeys.keys import Adapter, KeyContext, MMItem, block_keys, make_spec
from tokenkeys.keys.proto import (
    context_from_message,
    context_to_message,
    keys_from_message,
    keys_to_message,
    spec_ref,
)

text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
salt = text.filter(lambda s: not set(s) & set("@/\\\x00"))


@st.composite
def contexts(draw: st.DrawFn) -> KeyContext:
    parent = draw(st.none() | st.binary(min_size=1, max_size=40))
    # Offsets are negative only after a parent (an item that began before the first token).
    low = -200 if parent is not None else 0
    offsets = sorted(draw(st.sets(st.integers(low, 200), max_size=4)))
    items = tuple(MMItem(draw(text), o, 1) for o in offsets)
    return KeyContext(
        model=draw(st.none() | text),
        tokenizer_fingerprint=draw(st.none() | text),
        adapter=draw(st.none() | st.builds(Adapter, text, st.none() | text)),
        cache_salt=draw(st.none() | salt),
        mm_items=items,
        prompt_embeds_digests=tuple(
            draw(st.lists(st.binary(min_size=32, max_size=32), max_size=3))
        ),
        group=draw(st.none() | st.integers(0, 5)),
        parent=parent,
    )


@given(contexts())
def test_context_round_trip(ctx: KeyContext) -> None:
    message = context_to_message(ctx)
    again = kpb.KeyContext.FromString(message.SerializeToString())
    assert context_from_message(again) == ctx


def test_negative_offset_crosses_the_wire() -> None:
    ctx = KeyContext(mm_items=(MMItem("img", -7, 20),), parent=bytes(32))
    again = kpb.KeyContext.FromString(context_to_message(ctx).SerializeToString())
    assert again.mm_items[0].offset == -7
    assert context_from_message(again) == ctx
    # Without a parent the same item is refused, naming the message field.
    with pytest.raises(InvalidArgument, match="parent"):
        context_from_message(
            kpb.KeyContext(mm_items=[kpb.MultimodalItem(identifier="a", offset=-1, length=2)])
        )


def test_unset_and_empty_fields_differ() -> None:
    assert context_from_message(kpb.KeyContext()) == KeyContext()
    with pytest.raises(InvalidArgument, match="cache_salt must be a non-empty string") as info:
        context_from_message(kpb.KeyContext(cache_salt=""))
    assert info.value.field == "cache_salt"
    with pytest.raises(InvalidArgument) as info:
        context_from_message(kpb.KeyContext(adapter_name="a", adapter_path=""))
    assert info.value.field == "adapter_path"
    with pytest.raises(InvalidArgument, match=r"mm_items\[1\]: mm item 'b' has length 0"):
        context_from_message(
            kpb.KeyContext(
                mm_items=[
                    kpb.MultimodalItem(identifier="a", offset=0, length=1),
                    kpb.MultimodalItem(identifier="b", offset=4, length=0),
                ]
            )
        )


def test_keys_messages_carry_the_event_form_the_spec_uses() -> None:
    tokens = list(range(300, 380))
    for profile_id, signed in (("vllm/xxhash_cbor@0.31", False), ("sglang/sha256@0.5.23", True)):
        spec = make_spec(profile_id, 16, **({"root_seed": "1"} if not signed else {}))
        keys = block_keys(tokens, spec)
        message = keys_to_message(keys, signed=signed)
        assert bool(message.signed_event_keys) is signed and bool(message.event_keys) is not signed
        assert keys_from_message(message, signed=signed) == keys
        with pytest.raises(FailedPrecondition, match="expected one"):
            keys_from_message(message, signed=not signed)
    short = kpb.BlockKeys(keys=[hashlib.sha256(b"x").digest()], event_keys=[])
    with pytest.raises(FailedPrecondition, match="1 keys with 0 unsigned"):
        keys_from_message(short, signed=False)


def test_spec_ref() -> None:
    spec = make_spec("vllm/sha256@0.29", 16)
    ref = spec_ref(spec)
    assert (ref.profile_id, ref.profile_version, ref.spec_fingerprint, ref.client_computable) == (
        "vllm/sha256@0.29",
        "0.29",
        spec.fingerprint,
        False,
    )
