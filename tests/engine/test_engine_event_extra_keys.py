"""BlockStored.extra_keys as vLLM 0.31+ publishes them (`to_event_extra_keys`, untagged).

Reference: ../shared/reference/engines/vllm.md §2 (order lora, mm, salt on block 0, embeds) and
§4.5 (untagging: ("mm", id, off) -> (id, off), any other tagged key -> key[1]).
"""

from __future__ import annotations

import hashlib

import pytest

from tokenkeys.engine.simulated.event_extra_keys import VllmEventExtraKeys
from tokenkeys.errors import Unsupported
from tokenkeys.keys import Adapter, KeyContext, MMItem, get_profile, make_spec

EXTRA = VllmEventExtraKeys(16)


def test_no_context_or_empty_context_has_no_extra_keys():
    assert EXTRA(None, 0, 16) is None
    assert EXTRA(KeyContext(), 0, 16) is None


def test_adapter_name_then_salt_on_the_first_block_only():
    ctx = KeyContext(adapter=Adapter("sql", "/p/sql"), cache_salt="s1")
    assert EXTRA(ctx, 0, 16) == ("sql", "s1")
    assert EXTRA(ctx, 16, 32) == ("sql",)
    # A context continuing a chain does not start at the request's token 0.
    assert EXTRA(KeyContext(cache_salt="s1", parent=b"\x01" * 32), 0, 16) is None


def test_mm_items_as_id_and_offset_relative_to_the_block():
    # The example of vLLM's own function (vllm.md §2): img-A@5+20, img-B@40+4, 16-token blocks.
    ctx = KeyContext(mm_items=(MMItem("img-A", 5, 20), MMItem("img-B", 40, 4)))
    assert [EXTRA(ctx, s, s + 16) for s in (0, 16, 32)] == [
        (("img-A", 5),),
        (("img-A", -11),),
        (("img-B", 8),),
    ]


def test_untagged_keys_are_the_tagged_hash_keys_without_their_tags():
    """The event form is derived from the same inputs as the hashed form (vLLM 0.31 profile)."""
    profile = get_profile("vllm/sha256_cbor@0.31")
    digest = hashlib.sha256(b"embeds").digest()
    ctx = KeyContext(
        adapter=Adapter("sql", "/p/sql"),
        cache_salt="s1",
        mm_items=(MMItem("img-A", 5, 20),),
        prompt_embeds_digests=(digest, digest),
    )
    make_spec("vllm/sha256_cbor@0.31", 16)  # the profile is registered
    for block, start in ((0, 0), (1, 16)):
        tagged = profile.extra_keys(ctx, block, start, start + 16)
        untagged = tuple(k[1:] if k[0] == "mm" else k[1] for k in tagged)
        assert EXTRA(ctx, start, start + 16) == untagged


def test_prompt_embeds_over_a_larger_group_block_are_refused():
    ctx = KeyContext(prompt_embeds_digests=(b"\x00" * 32,) * 4)
    with pytest.raises(Unsupported, match="group block"):
        EXTRA(ctx, 0, 32)
